// The GEMV's add + RMSNorm epilogue (gemv_add_rms_norm, ops::linear_add_rms_norm in ops/cuda/gemv.h):
// bitwise the GEMV then the rms_norm kernel and the CPU op, for M = 1..8, every configuration and the
// Qwen3-4B / 0.6B O and down shapes (padded row strides too), launched twice, back to back across grid
// sizes, in a replayed CUDA graph and with PDL; the linear_add_rms_norm op on CUDA; bad arguments and the
// support predicate. Every output buffer is poisoned (all bits set: NaN) before each run, so an element never
// written fails the checks.
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "gemm_reference.h"
#include "gemv_test_util.h"
#include "kiln/cuda_check.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using cuda::GemvConfig;
using cuda::GemvEpilogue;
using test::poison;
using test::random_bf16;
using test::to_device;
using test::to_host;

constexpr float kNormEps = 1e-6f;

struct NormShape {
  const char* name;
  int64_t N, K;
};
// The O and down projections of Qwen3-4B and Qwen3-0.6B (N = the hidden size).
const NormShape kNormShapes[] = {
    {"4B o", 2560, 4096}, {"4B down", 2560, 9728}, {"0.6B o", 1024, 2048}, {"0.6B down", 1024, 3072}};

// One add + RMSNorm case for M up to 8: inputs (x, W, the residual's starting value res0, the norm weight)
// and outputs tmp, residual, normed with row stride ld (>= N; the padding must stay untouched).
struct NormBufs {
  int64_t N, K, ld;
  std::vector<bf16_t> res0_h, nw_h;
  Buffer x, w, res0, nw, tmp, res, normed;
  NormBufs(int64_t n, int64_t k, int64_t ld_, uint32_t seed)
      : N(n),
        K(k),
        ld(ld_),
        res0_h(random_bf16(size_t(cuda::kGemvMaxM * ld_), seed + 2, -4.0f, 4.0f)),
        nw_h(random_bf16(size_t(n), seed + 3, 0.5f, 1.5f)),
        x(to_device(random_bf16(size_t(cuda::kGemvMaxM * k), seed))),
        w(to_device(random_bf16(size_t(n * k), seed + 1, -0.05f, 0.05f))),
        res0(to_device(res0_h)),
        nw(to_device(nw_h)),
        tmp(size_t(cuda::kGemvMaxM * ld_) * 2, Device::cuda()),
        res(size_t(cuda::kGemvMaxM * ld_) * 2, Device::cuda()),
        normed(size_t(cuda::kGemvMaxM * ld_) * 2, Device::cuda()) {}

