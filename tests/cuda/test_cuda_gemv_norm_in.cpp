// The GEMV with the residual-norm prologue (ops/cuda/gemv.h: gemv_norm_in) against its unfused form, the
// rms_norm kernel with add (residual rewritten, normed stored) then the plain GEMV on normed: out (bf16 and
// the silu_mul epilogue) and the rewritten residual byte for byte, for M = 1..8, every configuration the
// prologue runs (the multi-tile ones included), the Qwen3-4B and 0.6B QKV / gate_up shapes, odd ones, and one
// whose prologue rows need more than 48 KB of shared memory; each fused case launched twice (the second needs
// the count the first one's last reader reset) and with 1 and 3 row groups a block beside the default one
// wave. Then a decode layer's two norm-in projections in a CUDA graph replayed with changing inputs, with and
// without PDL, and the ops::ResidualNorm entry points on CUDA with the switch on and off. Every output is
// poisoned (all bits set) before each run.
#include <cuda_runtime_api.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/test_support.h"
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
using test::random_bf16;
using test::to_device;
using test::to_host;

constexpr float kEps = 1e-6f;

struct Shape {
  const char* name;
  int64_t n, k;
  bool silu;
  int64_t ld_pad;  // extra elements in the delta / residual row strides
};
// 4B QKV and gate_up, 0.6B QKV and gate_up (padded strides), an odd N, and K 4096 (8 rows: 66 KB of rows).
const Shape kShapes[] = {{"4B qkv", 6144, 2560, false, 0},    {"4B gate_up", 19456, 2560, true, 0},
                         {"0.6B qkv", 4096, 1024, false, 24}, {"0.6B gate_up", 6144, 1024, true, 8},
                         {"odd", 1003, 1032, false, 0},       {"k4096 silu", 1000, 4096, true, 0}};

// The buffers of one shape: delta and residual [8, ld], norm weight [K], W [N, K], out [8, out_cols].
struct Bufs {
  int64_t n, k, ld, cols;
  bool silu;
  Buffer delta, res0, res, normed, nw, w, out;
  Bufs(const Shape& s, uint32_t seed)
      : n(s.n),
        k(s.k),
        ld(s.k + s.ld_pad),
        cols(s.silu ? s.n / 2 : s.n),
        silu(s.silu),
        delta(to_device(random_bf16(size_t(8 * ld), seed, -2.0f, 2.0f))),
        res0(to_device(random_bf16(size_t(8 * ld), seed + 1, -4.0f, 4.0f))),
        res(size_t(8 * ld) * 2, Device::cuda()),
        normed(size_t(8 * ld) * 2, Device::cuda()),
        nw(to_device(random_bf16(size_t(k), seed + 2, 0.5f, 1.5f))),
        w(to_device(random_bf16(size_t(n * k), seed + 3, -0.05f, 0.05f))),
        out(size_t(8 * cols) * 2, Device::cuda()) {}

  struct Out {
    std::vector<uint16_t> out, res;
    bool operator==(const Out&) const = default;
  };
  void reset(cudaStream_t st) const {
    KILN_CUDA_CHECK(cudaMemcpyAsync(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice, st));
    KILN_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.bytes(), st));
    KILN_CUDA_CHECK(cudaMemsetAsync(normed.data(), 0xff, normed.bytes(), st));
  }
  void enqueue(int64_t m, GemvConfig cfg, bool fused, cudaStream_t st, bool pdl = false,
               int groups = 0) const {
    const GemvEpilogue epi = silu ? GemvEpilogue::silu_mul : GemvEpilogue::bf16;
    if (fused) {
      cuda::gemv_norm_in(delta.data(), ld, res.data(), ld, nw.data(), kEps, w.data(), k, out.data(), cols, m,
                         n, k, epi, cfg, st, pdl, groups);
    } else {
      cuda::rms_norm(delta.data(), ld, res.data(), ld, nw.data(), normed.data(), ld, m, k, kEps, true, st,
                     pdl);
      cuda::gemv(normed.data(), ld, w.data(), k, out.data(), cols, m, n, k, epi, cfg, st, pdl);
    }
  }
  Out read() const {
    return {to_host<uint16_t>(out, out.bytes() / 2), to_host<uint16_t>(res, res.bytes() / 2)};
  }
  Out run(int64_t m, GemvConfig cfg, bool fused, int groups = 0) const {
    reset(nullptr);
    enqueue(m, cfg, fused, nullptr, false, groups);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return read();
  }
  // "" when the rows < m of o.out are all written and the rows >= m untouched.
  std::string written(const Out& o, int64_t m) const {
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t j = 0; j < cols; ++j)
        if ((o.out[size_t(r * cols + j)] == 0xffff) == (r < m))
          return "out " + std::to_string(r) + ", " + std::to_string(j) +
                 (r < m ? " not written" : " written");
    return "";
  }
};

