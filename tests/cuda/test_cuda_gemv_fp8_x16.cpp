// The GEMV's e4m3 x 16 configs on block-FP8 weights (ops/cuda/gemv.h: "e4m3 x 16"; the CPU oracle is path
// (d), ops::linear_fp8_chunk16): the plain GEMV bitwise the oracle for every config of both forms (x16_rows
// 8 and 4), M = 1..8 (the 8-row and the 4-row blocks), ragged N, K a multiple of 16 but not of 128, a strided
// W and strided x, bf16 and f32 outputs; the silu_mul epilogue, the add + RMSNorm epilogue, the residual-norm
// prologue and the fused QKV + attention preparation each bitwise the plain GEMV (same config) then the
// unfused op; a CUDA graph (PDL) replayed with changing inputs; two runs bitwise equal; the argument checks
// (bf16 W, K or ldw not a multiple of 16, misaligned e4m3 data) before any launch; the block rows of both
// forms; the tactic line's words 6 and 7 (both forms, and the older lines). Every output is poisoned (all
// bits set) before each run and compared in full.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "attn_prep_case.h"
#include "fp8_weight_util.h"
#include "kiln/cuda_check.h"
#include "ops/attn_prep.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_attn_prep.h"
#include "ops/fp8_linear.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using cuda::GemvConfig;
using cuda::GemvEpilogue;
using cuda::GemvWeight;
using test::Fp8TestWeight;
using test::poison;
using test::random_bf16;
using test::to_device;
using test::to_host;

constexpr float kEps = 1e-6f;

std::string name(GemvConfig c) {
  return "e4m3x16 warps " + std::to_string(c.warps) + " rows " + std::to_string(c.x16_rows);
}

// The lighter form's config of `warps` warps (x16_rows 4).
GemvConfig light(int warps) {
  return GemvConfig{.warps = warps, .e4m3x16 = true, .x16_rows = 4};
}

// The oracle's rows: path (d) for cfg's thread count, x [m, ldx] (the first k columns), out [m, n] bf16 or
// f32.
std::vector<uint8_t> oracle(const std::vector<bf16_t>& x, int64_t ldx, const Fp8TestWeight& w, int64_t m,
                            GemvEpilogue epi, GemvConfig cfg) {
  const bool f32 = epi == GemvEpilogue::f32;
  std::vector<uint8_t> out(size_t(m * w.n) * (f32 ? 4 : 2));
  const ops::LinearWeight lw(
      Tensor::strided(const_cast<uint8_t*>(w.q.data()), DType::f8e4m3, {w.n, w.k}, {w.ld, 1}),
      Tensor(const_cast<float*>(w.s.data()), DType::f32, {ops::fp8_blocks(w.n), ops::fp8_blocks(w.k)}));
  ops::linear_fp8_chunk16(Tensor::strided(const_cast<bf16_t*>(x.data()), DType::bf16, {m, w.k}, {ldx, 1}), lw,
                          Tensor(out.data(), f32 ? DType::f32 : DType::bf16, {m, w.n}), cfg.warps * 32);
  return out;
}

using Shape = test::WeightShape;