  // residual <- res0; tmp and normed poisoned (synchronous).
  void reset() const {
    KILN_CUDA_CHECK(cudaMemcpy(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice));
    poison(tmp);
    poison(normed);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Enqueues the fused launch, or the GEMV (bf16 epilogue) then the rms_norm kernel with add, on st.
  void enqueue(int64_t M, GemvConfig cfg, bool fused, cudaStream_t st = nullptr, bool pdl = false) const {
    if (fused) {
      cuda::gemv_add_rms_norm(x.data(), K, w.data(), K, tmp.data(), ld, res.data(), ld, nw.data(),
                              normed.data(), ld, M, N, K, kNormEps, cfg, st, pdl);
    } else {
      cuda::gemv(x.data(), K, w.data(), K, tmp.data(), ld, M, N, K, GemvEpilogue::bf16, cfg, st, pdl);
      cuda::rms_norm(tmp.data(), ld, res.data(), ld, nw.data(), normed.data(), ld, M, N, kNormEps, true, st,
                     pdl);
    }
  }
  struct Out {
    std::vector<uint16_t> tmp, res, normed;
    bool operator==(const Out&) const = default;
  };
  Out read() const {
    const size_t n = size_t(cuda::kGemvMaxM * ld);
    return {to_host<uint16_t>(tmp, n), to_host<uint16_t>(res, n), to_host<uint16_t>(normed, n)};
  }
  Out run(int64_t M, GemvConfig cfg, bool fused) const {
    reset();
    enqueue(M, cfg, fused);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return read();
  }

  // Failures of `o` for M rows: an element of rows < M, columns < N still poisoned (tmp, normed), anything
  // outside them written (tmp, normed not poisoned; residual not res0), or residual / normed not bitwise the
  // CPU add_rms_norm (ops/rms_norm.h, whose order the kernel matches bit for bit) applied to o.tmp.
  std::string check(const Out& o, int64_t M) const {
    for (int64_t m = 0; m < cuda::kGemvMaxM; ++m)
      for (int64_t j = 0; j < ld; ++j) {
        const size_t i = size_t(m * ld + j);
        const bool inside = m < M && j < N;
        if (inside && (o.tmp[i] == 0xffff || o.normed[i] == 0xffff))
          return "element " + std::to_string(m) + ", " + std::to_string(j) + " not written";
        if (!inside && (o.tmp[i] != 0xffff || o.normed[i] != 0xffff || o.res[i] != res0_h[i].bits))
          return "element " + std::to_string(m) + ", " + std::to_string(j) + " outside [M, N] written";
      }
    std::vector<bf16_t> t(size_t(M * N)), r(size_t(M * N)), y(size_t(M * N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < N; ++j) {
        t[size_t(m * N + j)].bits = o.tmp[size_t(m * ld + j)];
        r[size_t(m * N + j)] = res0_h[size_t(m * ld + j)];
      }
    ops::add_rms_norm(Tensor(t.data(), DType::bf16, {M, N}), Tensor(r.data(), DType::bf16, {M, N}),
                      Tensor(const_cast<bf16_t*>(nw_h.data()), DType::bf16, {N}), kNormEps,
                      Tensor(y.data(), DType::bf16, {M, N}));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < N; ++j) {
        if (o.res[size_t(m * ld + j)] != r[size_t(m * N + j)].bits)
          return "residual " + std::to_string(m) + ", " + std::to_string(j) + " differs from the CPU op";
        if (o.normed[size_t(m * ld + j)] != y[size_t(m * N + j)].bits)
          return "normed " + std::to_string(m) + ", " + std::to_string(j) + " differs from the CPU op";
      }
    return "";
  }
};

// Fused == GEMV (same config) then the rms_norm kernel, bitwise in tmp, residual and normed, for M = 1..8,
// every configuration, the 4B and 0.6B O / down shapes (the 0.6B ones with padded row strides). The fused
// launch runs twice per case (the second one needs the counter the first one's last block reset), and each
// result is checked against the CPU op and for untouched padding / rows >= M.
TEST(CudaGemvAddRmsNorm, FusedEqualsGemvThenAddRmsNormBitwise) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 300;
  for (const NormShape& sh : kNormShapes) {
    const int64_t ld = sh.N == 1024 ? sh.N + 24 : sh.N;
    const NormBufs b(sh.N, sh.K, ld, seed += 10);
    for (const GemvConfig cfg : test::fusable_gemv_configs())
      for (int64_t M = 1; M <= cuda::kGemvMaxM; ++M) {
        const std::string what =
            std::string(sh.name) + " M " + std::to_string(M) + " " + test::gemv_config_name(cfg);
        const auto unfused = b.run(M, cfg, false);
        const auto fused = b.run(M, cfg, true);
        const auto again = b.run(M, cfg, true);
        EXPECT_EQ(b.check(unfused, M), "") << what << ": unfused";
        EXPECT_EQ(b.check(fused, M), "") << what << ": fused";
        EXPECT_TRUE(fused.tmp == unfused.tmp) << what << ": tmp differs";
        EXPECT_TRUE(fused.res == unfused.res) << what << ": residual differs";
        EXPECT_TRUE(fused.normed == unfused.normed) << what << ": normed differs";
        EXPECT_TRUE(again == fused) << what << ": a second fused launch differs (counter not reset?)";
      }
  }
}

