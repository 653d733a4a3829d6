// The W8A8 GEMV (ops/cuda/gemv_w8a8.h): every config, M = 1..8, N ragged (not a multiple of 8 or 128), K
// a multiple of 16 but not of 128, strided x and W, the bf16, f32 and silu_mul epilogues, each against the
// fp64 product of the same quantized operands (relative Frobenius error <= 2^-8 per row) and the bf16 one
// against the CPU oracle ops::linear_fp8(w8a8) (within 2^-7: both within 2^-8 of fp64); outputs poisoned
// before each launch and checked in full (padding untouched); a row's bits independent of M; two runs
// bitwise equal; silu_mul bitwise the bf16 epilogue then the silu_mul kernel. The in-kernel quantizer bitwise
// ops::quantize_act_fp8 through an identity weight (one product per output: out = f32(xq * a_s) exactly).
// The residual-norm prologue bitwise the rms_norm kernel then the GEMV. A CUDA graph replayed with changed
// inputs; bad calls refused before any launch; the engine's dispatch
// (the tuned W8A8 GEMV, the scratch path where it does not take the call) and the tactic line's W8A8 words.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "fp8_weight_util.h"
#include "gemv_test_util.h"
#include "kiln/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_w8a8.h"
#include "ops/fp8.h"
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

constexpr double kTol = 1.0 / 256;  // gemv_w8a8.h: relative Frobenius error <= 2^-8

// Whether this GPU runs the W8A8 GEMV (sm_89+ code in the build); the tests skip elsewhere.
#define KILN_REQUIRE_W8A8_GEMV()                                                                            \
  do {                                                                                                      \
    KILN_REQUIRE_GPU();                                                                                     \
    if (!cuda::gemv_w8a8_supported(1, 16, 16, 16, 16, 16, GemvEpilogue::bf16)) GTEST_SKIP() << "no sm_89+"; \
  } while (0)

std::string name(GemvConfig c) {
  return "warps " + std::to_string(c.warps) + " tiles " + std::to_string(c.tiles) + " kblocks " +
         std::to_string(c.w8a8);
}

// x: uniform in [-1, 1], row r scaled by 2^(3 (r % 5) - 6) (exact in bf16), so the per-row scales differ.
std::vector<bf16_t> make_x(int64_t rows, int64_t ld, uint32_t seed) {
  std::vector<bf16_t> x = random_bf16(size_t(rows * ld), seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      bf16_t& v = x[size_t(r * ld + c)];
      v = f32_to_bf16(bf16_to_f32(v) * std::ldexp(1.0f, 3 * int(r % 5) - 6));
    }
  return x;
}

// The CPU quantizer (the oracle) on the first `rows` rows of x (test_util_cuda.h).
test::QuantRows quantize(const std::vector<bf16_t>& x, int64_t ldx, int64_t rows, int64_t k) {
  std::vector<int64_t> r(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) r[size_t(i)] = i;
  return test::quantize_rows(x, ldx, k, r);
}

// ref[m * N + n]: the fp64 product of the quantized operands (test_util_cuda.h: w8a8_reference).
std::vector<double> reference(const test::QuantRows& a, const Fp8TestWeight& w) {
  return test::w8a8_reference(a, w.q.data(), w.ld, w.s.data(), w.n, w.k);
}

// The output element (m, n) of a raw output buffer as f64 (bf16 or f32 elements).
double element(const std::vector<uint8_t>& out, bool f32, int64_t ldo, int64_t m, int64_t n) {
  if (f32) {
    float v;
    std::memcpy(&v, &out[size_t((m * ldo + n) * 4)], 4);
    return double(v);
  }
  bf16_t v;
  std::memcpy(&v, &out[size_t((m * ldo + n) * 2)], 2);
  return double(bf16_to_f32(v));
}