TEST(CudaGemvFp8x16, PlainGemvBitwiseTheOracle) {
  KILN_REQUIRE_GPU();
  // Ragged N (37, 1001, 301: neither multiples of 8 nor of 128), K multiples of 16 but not of 128, a strided
  // W, one K of a single chunk, and 4B's QKV rows on a short K.
  const Shape shapes[] = {{"37x208", 37, 208, 0},
                          {"1001x1008", 1001, 1008, 0},
                          {"301x2064 ld", 301, 2064, 2080},
                          {"5x16", 5, 16, 0},
                          {"6144x528", 6144, 528, 0}};
  uint32_t seed = 1100;
  int runs = 0;
  for (const Shape& s : shapes) {
    const Fp8TestWeight w(s.n, s.k, ++seed, s.ld);
    const int64_t ldx = s.k + 8;
    const auto xh = random_bf16(size_t(8 * ldx), ++seed);
    const Buffer x = to_device(xh);
    Buffer out(size_t(8 * s.n) * 4, Device::cuda());
    for (const GemvEpilogue epi : {GemvEpilogue::bf16, GemvEpilogue::f32})
      for (const GemvConfig cfg : cuda::kGemvE4m3x16Configs)
        for (int64_t m = 1; m <= cuda::kGemvMaxM; ++m) {
          const size_t bytes = size_t(m * s.n) * (epi == GemvEpilogue::f32 ? 4 : 2);
          auto got = test::run_gemv(x, ldx, w.fp8(), out, s.n, m, s.n, s.k, epi, cfg);
          ASSERT_TRUE(
              std::all_of(got.begin() + ptrdiff_t(bytes), got.end(), [](uint8_t b) { return b == 0xff; }))
              << s.name << " M " << m << " " << name(cfg) << ": wrote past the output";
          got.resize(bytes);
          ASSERT_EQ(got, oracle(xh, ldx, w, m, epi, cfg))
              << s.name << " epilogue " << int(epi) << " M " << m << " " << name(cfg);
          ++runs;
        }
  }
  std::printf("[ gemv e4m3x16 ] %d runs bitwise the oracle\n", runs);
}