TEST(CudaGemvNormIn, EqualsAddRmsNormThenGemvBitwise) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 900;
  for (const Shape& s : kShapes) {
    const Bufs b(s, seed += 10);
    const auto res0 = to_host<uint16_t>(b.res0, b.res0.bytes() / 2);
    for (const GemvConfig cfg : test::norm_in_gemv_configs())
      for (int64_t m = 1; m <= cuda::kGemvMaxM; ++m) {
        const std::string what =
            std::string(s.name) + " M " + std::to_string(m) + " " + test::gemv_config_name(cfg);
        ASSERT_TRUE(cuda::gemv_norm_in_supported(m, s.n, s.k, b.ld, b.ld, s.k, b.cols,
                                                 s.silu ? GemvEpilogue::silu_mul : GemvEpilogue::bf16))
            << what;
        const auto want = b.run(m, cfg, false);
        const auto got = b.run(m, cfg, true);
        const auto again = b.run(m, cfg, true);
        ASSERT_EQ(b.written(want, m), "") << what << ": unfused";
        EXPECT_EQ(b.written(got, m), "") << what << ": fused";
        EXPECT_TRUE(got.out == want.out) << what << ": out differs";
        EXPECT_TRUE(got.res == want.res) << what << ": residual differs";
        EXPECT_TRUE(again == got) << what << ": a second launch differs (count not reset?)";
        for (const int g : {1, 3})  // other block sizings: one group a block, 3 groups a block
          EXPECT_TRUE(b.run(m, cfg, true, g) == got) << what << ": " << g << " groups a block differ";
        EXPECT_FALSE(got.res == res0) << what << ": residual not rewritten";
      }
  }
}

// A layer's two norm-in projections (QKV-like bf16 after a delta written by a producer kernel, gate_up-like
// silu sharing the residual, its delta the first projection's output rows) in a CUDA graph replayed with a
// new delta each time, with and without PDL, against the eager unfused chain on the same inputs.
TEST(CudaGemvNormIn, GraphReplayWithChangingInputsAndPdl) {
  KILN_REQUIRE_GPU();
  cudaStream_t st = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int64_t M = 5, H = 2560, N1 = 2560, I2 = 2 * 9728;
  const Device dev = Device::cuda();
  Buffer delta(size_t(M * H) * 2, dev), res0 = to_device(random_bf16(size_t(M * H), 11, -4.0f, 4.0f)),
                                        res(size_t(M * H) * 2, dev), normed(size_t(M * H) * 2, dev),
                                        y1(size_t(M * N1) * 2, dev), act(size_t(M * I2 / 2) * 2, dev),
                                        nw1 = to_device(random_bf16(size_t(H), 12, 0.5f, 1.5f)),
                                        nw2 = to_device(random_bf16(size_t(H), 13, 0.5f, 1.5f)),
                                        w1 = to_device(random_bf16(size_t(N1 * H), 14, -0.05f, 0.05f)),
                                        w2 = to_device(random_bf16(size_t(I2 * H), 15, -0.05f, 0.05f));
  const Buffer* outs[] = {&res, &y1, &act};
  auto chain = [&](GemvConfig cfg, bool fused, bool pdl, uint64_t delta_seed) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice, st));
    cuda::fill_random_bf16(delta.data(), M * H, delta_seed, 1.0f, 0.0f, st);  // the producer of delta
    if (fused) {
      cuda::gemv_norm_in(delta.data(), H, res.data(), H, nw1.data(), kEps, w1.data(), H, y1.data(), N1, M, N1,
                         H, GemvEpilogue::bf16, cfg, st, pdl);
      cuda::gemv_norm_in(y1.data(), N1, res.data(), H, nw2.data(), kEps, w2.data(), H, act.data(), I2 / 2, M,
                         I2, H, GemvEpilogue::silu_mul, cfg, st, pdl);
    } else {
      cuda::rms_norm(delta.data(), H, res.data(), H, nw1.data(), normed.data(), H, M, H, kEps, true, st, pdl);
      cuda::gemv(normed.data(), H, w1.data(), H, y1.data(), N1, M, N1, H, GemvEpilogue::bf16, cfg, st, pdl);
      cuda::rms_norm(y1.data(), N1, res.data(), H, nw2.data(), normed.data(), H, M, H, kEps, true, st, pdl);
      cuda::gemv(normed.data(), H, w2.data(), H, act.data(), I2 / 2, M, I2, H, GemvEpilogue::silu_mul, cfg,
                 st, pdl);
    }
  };
  auto poison = [&] {
    for (const Buffer* b : outs) KILN_CUDA_CHECK(cudaMemsetAsync(b->data(), 0xff, b->bytes(), st));
  };
  auto read_all = [&] {
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<std::vector<uint16_t>> v;
    for (const Buffer* b : outs) v.push_back(to_host<uint16_t>(*b, b->bytes() / 2));
    return v;
  };
  for (const GemvConfig cfg :
       {GemvConfig{16, true}, GemvConfig{8, true}, GemvConfig{4, false}, GemvConfig{4, true, 4}}) {
    for (const bool pdl : {false, true}) {
      const std::string what = test::gemv_config_name(cfg) + (pdl ? " with PDL" : "");
      // The captured chain copies res0 into the residual first: rewriting res0 before each replay changes
      // the inputs of the replay (and the reference is recomputed on them).
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      chain(cfg, true, pdl, 100);
      KILN_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 3; ++replay) {
        const auto r0 = random_bf16(size_t(M * H), 200 + uint32_t(replay), -4.0f, 4.0f);
        KILN_CUDA_CHECK(cudaMemcpy(res0.data(), r0.data(), res0.bytes(), cudaMemcpyHostToDevice));
        poison();
        chain(cfg, false, false, 100);
        const auto want = read_all();
        for (const auto& v : want)
          for (uint16_t e : v)
            ASSERT_NE(e, 0xffff) << what << ": the unfused chain left an element unwritten";
        poison();
        KILN_CUDA_CHECK(cudaGraphLaunch(exec, st));
        EXPECT_TRUE(read_all() == want) << what << ": replay " << replay << " != the unfused chain";
        poison();
        chain(cfg, true, pdl, 100);  // eager too
        EXPECT_TRUE(read_all() == want) << what << ": eager fused chain " << replay << " != unfused";
      }
      KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
      KILN_CUDA_CHECK(cudaGraphDestroy(graph));
    }
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
}