// Largest relative Frobenius error of a row m < M of out against ref.
double worst_row_error(const std::vector<uint8_t>& out, bool f32, int64_t ldo, const std::vector<double>& ref,
                       int64_t M, int64_t N) {
  return test::worst_row_error(
      ref, [&](int64_t m, int64_t n) { return element(out, f32, ldo, m, n); }, M, N);
}

// Every byte of out outside rows < M and columns < cols (elements of es bytes) is still the poison.
bool padding_poisoned(const std::vector<uint8_t>& out, int64_t es, int64_t ldo, int64_t M, int64_t cols) {
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t e = int64_t(i) / es, m = e / ldo, c = e % ldo;
    if ((m >= M || c >= cols) && out[i] != 0xff) return false;
  }
  return true;
}

constexpr auto run = test::run_gemv;

using Shape = test::WeightShape;

TEST(CudaGemvW8a8, EveryConfigWithinTolerancePaddingUntouchedRowsIndependentOfM) {
  KILN_REQUIRE_W8A8_GEMV();
  // Ragged N (37, 1001, 6144 with K ragged: the 4B QKV rows), K multiples of 16 but not of 128, a strided W
  // (ld a multiple of 16), the smallest K (16).
  const Shape shapes[] = {{"37x208", 37, 208, 0},
                          {"1001x1040 ld", 1001, 1040, 1072},
                          {"6144x2576", 6144, 2576, 0},
                          {"5x16", 5, 16, 0}};
  uint32_t seed = 10;
  for (const Shape& s : shapes) {
    const Fp8TestWeight w(s.n, s.k, ++seed, s.ld);
    const int64_t ldx = s.k + 24;
    const std::vector<bf16_t> xh = make_x(8, ldx, ++seed);
    const Buffer x = to_device(xh);
    const test::QuantRows a = quantize(xh, ldx, 8, s.k);
    const std::vector<double> ref = reference(a, w);
    // The CPU oracle, path (a), on the 8 rows (bf16 out).
    std::vector<bf16_t> dense(size_t(8 * s.k)), oracle(size_t(8 * s.n));
    for (int64_t r = 0; r < 8; ++r)
      std::memcpy(&dense[size_t(r * s.k)], &xh[size_t(r * ldx)], size_t(s.k) * 2);
    std::vector<uint8_t> q = w.q;
    std::vector<float> sc = w.s;
    ops::linear_fp8(
        Tensor(dense.data(), DType::bf16, {8, s.k}),
        ops::LinearWeight(Tensor::strided(q.data(), DType::f8e4m3, {s.n, s.k}, {w.ld, 1}),
                          Tensor(sc.data(), DType::f32, {ops::fp8_blocks(s.n), ops::fp8_blocks(s.k)})),
        Tensor(oracle.data(), DType::bf16, {8, s.n}), ops::Fp8LinearPath::w8a8);
    const int64_t ldo = s.n + 8;
    Buffer out(size_t(8 * ldo) * 4, Device::cuda());
    for (const GemvEpilogue epi : {GemvEpilogue::bf16, GemvEpilogue::f32}) {
      const bool f32 = epi == GemvEpilogue::f32;
      for (const GemvConfig cfg : cuda::kGemvW8a8Configs) {
        const auto all = run(x, ldx, w.fp8(), out, ldo, 8, s.n, s.k, epi, cfg);
        ASSERT_EQ(run(x, ldx, w.fp8(), out, ldo, 8, s.n, s.k, epi, cfg), all)
            << s.name << " " << name(cfg) << ": two runs differ";
        if (!f32) {
          std::vector<bf16_t> got(size_t(8 * s.n));
          for (int64_t m = 0; m < 8; ++m)
            std::memcpy(&got[size_t(m * s.n)], &all[size_t(m * ldo * 2)], size_t(s.n) * 2);
          EXPECT_LE(test::rel_frob(got, oracle), 2 * kTol)
              << s.name << " " << name(cfg) << " against the oracle";
        }
        for (int64_t m = 1; m <= 8; ++m) {
          const auto got = m == 8 ? all : run(x, ldx, w.fp8(), out, ldo, m, s.n, s.k, epi, cfg);
          const int64_t es = f32 ? 4 : 2;
          EXPECT_LE(worst_row_error(got, f32, ldo, ref, m, s.n), kTol)
              << s.name << " epilogue " << int(epi) << " M " << m << " " << name(cfg);
          ASSERT_TRUE(padding_poisoned(got, es, ldo, m, s.n))
              << s.name << " M " << m << " " << name(cfg) << ": wrote outside the output";
          // Row r's bits do not depend on M (the same rows of the M = 8 run).
          for (int64_t r = 0; r < m; ++r)
            ASSERT_EQ(std::memcmp(&got[size_t(r * ldo * es)], &all[size_t(r * ldo * es)], size_t(s.n * es)),
                      0)
                << s.name << " M " << m << " row " << r << " " << name(cfg);
        }
      }
    }
  }
}