// The fused forms against the plain GEMV with the same config then the unfused op, and determinism.
TEST(CudaGemvFp8x16, FusedFormsBitwiseThePlainGemvThenTheOp) {
  KILN_REQUIRE_GPU();
  const int64_t N = 1008, K = 2064, I = N / 2;  // N, I multiples of 8 (the norm's and silu_mul's chunks)
  const Fp8TestWeight w(N, K, 1200);
  const Buffer x = to_device(random_bf16(size_t(8 * K), 1201));
  const Buffer res0 = to_device(random_bf16(size_t(8 * N), 1202, -4.0f, 4.0f));
  const Buffer nw = to_device(random_bf16(size_t(N), 1203, 0.5f, 1.5f));
  const Buffer delta = to_device(random_bf16(size_t(8 * K), 1204, -2.0f, 2.0f));
  const Buffer resk0 = to_device(random_bf16(size_t(8 * K), 1205, -4.0f, 4.0f));
  const Buffer nwk = to_device(random_bf16(size_t(K), 1206, 0.5f, 1.5f));
  Buffer a(size_t(8 * N) * 2, Device::cuda()), b(size_t(8 * N) * 2, Device::cuda()),
      c(size_t(8 * N) * 2, Device::cuda()), res(size_t(8 * N) * 2, Device::cuda()),
      normed(size_t(8 * N) * 2, Device::cuda()), resk(size_t(8 * K) * 2, Device::cuda()),
      xk(size_t(8 * K) * 2, Device::cuda());
  const auto host = [](const Buffer& buf) { return to_host<uint8_t>(buf, buf.bytes()); };
  const auto reset = [&](Buffer& dst, const Buffer& src) {
    KILN_CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice));
  };
  for (const GemvConfig cfg : cuda::kGemvE4m3x16Configs)
    for (int64_t m = 1; m <= cuda::kGemvMaxM; ++m) {
      const std::string at = name(cfg) + " M " + std::to_string(m);
      // silu_mul: the fused epilogue == the bf16 GEMV then silu_mul.
      for (const Buffer* buf : {&a, &b, &c}) poison(*buf);
      cuda::gemv(x.data(), K, w.fp8(), a.data(), I, m, N, K, GemvEpilogue::silu_mul, cfg, nullptr);
      cuda::gemv(x.data(), K, w.fp8(), b.data(), N, m, N, K, GemvEpilogue::bf16, cfg, nullptr);
      cuda::silu_mul(b.data(), N, c.data(), I, m, I, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(to_host<uint8_t>(a, size_t(m * I) * 2), to_host<uint8_t>(c, size_t(m * I) * 2))
          << "silu " << at;
      // Two runs of one config: the same bits.
      const auto first = to_host<uint8_t>(b, size_t(m * N) * 2);
      poison(b);
      cuda::gemv(x.data(), K, w.fp8(), b.data(), N, m, N, K, GemvEpilogue::bf16, cfg, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(to_host<uint8_t>(b, size_t(m * N) * 2), first) << "rerun " << at;
      // add + RMSNorm: tmp, residual, normed == gemv then rms_norm with add.
      for (const Buffer* buf : {&a, &normed, &c}) poison(*buf);
      reset(res, res0);
      cuda::gemv_add_rms_norm(x.data(), K, w.fp8(), a.data(), N, res.data(), N, nw.data(), normed.data(), N,
                              m, N, K, kEps, cfg, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto fused = std::vector<std::vector<uint8_t>>{host(a), host(res), host(normed)};
      for (const Buffer* buf : {&a, &normed}) poison(*buf);
      reset(res, res0);
      cuda::gemv(x.data(), K, w.fp8(), a.data(), N, m, N, K, GemvEpilogue::bf16, cfg, nullptr);
      cuda::rms_norm(a.data(), N, res.data(), N, nw.data(), normed.data(), N, m, N, kEps, true, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(fused, (std::vector<std::vector<uint8_t>>{host(a), host(res), host(normed)}))
          << "add_rms " << at;
      // Residual-norm prologue (bf16 and silu_mul, one wave and 3 groups a block) == rms_norm then gemv.
      for (const GemvEpilogue epi : {GemvEpilogue::bf16, GemvEpilogue::silu_mul})
        for (const int groups : {0, 3}) {
          const int64_t cols = epi == GemvEpilogue::silu_mul ? I : N;
          const test::NormInRuns r = test::norm_in_runs(delta, resk0, resk, K, nwk, kEps, w.fp8(), a, cols,
                                                        xk, m, N, K, epi, cfg, groups);
          ASSERT_EQ(r.fused, r.unfused)
              << "norm_in epilogue " << int(epi) << " groups " << groups << " " << at;
        }
    }
}

// The fused QKV GEMV + attention preparation with an e4m3 x 16 config == that GEMV into the qkv rows, then
// attn_prep's dispatcher (the unfused composition), every buffer compared.
TEST(CudaGemvFp8x16, AttnPrepBitwiseTheGemvThenAttnPrep) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(1300);
  int runs = 0;
  for (int i = 0; i < 12; ++i) {
    test::CaseCfg c;
    c.D = i % 2 ? 64 : 128;
    c.Hkv = 1 + int(rng() % 4);
    c.Hq = c.Hkv * (1 + int(rng() % 4));
    c.R = c.D;
    c.T = 1 + i % 8;
    c.cache = i % 3 == 0 ? DType::f8e4m3 : DType::bf16;
    c.layout = i % 4 < 2 ? test::KvLayout::hnd : test::KvLayout::nhd;
    c.skip = 0.25;
    test::Case in(c, rng);
    const int64_t K = i % 2 ? 528 : 1040, N = int64_t(c.Hq + 2 * c.Hkv) * c.D;
    const Fp8TestWeight w(N, K, uint32_t(rng()));
    const Buffer x = to_device(random_bf16(size_t(c.T * K), uint32_t(rng()), -0.05f, 0.05f));
    std::memset(in.qkv.data(), 0xff, in.qkv.size());
    test::DeviceCase dev(in);
    for (const GemvConfig g : cuda::kGemvE4m3x16Configs) {
      dev.upload(in);
      {
        const ops::AttnPrepArgs a = in.args(dev.base, Device::cuda());
        cuda::gemv(x.data(), K, w.fp8(), a.qkv.data, a.qkv.stride[0], c.T, N, K, GemvEpilogue::bf16, g,
                   nullptr);
        ASSERT_EQ(ops::attn_prep(a), ops::AttnPrepPath::cuda_fused_decode) << c.describe();
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      test::Case want = dev.download(in);
      dev.upload(in);
      {
        const ops::AttnPrepArgs a = in.args(dev.base, Device::cuda());
        const cuda::AttnPrepParams p = ops::attn_prep_params(a);
        ASSERT_TRUE(cuda::gemv_attn_prep_supported(c.T, K, x.data(), K, w.fp8(), p)) << c.describe();
        cuda::gemv_attn_prep(x.data(), K, w.fp8(), c.T, K, p, g, nullptr);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(dev.diff(want), "") << "case " << i << " " << name(g) << ": " << c.describe();
      ++runs;
    }
  }
  std::printf("[ gemv_attn_prep e4m3x16 ] %d fused runs compared bit for bit\n", runs);
}

// A decode-like chain captured once with PDL (norm-in QKV-like GEMV, gate_up silu_mul on its output, down
// with the add + RMSNorm epilogue), replayed with fresh inputs against the same chain run eagerly; 4 warps,
// both forms.
TEST(CudaGemvFp8x16, GraphReplaysWithChangingInputs) {
  KILN_REQUIRE_GPU();
  for (const GemvConfig cfg : {cuda::kGemvE4m3x16Configs[1], light(4)})
    for (const int64_t M : {1, 5}) {
      const int64_t H = 1040, I = 1504;
      const Fp8TestWeight w_in(H, H, 1401), w_gu(2 * I, H, 1402), w_down(H, I, 1403);
      const Buffer nw = to_device(random_bf16(size_t(H), 1404, 0.5f, 1.5f));
      Buffer delta(size_t(M * H) * 2, Device::cuda()), res(size_t(M * H) * 2, Device::cuda()),
          h1(size_t(M * H) * 2, Device::cuda()), act(size_t(M * I) * 2, Device::cuda()),
          tmp(size_t(M * H) * 2, Device::cuda()), normed(size_t(M * H) * 2, Device::cuda());
      const auto chain = [&](cudaStream_t st, bool pdl) {
        cuda::gemv_norm_in(delta.data(), H, res.data(), H, nw.data(), kEps, w_in.fp8(), h1.data(), H, M, H, H,
                           GemvEpilogue::bf16, cfg, st, pdl);
        cuda::gemv(h1.data(), H, w_gu.fp8(), act.data(), I, M, 2 * I, H, GemvEpilogue::silu_mul, cfg, st,
                   pdl);
        cuda::gemv_add_rms_norm(act.data(), I, w_down.fp8(), tmp.data(), H, res.data(), H, nw.data(),
                                normed.data(), H, M, H, I, kEps, cfg, st, pdl);
      };
      const auto outputs = [&] {
        std::vector<std::vector<uint8_t>> v;
        for (const Buffer* b : {&res, &h1, &act, &tmp, &normed})
          v.push_back(to_host<uint8_t>(*b, b->bytes()));
        return v;
      };
      const auto load = [&](uint32_t r) {
        const auto d = random_bf16(size_t(M * H), 1500 + r, -2.0f, 2.0f),
                   r0 = random_bf16(size_t(M * H), 1600 + r);
        copy_bytes(delta.data(), Device::cuda(), d.data(), Device::cpu(), d.size() * 2);
        copy_bytes(res.data(), Device::cuda(), r0.data(), Device::cpu(), r0.size() * 2);
        for (const Buffer* b : {&h1, &act, &tmp, &normed}) poison(*b);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
      };
      EXPECT_EQ(test::graph_replay_mismatch([&](cudaStream_t st) { chain(st, true); },
                                            [&](cudaStream_t st) { chain(st, false); }, load, outputs),
                "")
          << "M " << M << " " << name(cfg);
    }
}

// The format's own checks, before any launch (host only: runs without a GPU).
TEST(CudaGemvFp8x16, RefusesWhatTheFormatCannotRead) {
  alignas(16) static uint8_t buf[8192];
  const float* scales = reinterpret_cast<const float*>(buf + 4096);
  void* x = buf + 5120;
  void* out = buf + 6144;
  const GemvConfig cfg = cuda::kGemvE4m3x16Configs[0];
  const GemvWeight ok{buf, 64, scales}, bf16{buf, 64, nullptr}, ld24{buf, 24, scales},
      data8{buf + 8, 64, scales};
  EXPECT_TRUE(cuda::gemv_weight_fits(cfg, ok, 64));
  EXPECT_FALSE(cuda::gemv_weight_fits(cfg, bf16, 64));
  EXPECT_FALSE(cuda::gemv_weight_fits(cfg, ok, 56));                     // K not a multiple of 16
  EXPECT_FALSE(cuda::gemv_weight_fits(cfg, ld24, 16));                   // ldw not a multiple of 16
  EXPECT_FALSE(cuda::gemv_weight_fits(cfg, data8, 64));                  // 8-byte aligned data
  EXPECT_TRUE(cuda::gemv_weight_fits(GemvConfig{4, false}, data8, 64));  // the 8-element format reads it
  for (const GemvWeight& w : {bf16, data8})
    EXPECT_THROW(cuda::gemv(x, 64, w, out, 8, 1, 8, 64, GemvEpilogue::bf16, cfg, nullptr), Error);
  EXPECT_THROW(cuda::gemv(x, 56, ok, out, 8, 1, 8, 56, GemvEpilogue::bf16, cfg, nullptr), Error);
  EXPECT_THROW(
      cuda::gemv_norm_in(x, 64, out, 64, x, kEps, bf16, out, 8, 1, 8, 64, GemvEpilogue::bf16, cfg, nullptr),
      Error);
  EXPECT_THROW(cuda::gemv_add_rms_norm(x, 64, data8, out, 8, out, 8, x, out, 8, 1, 8, 64, kEps, cfg, nullptr),
               Error);
  EXPECT_FALSE(cuda::gemv_takes(cfg, x, 64, bf16, out, 8, 1, 8, 64, GemvEpilogue::bf16));
  EXPECT_TRUE(cuda::gemv_takes(cfg, x, 64, ok, out, 8, 1, 8, 64, GemvEpilogue::bf16));
  // The block rows: 8 at M <= 2, 4 above; the lighter form 4 at every M.
  EXPECT_EQ(cuda::gemv_rows(cfg), 8);
  EXPECT_EQ(cuda::gemv_block_rows(cfg, 2), 8);
  EXPECT_EQ(cuda::gemv_block_rows(cfg, 3), 4);
  for (const int warps : {2, 4, 8, 16}) {
    EXPECT_TRUE(cuda::gemv_known_config(light(warps)));
    EXPECT_TRUE(cuda::gemv_fusable(light(warps)) && cuda::gemv_norm_in_fusable(light(warps)));
    EXPECT_EQ(cuda::gemv_rows(light(warps)), 4);
    for (const int64_t m : {1, 2, 3, 8}) EXPECT_EQ(cuda::gemv_block_rows(light(warps), m), 4);
  }
  EXPECT_TRUE(cuda::gemv_weight_fits(light(4), ok, 64));
  EXPECT_FALSE(cuda::gemv_weight_fits(light(4), data8, 64));
  // x16_rows is the e4m3 x 16 configs' field: 4 rows elsewhere, or another count, is no config.
  GemvConfig odd = light(4);
  odd.x16_rows = 6;
  EXPECT_FALSE(cuda::gemv_known_config(odd));
  EXPECT_FALSE(cuda::gemv_known_config(GemvConfig{.warps = 4, .x16_rows = 4}));
  EXPECT_THROW(cuda::gemv(x, 64, ok, out, 8, 1, 8, 64, GemvEpilogue::bf16, odd, nullptr), Error);
  EXPECT_FALSE(cuda::gemv_takes(odd, x, 64, ok, out, 8, 1, 8, 64, GemvEpilogue::bf16));
}

// Tactic word 7 marks an e4m3 x 16 config (an FP8 weight's, K a multiple of 16): 1 the 8-row form, 2 the
// lighter 4-row one; v4 lines (word 7 zero) and v6 lines (word 7 one) read as before. Host only.
TEST(CudaGemvFp8x16, TacticLineWord7) {
  const cuda::GemmShape s{1, 6144, 2560, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv = cuda::kGemvE4m3x16Configs[1];
  t.gemv_norm_in = true;
  t.us = 5.5f;
  t.describe = "kiln-gemv-e4m3x16 warps 4 rows 8 +norm-in";
  const std::string line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(line,
            "1 6144 2560 bf16:e4m3 5.5 gemv 4 0 1 0 0 0 0 1 # kiln-gemv-e4m3x16 warps 4 rows 8 +norm-in");
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2));
  EXPECT_EQ(t2.gemv, t.gemv);
  EXPECT_FALSE(cuda::parse_tactic_line("1 6144 2560 bf16 5.5 gemv 4 0 1 0 0 0 0 1 # bf16 W", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("1 6144 2568 bf16:e4m3 5.5 gemv 4 0 1 0 0 0 0 1 # K % 16", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("1 6144 2560 bf16:e4m3 5.5 gemv 4 0 1 0 0 0 0 3 # word 7", s2, t2));
  ASSERT_TRUE(cuda::parse_tactic_line("1 6144 2560 bf16:e4m3 5.5 gemv 4 0 1 0 0 0 0 0 # v4", s2, t2));
  EXPECT_FALSE(t2.gemv.e4m3x16);
  // A W8A8 tactic whose prologue runs an e4m3 x 16 config: word 6 = 2.
  t.gemv = cuda::kGemvW8a8Configs[0];
  t.norm_in_gemv = cuda::kGemvE4m3x16Configs[2];
  ASSERT_TRUE(cuda::parse_tactic_line(cuda::format_tactic_line(s, t), s2, t2))
      << cuda::format_tactic_line(s, t);
  ASSERT_TRUE(t2.norm_in_gemv.has_value());
  EXPECT_EQ(*t2.norm_in_gemv, cuda::kGemvE4m3x16Configs[2]);
  EXPECT_EQ(t2.norm_in_gemv->x16_rows, 8);
}

// The lighter form round-trips through words 7 (= 2) and 6 (= 3, a W8A8 tactic's prologue); every config of
// kGemvE4m3x16Configs comes back as itself. Host only.
TEST(CudaGemvFp8x16, TacticLineLighterForm) {
  const cuda::GemmShape s{1, 19456, 2560, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv = light(4);
  t.us = 21.5f;
  t.describe = "kiln-gemv-e4m3x16 warps 4 rows 4";  // the tuner's describe_gemv: gemv_rows
  const std::string line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(line, "1 19456 2560 bf16:e4m3 21.5 gemv 4 0 0 0 0 0 0 2 # kiln-gemv-e4m3x16 warps 4 rows 4");
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2));
  EXPECT_EQ(t2.gemv, light(4));
  EXPECT_EQ(cuda::gemv_rows(t2.gemv), 4);
  EXPECT_FALSE(cuda::parse_tactic_line("1 19456 2560 bf16 21.5 gemv 4 0 0 0 0 0 0 2 # bf16 W", s2, t2));
  // A v6 line of the 8-row form reads as that form.
  ASSERT_TRUE(cuda::parse_tactic_line("1 19456 2560 bf16:e4m3 21.5 gemv 4 0 0 0 0 0 0 1 # v6", s2, t2));
  EXPECT_EQ(t2.gemv, cuda::kGemvE4m3x16Configs[1]);
  for (const GemvConfig c : cuda::kGemvE4m3x16Configs) {
    t.gemv = c;
    ASSERT_TRUE(cuda::parse_tactic_line(cuda::format_tactic_line(s, t), s2, t2)) << name(c);
    EXPECT_EQ(t2.gemv, c) << name(c);
  }
  // A W8A8 tactic whose prologue runs the lighter form: word 6 = 3.
  t.gemv = cuda::kGemvW8a8Configs[0];
  t.gemv_norm_in = true;
  t.norm_in_gemv = light(8);
  const std::string w8 = cuda::format_tactic_line(s, t);
  EXPECT_NE(w8.find(" 8 3 0 #"), std::string::npos) << w8;
  ASSERT_TRUE(cuda::parse_tactic_line(w8, s2, t2)) << w8;
  ASSERT_TRUE(t2.norm_in_gemv.has_value());
  EXPECT_EQ(*t2.norm_in_gemv, light(8));
  EXPECT_FALSE(cuda::parse_tactic_line(w8.substr(0, w8.find(" 8 3 0 #")) + " 8 4 0 # word 6", s2, t2));
}

}  // namespace
}  // namespace kiln