// Back-to-back fused launches of different grid sizes on one stream without a host synchronisation in
// between (the counter must be 0 again when each launch starts), then a layer's chain in a CUDA graph
// replayed several times, with and without PDL: producer (a fill writing x) -> fused O -> GEMV (up) ->
// fused down, the down launch reading the O launch's normed output through the up GEMV and sharing its
// residual; every result bitwise the eager unfused chain.
TEST(CudaGemvAddRmsNorm, BackToBackGraphReplayAndPdl) {
  KILN_REQUIRE_GPU();
  const Device dev = Device::cuda();
  cudaStream_t st = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  {  // Back to back: 4B o, 0.6B o, 4B down, 0.6B down, twice over, each with its own buffers.
    std::vector<std::unique_ptr<NormBufs>> bufs;
    uint32_t seed = 500;
    for (const NormShape& sh : kNormShapes)
      bufs.push_back(std::make_unique<NormBufs>(sh.N, sh.K, sh.N, seed += 10));
    for (const GemvConfig cfg : test::fusable_gemv_configs()) {
      const int64_t M = cfg.warps == 2 ? 8 : 3;  // 2 warps: 4 rows per warp in the tail
      std::vector<NormBufs::Out> want;
      for (const auto& b : bufs) want.push_back(b->run(M, cfg, false));
      for (const auto& b : bufs) b->reset();
      for (int rep = 0; rep < 2; ++rep)
        for (const auto& b : bufs) {
          if (rep == 1) {  // the second round starts again from res0 (in stream order)
            KILN_CUDA_CHECK(
                cudaMemcpyAsync(b->res.data(), b->res0.data(), b->res.bytes(), cudaMemcpyDeviceToDevice, st));
          }
          b->enqueue(M, cfg, true, st, rep == 1);
        }
      KILN_CUDA_CHECK(cudaStreamSynchronize(st));
      for (size_t i = 0; i < bufs.size(); ++i)
        EXPECT_TRUE(bufs[i]->read() == want[i])
            << kNormShapes[i].name << " " << test::gemv_config_name(cfg) << ": back to back";
    }
  }

  // The layer chain. x of the O projection is the tail of a 32 MB fill (the producer), as in
  // PdlChainEqualsPlainLaunches.
  const int64_t M = 5, H = 2560, Q = 4096, I = 9728, fill_n = int64_t(1) << 24;
  Buffer big(size_t(fill_n) * 2, dev);
  void* x = static_cast<uint16_t*>(big.data()) + (fill_n - M * Q);
  Buffer wo = to_device(random_bf16(size_t(H * Q), 601, -0.05f, 0.05f)),
         wu = to_device(random_bf16(size_t(I * H), 602, -0.05f, 0.05f)),
         wd = to_device(random_bf16(size_t(H * I), 603, -0.02f, 0.02f)),
         n1 = to_device(random_bf16(size_t(H), 604, 0.5f, 1.5f)),
         n2 = to_device(random_bf16(size_t(H), 605, 0.5f, 1.5f));
  const auto res0_h = random_bf16(size_t(M * H), 606, -4.0f, 4.0f);
  Buffer res0 = to_device(res0_h), res(size_t(M * H) * 2, dev), tmp1(size_t(M * H) * 2, dev),
         normed1(size_t(M * H) * 2, dev), act(size_t(M * I) * 2, dev), tmp2(size_t(M * H) * 2, dev),
         normed2(size_t(M * H) * 2, dev);
  const Buffer* outs[] = {&res, &tmp1, &normed1, &act, &tmp2, &normed2};
  auto enqueue = [&](GemvConfig cfg, bool fused, bool pdl) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice, st));
    cuda::fill_random_bf16(big.data(), fill_n, 7, 1.0f, 0.0f, st);  // the producer of x
    if (fused) {
      cuda::gemv_add_rms_norm(x, Q, wo.data(), Q, tmp1.data(), H, res.data(), H, n1.data(), normed1.data(), H,
                              M, H, Q, kNormEps, cfg, st, pdl);
    } else {
      cuda::gemv(x, Q, wo.data(), Q, tmp1.data(), H, M, H, Q, GemvEpilogue::bf16, cfg, st, pdl);
      cuda::rms_norm(tmp1.data(), H, res.data(), H, n1.data(), normed1.data(), H, M, H, kNormEps, true, st,
                     pdl);
    }
    cuda::gemv(normed1.data(), H, wu.data(), H, act.data(), I, M, I, H, GemvEpilogue::bf16, cfg, st, pdl);
    if (fused) {
      cuda::gemv_add_rms_norm(act.data(), I, wd.data(), I, tmp2.data(), H, res.data(), H, n2.data(),
                              normed2.data(), H, M, H, I, kNormEps, cfg, st, pdl);
    } else {
      cuda::gemv(act.data(), I, wd.data(), I, tmp2.data(), H, M, H, I, GemvEpilogue::bf16, cfg, st, pdl);
      cuda::rms_norm(tmp2.data(), H, res.data(), H, n2.data(), normed2.data(), H, M, H, kNormEps, true, st,
                     pdl);
    }
  };
  auto poison_all = [&] {
    cuda::fill_random_bf16(big.data(), fill_n, 99, 1.0f, 0.0f, st);  // stale x
    for (const Buffer* b : outs) KILN_CUDA_CHECK(cudaMemsetAsync(b->data(), 0xff, b->bytes(), st));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
  };
  auto read_all = [&] {
    std::vector<std::vector<uint16_t>> v;
    for (const Buffer* b : outs) v.push_back(to_host<uint16_t>(*b, b->bytes() / 2));
    return v;
  };
  for (const GemvConfig cfg : test::fusable_gemv_configs()) {
    poison_all();
    enqueue(cfg, false, false);
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    const auto want = read_all();
    for (const auto& v : want)
      for (uint16_t e : v)
        if (e == 0xffff) {
          ADD_FAILURE() << test::gemv_config_name(cfg) << ": the unfused chain left an element unwritten";
          break;
        }
    for (const bool pdl : {false, true}) {
      const std::string what = test::gemv_config_name(cfg) + (pdl ? " with PDL" : "");
      poison_all();
      enqueue(cfg, true, pdl);  // eager
      KILN_CUDA_CHECK(cudaStreamSynchronize(st));
      EXPECT_TRUE(read_all() == want) << what << ": eager fused chain != unfused";

      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      enqueue(cfg, true, pdl);
      KILN_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 4; ++replay) {
        poison_all();
        KILN_CUDA_CHECK(cudaGraphLaunch(exec, st));
        if (replay == 3) KILN_CUDA_CHECK(cudaGraphLaunch(exec, st));  // two replays back to back
        KILN_CUDA_CHECK(cudaStreamSynchronize(st));
        EXPECT_TRUE(read_all() == want) << what << ": graph replay " << replay << " != unfused";
      }
      KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
      KILN_CUDA_CHECK(cudaGraphDestroy(graph));
    }
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
}