TEST(CudaGemvW8a8, SiluMulBitwiseTheBf16EpilogueThenSiluMul) {
  KILN_REQUIRE_W8A8_GEMV();
  // I = N / 2 a multiple of 8 (the silu_mul kernel's chunks), not of 64; K ragged.
  const Shape shapes[] = {{"gate_up 304x1040", 304, 1040, 0}, {"gate_up 2000x2576 ld", 2000, 2576, 2592}};
  uint32_t seed = 50;
  for (const Shape& s : shapes) {
    const Fp8TestWeight w(s.n, s.k, ++seed, s.ld);
    const Buffer x = to_device(make_x(8, s.k, ++seed));
    const int64_t I = s.n / 2;
    Buffer act(size_t(8 * I) * 2, Device::cuda()), gu(size_t(8 * s.n) * 2, Device::cuda()),
        want(size_t(8 * I) * 2, Device::cuda());
    for (const GemvConfig cfg : cuda::kGemvW8a8Configs)
      for (int64_t m = 1; m <= 8; ++m) {
        const auto got = run(x, s.k, w.fp8(), act, I, m, s.n, s.k, GemvEpilogue::silu_mul, cfg);
        ASSERT_TRUE(padding_poisoned(got, 2, I, m, I)) << s.name << " M " << m << " " << name(cfg);
        run(x, s.k, w.fp8(), gu, s.n, m, s.n, s.k, GemvEpilogue::bf16, cfg);
        poison(want);
        cuda::silu_mul(gu.data(), s.n, want.data(), I, m, I, nullptr);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_EQ(got, to_host<uint8_t>(want, want.bytes())) << s.name << " M " << m << " " << name(cfg);
      }
  }
}

// The residual-norm prologue (gemv_w8a8_norm_in through gemv_norm_in): out and residual bitwise the rms_norm
// kernel with add, then the W8A8 GEMV with the same config on the normed rows; every config, M 1..8, the
// three epilogues, K ragged (prologue rows past 48 KB of shared memory at M = 8 for K 4112), strided delta
// and residual.
TEST(CudaGemvW8a8, NormInBitwiseTheRmsNormKernelThenTheGemv) {
  KILN_REQUIRE_W8A8_GEMV();
  struct Case {
    Shape s;
    GemvEpilogue epi;
  };
  const Case cases[] = {{{"1001x1040", 1001, 1040, 0}, GemvEpilogue::bf16},
                        {{"gate_up 304x2576", 304, 2576, 0}, GemvEpilogue::silu_mul},
                        {{"300x4112", 300, 4112, 0}, GemvEpilogue::f32}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    const Shape& s = c.s;
    const Fp8TestWeight w(s.n, s.k, ++seed);
    const int64_t ld = s.k + 8;  // delta's and residual's row strides
    const Buffer delta = to_device(random_bf16(size_t(8 * ld), ++seed, -2.0f, 2.0f));
    const Buffer res0 = to_device(random_bf16(size_t(8 * ld), ++seed, -4.0f, 4.0f));
    const Buffer nw = to_device(random_bf16(size_t(s.k), ++seed, 0.5f, 1.5f));
    const int64_t cols = c.epi == GemvEpilogue::silu_mul ? s.n / 2 : s.n;
    Buffer out(size_t(8 * cols) * 4, Device::cuda()), res(res0.bytes(), Device::cuda()),
        normed(size_t(8 * s.k) * 2, Device::cuda());
    for (const GemvConfig cfg : cuda::kGemvW8a8Configs)
      for (int64_t m = 1; m <= 8; ++m) {
        const test::NormInRuns r = test::norm_in_runs(delta, res0, res, ld, nw, 1e-6f, w.fp8(), out, cols,
                                                      normed, m, s.n, s.k, c.epi, cfg);
        ASSERT_EQ(r.fused, r.unfused) << s.name << " M " << m << " " << name(cfg);
      }
  }
}