// The ops entry points (ops/linear.h) on CUDA: linear_silu_mul with a ResidualNorm input equals
// add_rms_norm then linear_silu_mul on normed, bitwise (act and residual), with the engine's switch on and
// off; bad inputs are errors that change nothing.
TEST(CudaGemvNormIn, ResidualNormOpsOnAndOff) {
  KILN_REQUIRE_GPU();
  const int64_t M = 3, H = 1024, I = 3072;
  const Device dev = Device::cuda();
  // The engine's tactic for the gate_up shape: the tensor-core GEMV (a cache holding only it).
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const std::string path = (test_support::process_scratch_dir("cuda_gemv_norm_in") / "tactics.txt").string();
  test::write_gemv_cache(eng, path, {cuda::gemm_m_bucket(M), 2 * I, H, cuda::GemmOut::bf16},
                         GemvConfig{8, true},
                         /*norm_in=*/true);
  ASSERT_TRUE(eng.load(path));
  std::filesystem::remove(path);
  ASSERT_TRUE(eng.gemv_norm_in_choice(M, 2 * I, H).has_value());
  Buffer delta = to_device(random_bf16(size_t(M * H), 21, -2.0f, 2.0f)),
         res0 = to_device(random_bf16(size_t(M * H), 22, -4.0f, 4.0f)), res(size_t(M * H) * 2, dev),
         normed(size_t(M * H) * 2, dev), nw = to_device(random_bf16(size_t(H), 23, 0.5f, 1.5f)),
         w = to_device(random_bf16(size_t(2 * I * H), 24, -0.05f, 0.05f)),
         gate_up(size_t(M * 2 * I) * 2, dev), act(size_t(M * I) * 2, dev);
  auto t = [](const Buffer& b, std::initializer_list<int64_t> shape) {
    return Tensor(b.data(), DType::bf16, shape, Device::cuda());
  };
  auto run = [&](int on, bool composed) {
    KILN_CUDA_CHECK(cudaMemcpy(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice));
    KILN_CUDA_CHECK(cudaMemset(act.data(), 0xff, act.bytes()));
    eng.set_gemv_norm_in(on);
    if (composed) {
      ops::add_rms_norm(t(delta, {M, H}), t(res, {M, H}), t(nw, {H}), kEps, t(normed, {M, H}));
      ops::linear_silu_mul(t(normed, {M, H}), t(w, {2 * I, H}), t(gate_up, {M, 2 * I}), t(act, {M, I}));
    } else {
      ops::linear_silu_mul(
          ops::ResidualNorm{t(delta, {M, H}), t(res, {M, H}), t(nw, {H}), kEps, t(normed, {M, H})},
          t(w, {2 * I, H}), t(gate_up, {M, 2 * I}), t(act, {M, I}));
    }
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    eng.set_gemv_norm_in(1);
    return std::make_pair(to_host<uint16_t>(act, size_t(M * I)), to_host<uint16_t>(res, size_t(M * H)));
  };
  const auto want = run(1, true);
  for (uint16_t e : want.first) ASSERT_NE(e, 0xffff);
  EXPECT_TRUE(run(1, false) == want) << "fused ResidualNorm op != add_rms_norm then the op";
  EXPECT_TRUE(run(0, false) == want) << "unfused ResidualNorm op != add_rms_norm then the op";
  eng.set_gemv_norm_in(0);
  EXPECT_FALSE(eng.gemv_norm_in_choice(M, 2 * I, H).has_value());
  eng.set_gemv_norm_in(1);
  // The whole-step choice (model/cuda_step_choice.h) leaves the prologue out at one M bucket, the others keep
  // the tuner's; the op then runs the composition, the same bits.
  EXPECT_TRUE(eng.gemv_norm_in_tuned_at(M));
  EXPECT_FALSE(eng.gemv_norm_in_tuned_at(1));  // the cache holds no tactic at M = 1
  eng.set_gemv_norm_in_off_at(1, true);
  EXPECT_TRUE(eng.gemv_norm_in_choice(M, 2 * I, H).has_value());
  eng.set_gemv_norm_in_off_at(cuda::gemm_m_bucket(M), true);
  EXPECT_FALSE(eng.gemv_norm_in_choice(M, 2 * I, H).has_value());
  EXPECT_TRUE(run(1, false) == want) << "ResidualNorm op, prologue left out at its bucket != the composition";
  eng.set_gemv_norm_in_off_at(cuda::gemm_m_bucket(M), false);
  eng.set_gemv_norm_in_off_at(1, false);
  EXPECT_TRUE(eng.gemv_norm_in_choice(M, 2 * I, H).has_value());
  // An aliasing input is refused before anything runs.
  KILN_CUDA_CHECK(cudaMemcpy(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice));
  const auto before = to_host<uint16_t>(res, size_t(M * H));
  EXPECT_THROW(ops::linear_silu_mul(
                   ops::ResidualNorm{t(res, {M, H}), t(res, {M, H}), t(nw, {H}), kEps, t(normed, {M, H})},
                   t(w, {2 * I, H}), t(gate_up, {M, 2 * I}), t(act, {M, I})),
               Error);
  EXPECT_TRUE(to_host<uint16_t>(res, size_t(M * H)) == before);
  EXPECT_THROW(cuda::gemv_norm_in(delta.data(), H, res.data(), H, nw.data(), kEps, w.data(), H, act.data(), I,
                                  9, 2 * I, H, GemvEpilogue::silu_mul, GemvConfig{8, true}, nullptr),
               Error);

  // A multi-tile tactic (a verify step's M = 4 tactic for the QKV and gate_up shapes) has its prologue form
  // too (gemv.h: gemv_norm_in_fusable): the op runs it where the tuner kept it, bitwise the composition.
  test::write_gemv_cache(eng, path, {cuda::gemm_m_bucket(M), 2 * I, H, cuda::GemmOut::bf16},
                         GemvConfig{8, true, 4}, /*norm_in=*/true);
  ASSERT_TRUE(eng.load(path));
  std::filesystem::remove(path);
  ASSERT_EQ(eng.gemv_norm_in_choice(M, 2 * I, H), (GemvConfig{8, true, 4}));
  const auto want4 = run(1, true);
  for (uint16_t e : want4.first) ASSERT_NE(e, 0xffff);
  EXPECT_TRUE(run(1, false) == want4)
      << "ResidualNorm op with a four-tile prologue != add_rms_norm then the op";
  EXPECT_TRUE(run(0, false) == want4)
      << "ResidualNorm op, four tiles, switch off != add_rms_norm then the op";
  // The multi-tile prologue switched off (KILN_GEMV_NORM_IN_TILES=0): no prologue choice, the same bits.
  eng.set_gemv_norm_in_tiles(false);
  EXPECT_FALSE(eng.gemv_norm_in_choice(M, 2 * I, H).has_value());
  EXPECT_TRUE(run(1, false) == want4)
      << "ResidualNorm op, multi-tile prologue off != add_rms_norm then the op";
  eng.set_gemv_norm_in_tiles(true);
  EXPECT_NO_THROW(cuda::gemv_norm_in(delta.data(), H, res.data(), H, nw.data(), kEps, w.data(), H, act.data(),
                                     I, M, 2 * I, H, GemvEpilogue::silu_mul, GemvConfig{8, true, 4},
                                     nullptr));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kiln