// ops::linear_add_rms_norm on CUDA: the fused GEMV when switched on and the engine's tactic for [M, N, K] is
// the GEMV (bitwise ops::linear then ops::add_rms_norm, which then run the GEMV and the rms_norm kernel),
// else cuBLASLt + rms_norm through tmp; both bitwise the CPU op's residual / normed for their own tmp, and
// tmp within bf16 tolerance of the CPU op's.
TEST(CudaGemvAddRmsNorm, LinearAddRmsNormOpFusedAndUnfused) {
  KILN_REQUIRE_GPU();
  const int64_t M = 5, N = 1024, K = 2048;
  const NormBufs b(N, K, N, 700);
  const Device dev = Device::cuda();
  const Tensor tx(b.x.data(), DType::bf16, {M, K}, dev), tw(b.w.data(), DType::bf16, {N, K}, dev),
      tres(b.res.data(), DType::bf16, {M, N}, dev), tnw(b.nw.data(), DType::bf16, {N}, dev),
      ttmp(b.tmp.data(), DType::bf16, {M, N}, dev), tnormed(b.normed.data(), DType::bf16, {M, N}, dev);
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const std::string path =
      (kiln::test_support::process_scratch_dir("cuda_gemv_add_rms_norm") / "addnorm_tactics.txt").string();
  test::write_gemv_cache(eng, path, {8, N, K, cuda::GemmOut::bf16}, GemvConfig{4, true});
  ASSERT_TRUE(eng.load(path));
  std::filesystem::remove(path);
  const int64_t before = eng.gemv_dispatches();
  b.reset();
  eng.set_gemv_add_rms_norm(true);
  ops::linear_add_rms_norm(tx, tw, tres, tnw, kNormEps, ttmp, tnormed);  // fused
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  eng.set_gemv_add_rms_norm(false);
  EXPECT_EQ(eng.gemv_dispatches(), before);  // no run() call: the fused kernel
  const auto fused = b.read();
  EXPECT_EQ(b.check(fused, M), "") << "fused op";
  b.reset();
  ops::linear(tx, tw, ttmp);  // run() -> the GEMV
  ops::add_rms_norm(ttmp, tres, tnw, kNormEps, tnormed);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(eng.gemv_dispatches(), before + 1);
  EXPECT_TRUE(b.read() == fused) << "fused op != linear then add_rms_norm";
  b.reset();
  ops::linear_add_rms_norm(tx, tw, tres, tnw, kNormEps, ttmp, tnormed);  // the default: GEMV + kernel
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(eng.gemv_dispatches(), before + 2);
  EXPECT_TRUE(b.read() == fused) << "default op (GEMV then add_rms_norm) != fused op";

  eng.set_gemv_enabled(false);  // cuBLASLt + rms_norm
  b.reset();
  ops::linear_add_rms_norm(tx, tw, tres, tnw, kNormEps, ttmp, tnormed);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  eng.set_gemv_enabled(true);
  const auto unfused = b.read();
  EXPECT_EQ(b.check(unfused, M), "") << "cuBLASLt path";
  std::vector<float> got(size_t(M * N));
  for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(bf16_t{unfused.tmp[i]});
  EXPECT_LE(test::rel_error(to_host<bf16_t>(b.x, size_t(M * K)), K, to_host<bf16_t>(b.w, size_t(N * K)), got,
                            N, M, N, K),
            1.0 / 256);
}