// An identity weight (e4m3 1.0 on the diagonal, scales 1): out[m, n] = fma(xq[m, n], a_s[m, n / 128] * 1, 0)
// exactly, so the f32 output is f32(e4m3(xq) * a_s) of the CPU quantizer's codes and scales, bit for bit:
// zero groups (the 1e-10 floor), tiny and huge magnitudes included.
TEST(CudaGemvW8a8, QuantizerBitwiseTheCpuOracleThroughAnIdentityWeight) {
  KILN_REQUIRE_W8A8_GEMV();
  const int64_t K = 1040, N = K;
  std::vector<uint8_t> q(size_t(N * K), 0);
  for (int64_t n = 0; n < N; ++n) q[size_t(n * K + n)] = 0x38;  // e4m3 1.0
  const std::vector<float> s(size_t(ops::fp8_blocks(N) * ops::fp8_blocks(K)), 1.0f);
  const Buffer dq = to_device(q), ds = to_device(s);
  const GemvWeight w{dq.data(), K, static_cast<const float*>(ds.data())};
  std::vector<bf16_t> xh = make_x(8, K, 77);
  for (int64_t c = 0; c < K; ++c) {
    if (c >= 256 && c < 384) xh[size_t(c)] = f32_to_bf16(0.0f);               // row 0: a zero group
    xh[size_t(K + c)] = f32_to_bf16(bf16_to_f32(xh[size_t(K + c)]) * 1e30f);  // row 1: huge
    xh[size_t(2 * K + c)] =
        f32_to_bf16(bf16_to_f32(xh[size_t(2 * K + c)]) * 1e-30f);  // row 2: below the floor
    if (c < 128) xh[size_t(3 * K + c)] = f32_to_bf16(bf16_to_f32(xh[size_t(3 * K + c)]) * 1e-8f);  // near it
  }
  const Buffer x = to_device(xh);
  const test::QuantRows a = quantize(xh, K, 8, K);
  const int64_t Kb = ops::fp8_blocks(K);
  Buffer out(size_t(8 * N) * 4, Device::cuda());
  for (const GemvConfig cfg : cuda::kGemvW8a8Configs) {
    const auto got = run(x, K, w, out, N, 8, N, K, GemvEpilogue::f32, cfg);
    for (int64_t m = 0; m < 8; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const float want = e4m3_to_f32(a.q[size_t(m * K + n)]) * a.s[size_t(m * Kb + n / 128)];
        float g;
        std::memcpy(&g, &got[size_t((m * N + n) * 4)], 4);
        uint32_t gb, wb;
        std::memcpy(&gb, &g, 4);
        std::memcpy(&wb, &want, 4);
        // A -0 code sums to +0 with the row's other (zero) products: zeros compare by value.
        if (want == 0.0f) {
          ASSERT_EQ(g, 0.0f) << "row " << m << " column " << n << " " << name(cfg);
        } else {
          ASSERT_EQ(gb, wb) << "row " << m << " column " << n << " " << name(cfg) << ": " << g << " vs "
                            << want;
        }
      }
  }
}

TEST(CudaGemvW8a8, GraphReplaysWithChangingInputs) {
  KILN_REQUIRE_W8A8_GEMV();
  const int64_t M = 5, N = 1001, K = 1040, I = 152;
  const Fp8TestWeight w(N, K, 401), wg(2 * I, K, 402);
  Buffer x(size_t(M * K) * 2, Device::cuda()), out(size_t(M * N) * 2, Device::cuda()),
      act(size_t(M * I) * 2, Device::cuda());
  const GemvConfig c1 = cuda::kGemvW8a8Configs[1], c2 = cuda::kGemvW8a8Configs[9];
  const Buffer nw = to_device(random_bf16(size_t(K), 403, 0.5f, 1.5f));
  Buffer res(size_t(M * K) * 2, Device::cuda());
  // A plain GEMV, then a residual-norm prologue into the gate_up + SiLU form (the residual rewritten).
  const auto chain = [&](cudaStream_t st) {
    cuda::gemv(x.data(), K, w.fp8(), out.data(), N, M, N, K, GemvEpilogue::bf16, c1, st, true);
    cuda::gemv_norm_in(x.data(), K, res.data(), K, nw.data(), 1e-6f, wg.fp8(), act.data(), I, M, 2 * I, K,
                       GemvEpilogue::silu_mul, c2, st, true);
  };
  const auto load = [&](uint32_t r) {
    const auto xs = make_x(M, K, 500 + r), rs = random_bf16(size_t(M * K), 600 + r);
    copy_bytes(x.data(), Device::cuda(), xs.data(), Device::cpu(), xs.size() * 2);
    copy_bytes(res.data(), Device::cuda(), rs.data(), Device::cpu(), rs.size() * 2);
    poison(out);
    poison(act);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  };
  const auto outputs = [&] {
    return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(out, out.bytes()),
                                             to_host<uint8_t>(act, act.bytes()),
                                             to_host<uint8_t>(res, res.bytes())};
  };
  EXPECT_EQ(test::graph_replay_mismatch(chain, chain, load, outputs), "");
}

// Bad calls throw before anything is launched (host only: every one fails a check ahead of the launch).
TEST(CudaGemvW8a8, BadCallsThrowBeforeLaunch) {
  alignas(16) static uint8_t buf[8192];
  const float* scale = reinterpret_cast<const float*>(buf + 4096);
  void* x = buf + 6144;
  void* out = buf + 7168;
  const GemvConfig cfg = cuda::kGemvW8a8Configs[0];
  // A bf16 weight with a W8A8 config; W only 8-byte aligned; a config not in the list; K not a multiple
  // of 16.
  EXPECT_THROW(
      cuda::gemv(x, 64, GemvWeight{buf, 64, nullptr}, out, 8, 1, 8, 64, GemvEpilogue::bf16, cfg, nullptr),
      Error);
  EXPECT_THROW(
      cuda::gemv(x, 64, GemvWeight{buf + 8, 64, scale}, out, 8, 1, 8, 64, GemvEpilogue::bf16, cfg, nullptr),
      Error);
  EXPECT_THROW(cuda::gemv(x, 64, GemvWeight{buf, 64, scale}, out, 8, 1, 8, 64, GemvEpilogue::bf16,
                          GemvConfig{16, true, 4, 1}, nullptr),
               Error);
  EXPECT_THROW(
      cuda::gemv(x, 56, GemvWeight{buf, 64, scale}, out, 8, 1, 8, 56, GemvEpilogue::bf16, cfg, nullptr),
      Error);
  EXPECT_THROW(
      cuda::gemv(x, 64, GemvWeight{buf, 64, scale}, out, 8, 9, 8, 64, GemvEpilogue::bf16, cfg, nullptr),
      Error);
  EXPECT_FALSE(
      cuda::gemv_takes(cfg, x, 64, GemvWeight{buf + 8, 64, scale}, out, 8, 1, 8, 64, GemvEpilogue::bf16));
  EXPECT_FALSE(
      cuda::gemv_takes(cfg, x, 56, GemvWeight{buf, 56, scale}, out, 8, 1, 8, 56, GemvEpilogue::bf16));
  // The add + RMSNorm epilogue and the attention preparation take no W8A8 config (gemv_fusable); the
  // residual-norm prologue does, with the W8A8 guards (K a multiple of 16, a block-FP8 W).
  for (const GemvConfig& c : cuda::kGemvW8a8Configs) EXPECT_FALSE(cuda::gemv_fusable(c)) << name(c);
  EXPECT_THROW(cuda::gemv_add_rms_norm(x, 64, GemvWeight{buf, 64, scale}, out, 8, out, 8, x, out, 8, 1, 8, 64,
                                       1e-6f, cfg, nullptr),
               Error);
  EXPECT_THROW(cuda::gemv_norm_in(x, 56, out, 56, x, 1e-6f, GemvWeight{buf, 64, scale}, out, 8, 1, 8, 56,
                                  GemvEpilogue::bf16, cfg, nullptr),
               Error);
  EXPECT_THROW(cuda::gemv_norm_in(x, 64, out, 64, x, 1e-6f, GemvWeight{buf, 64, nullptr}, out, 8, 1, 8, 64,
                                  GemvEpilogue::bf16, cfg, nullptr),
               Error);
}