// Argument checks fire before any launch (host pointers: nothing is dereferenced), and the support predicate.
TEST(CudaGemvAddRmsNorm, BadArgumentsAndSupport) {
  using cuda::gemv_add_rms_norm_supported;
  EXPECT_TRUE(gemv_add_rms_norm_supported(1, 2560, 9728, 9728, 9728, 2560, 2560, 2560));
  EXPECT_TRUE(gemv_add_rms_norm_supported(8, 1024, 2048, 2048, 2048, 1048, 1032, 1024));
  EXPECT_FALSE(gemv_add_rms_norm_supported(9, 1024, 2048, 2048, 2048, 1024, 1024, 1024));  // M > 8
  EXPECT_FALSE(gemv_add_rms_norm_supported(1, 1020, 2048, 2048, 2048, 1024, 1024, 1024));  // N % 8
  EXPECT_FALSE(gemv_add_rms_norm_supported(1, 1024, 2048, 2048, 2048, 1020, 1024, 1024));  // ldt % 8
  EXPECT_FALSE(gemv_add_rms_norm_supported(1, 1024, 2048, 2048, 2048, 1024, 1016, 1024));  // ldr < N
  EXPECT_FALSE(gemv_add_rms_norm_supported(1, 1024, 2048, 2048, 2048, 1024, 1024, 1028));  // ldn % 8
  alignas(16) static uint16_t buf[64 * 64];
  void* p = buf;
  void* odd = buf + 1;
  const GemvConfig ok{4};
  auto call = [&](int64_t m, int64_t n, void* tmp, GemvConfig c, float eps) {
    cuda::gemv_add_rms_norm(p, 64, p, 64, tmp, 64, p, 64, p, p, 64, m, n, 64, eps, c, nullptr);
  };
  EXPECT_THROW(call(9, 64, p, ok, kNormEps), Error);
  EXPECT_THROW(call(1, 60, p, ok, kNormEps), Error);
  EXPECT_THROW(call(1, 64, odd, ok, kNormEps), Error);
  EXPECT_THROW(call(1, 64, p, GemvConfig{3}, kNormEps), Error);
  EXPECT_THROW(call(1, 64, p, ok, -1.0f), Error);
  EXPECT_NO_THROW(call(0, 64, p, ok, kNormEps));  // M == 0: nothing launched
}

}  // namespace
}  // namespace kiln