// The tactic line's W8A8 words: word 4 the K blocks in flight, words 5 / 6 the W8A16 config of the
// residual-norm prologue (zero: the W8A8 config's own); rejected for a bf16 weight, a K the kernel does not
// take, stray words. Host only.
TEST(CudaGemvW8a8, TacticLineCarriesTheW8a8Config) {
  const cuda::GemmShape s{1, 6144, 2560, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv = GemvConfig{8, true, 1, 2};
  t.gemv_norm_in = true;
  t.norm_in_gemv = GemvConfig{16, true};
  t.us = 6.5f;
  t.describe = "w8a8";
  const std::string line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(line, "1 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 2 10 1 0 # w8a8");
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2));
  EXPECT_EQ(s2, s);
  EXPECT_EQ(t2.gemv, t.gemv);
  EXPECT_TRUE(t2.gemv_norm_in);
  ASSERT_TRUE(t2.norm_in_gemv.has_value());
  EXPECT_EQ(*t2.norm_in_gemv, (GemvConfig{16, true}));
  EXPECT_EQ(cuda::format_tactic_line(s2, t2), line);
  // Without the prologue: words 5 / 6 zero.
  ASSERT_TRUE(cuda::parse_tactic_line("1 6144 2560 bf16:e4m3 6.5 gemv 8 1 0 2 1 0 0 0 # w8a8", s2, t2));
  EXPECT_EQ(t2.gemv, (GemvConfig{8, true, 2, 1}));
  EXPECT_FALSE(t2.norm_in_gemv.has_value());
  // The W8A8 config's own prologue: words 5 / 6 zero.
  ASSERT_TRUE(
      cuda::parse_tactic_line("1 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 2 0 0 0 # w8a8 +norm-in", s2, t2));
  EXPECT_TRUE(t2.gemv_norm_in);
  EXPECT_FALSE(t2.norm_in_gemv.has_value());
  // A v3 line (word 4 zero) is the W8A16 GEMV.
  ASSERT_TRUE(cuda::parse_tactic_line("1 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 0 0 0 0 # v3", s2, t2));
  EXPECT_EQ(t2.gemv.w8a8, 0);
  for (const char* bad : {
           "1 6144 2560 bf16 6.5 gemv 8 1 0 0 2 0 0 0 # a bf16 weight",
           "1 6144 2568 bf16:e4m3 6.5 gemv 8 1 0 0 2 0 0 0 # K not a multiple of 16",
           "1 6144 2560 bf16:e4m3 6.5 gemv 8 1 0 0 3 0 0 0 # 3 K blocks: no such config",
           "1 6144 2560 bf16:e4m3 6.5 gemv 10 1 0 4 1 0 0 0 # 16 warps x 4 tiles: no such config",
           "1 6144 2560 bf16:e4m3 6.5 gemv 8 1 0 0 2 10 1 0 # prologue words without the prologue",
           "1 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 2 0 1 0 # a prologue flag without its warps",
           "1 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 0 10 1 0 # prologue words on a W8A16 config",
       })
    EXPECT_FALSE(cuda::parse_tactic_line(bad, s2, t2)) << bad;
}

TEST(CudaGemvW8a8, EngineRunsTheTunedW8a8GemvOrFallsBack) {
  KILN_REQUIRE_W8A8_GEMV();
  const int64_t N = 1001, K = 1040;
  const GemvConfig cfg = cuda::kGemvW8a8Configs[3];
  // The same values twice: rows of K bytes, and rows of K + 8 (not a multiple of 16).
  const Fp8TestWeight w(N, K, 700), strided(N, K, 700, K + 8);
  const Buffer x = to_device(make_x(8, K, 702));
  Buffer a(size_t(8 * N) * 2, Device::cuda()), b(size_t(8 * N) * 2, Device::cuda());
  cuda::GemmEngine eng;
  const std::string path = (test_support::process_scratch_dir("cuda_gemv_w8a8") / "tactics.txt").string();
  test::write_gemv_cache(eng, path, {{{4, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8}, cfg, false}});
  ASSERT_TRUE(eng.load(path));
  ASSERT_EQ(eng.gemv_choice(3, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8), cfg);
  EXPECT_FALSE(eng.gemv_norm_in_choice(3, N, K, cuda::GemmWeight::fp8).has_value()) << "not tuned with one";
  const auto engine_run = [&](const GemvWeight& wt) {
    poison(a);
    eng.run(x.data(), K, wt, a.data(), N, 3, N, K, cuda::GemmOut::bf16, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host<uint8_t>(a, a.bytes());
  };
  EXPECT_EQ(engine_run(w.fp8()), run(x, K, w.fp8(), b, N, 3, N, K, GemvEpilogue::bf16, cfg));
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  // A W the kernel does not take (row stride not a multiple of 16): the scratch path, bitwise the bf16 run
  // on the dequantized weight (contiguous, as the scratch; cuBLASLt's heuristic: no bf16 tactic).
  const auto got = engine_run(strided.fp8());
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  EXPECT_EQ(eng.fp8_dequant_dispatches(), 1);
  poison(b);
  eng.run(x.data(), K, w.bf16(), b.data(), N, 3, N, K, cuda::GemmOut::bf16, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(got, to_host<uint8_t>(b, b.bytes()));
}

// A v3 tactic cache still loads (its GEMV tactics are the W8A16 ones); another format is ignored.
TEST(CudaGemvW8a8, TacticCacheV3StillLoads) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  const auto dir = test_support::process_scratch_dir("cuda_gemv_w8a8_v3");
  const std::string v3 = (dir / "v3.txt").string(), v9 = (dir / "v9.txt").string();
  std::ofstream(v3) << "kiln-gemm-tactics v3\nkey " << eng.key()
                    << "\n1 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 0 0 0 0 # v3\n";
  ASSERT_TRUE(eng.load(v3));
  EXPECT_EQ(eng.gemv_choice(1, 6144, 2560, cuda::GemmOut::bf16, cuda::GemmWeight::fp8),
            (GemvConfig{8, true}));
  std::ofstream(v9) << "kiln-gemm-tactics v9\nkey " << eng.key() << "\n";
  EXPECT_FALSE(eng.load(v9));
}

}  // namespace
}  // namespace kiln
