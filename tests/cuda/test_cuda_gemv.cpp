// Small-M GEMV (ops/cuda/gemv.h): accuracy against an fp64 reference for M = 1..8 on the Qwen3-4B and 0.6B
// decode shapes and odd ones, every block size, bf16 and f32 out; determinism (two runs bitwise equal, a
// row's result independent of M); strided rows; the fused SiLU-and-mul epilogue bitwise equal to the GEMV
// followed by the silu_mul kernel; PDL launches (producer -> GEMV -> fused GEMV) bitwise equal to plain ones;
// bad arguments rejected before any launch; the tactic cache holding a GEMV pseudo-tactic (line format round
// trip here without a GPU; load, dispatch, save on one); the linear_silu_mul op on CUDA (fused when the GEMV
// is the tactic, else GEMM + silu_mul). The add + RMSNorm epilogue is tested in
// test_cuda_gemv_add_rms_norm.cpp. Every output buffer is poisoned (all bits set: NaN) before each run, so an
// element never written fails the checks.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "gemm_reference.h"
#include "gemv_test_util.h"
#include "kiln/cuda_check.h"
#include "ops/activation.h"
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

std::vector<float> read_out(const Buffer& b, size_t n, bool f32) {
  if (f32) return to_host<float>(b, n);
  return test::widen(to_host<bf16_t>(b, n));
}

// Runs the GEMV into a poisoned buffer and returns its raw bytes (rows * ldo elements).
std::vector<uint8_t> run_gemv(const Buffer& x, int64_t ldx, const Buffer& w, int64_t ldw, const Buffer& out,
                              int64_t ldo, int64_t m, int64_t n, int64_t k, GemvEpilogue epi,
                              GemvConfig cfg) {
  poison(out);
  cuda::gemv(x.data(), ldx, w.data(), ldw, out.data(), ldo, m, n, k, epi, cfg, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<uint8_t>(out, out.bytes());
}

struct Shape {
  const char* name;
  int64_t N, K;
};

// The decode GEMM shapes of Qwen3-4B and Qwen3-0.6B, and odd ones: N not a multiple of the 4 rows a block
// owns, K a multiple of 8 but not of 64 or 256, a single K chunk.
const Shape kShapes[] = {
    {"4B qkv", 6144, 2560},       {"4B o", 2560, 4096},          {"4B gate_up", 19456, 2560},
    {"4B down", 2560, 9728},      {"0.6B qkv", 4096, 1024},      {"0.6B o", 1024, 2048},
    {"0.6B gate_up", 6144, 1024}, {"0.6B down", 1024, 3072},     {"odd 5x8", 5, 8},
    {"odd 37x200", 37, 200},      {"odd 1001x1000", 1001, 1000}, {"odd 3x2056", 3, 2056}};

TEST(CudaGemv, MatchesFp64ReferenceDeterministicRowIndependent) {
  KILN_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    const int64_t M8 = cuda::kGemvMaxM;
    const auto x = random_bf16(size_t(M8 * s.K), 11), w = random_bf16(size_t(s.N * s.K), 12);
    const auto ref = test::gemm_fp64(x, s.K, w, s.K, M8, s.N, s.K);
    Buffer dx = to_device(x), dw = to_device(w), out(size_t(M8 * s.N) * 4, Device::cuda());
    for (const bool f32 : {false, true}) {
      const GemvEpilogue epi = f32 ? GemvEpilogue::f32 : GemvEpilogue::bf16;
      const size_t esz = f32 ? 4 : 2;
      for (const GemvConfig cfg : cuda::kGemvConfigs) {
        // M = 8 first: every smaller M must reproduce its first M rows bitwise.
        const auto full = run_gemv(dx, s.K, dw, s.K, out, s.N, M8, s.N, s.K, epi, cfg);
        for (int64_t M = M8; M >= 1; --M) {
          const auto a = run_gemv(dx, s.K, dw, s.K, out, s.N, M, s.N, s.K, epi, cfg);
          const auto b = run_gemv(dx, s.K, dw, s.K, out, s.N, M, s.N, s.K, epi, cfg);
          const std::string what = std::string(s.name) + " M " + std::to_string(M) + " " +
                                   test::gemv_config_name(cfg) + (f32 ? " f32" : " bf16");
          EXPECT_EQ(a, b) << what << ": two runs differ";
          const size_t used = size_t(M * s.N) * esz;
          EXPECT_EQ(std::memcmp(a.data(), full.data(), used), 0) << what << ": rows depend on M";
          for (size_t i = used; i < a.size(); ++i)
            if (a[i] != 0xff) {
              ADD_FAILURE() << what << ": wrote past row M - 1 at byte " << i;
              break;
            }
          std::vector<float> got(size_t(M * s.N));
          if (f32) {
            std::memcpy(got.data(), a.data(), used);
          } else {
            for (size_t i = 0; i < got.size(); ++i) {
              bf16_t v;
              std::memcpy(&v.bits, a.data() + 2 * i, 2);
              got[i] = bf16_to_f32(v);
            }
          }
          const double err = test::rel_frobenius(ref, s.N, got, s.N, M);
          EXPECT_LE(err, f32 ? 1e-5 : 1.0 / 256) << what;  // NaN (an unwritten element) fails too
          if (!f32) {
            EXPECT_GT(err, 0.0) << what << ": bf16 output must show its rounding";
          }
        }
      }
    }
  }
}

// The tensor-core configs of one warp count share one summation order whatever their tiles (gemv.h: each
// 8-row tile has its own mma chain in the one-tile kernel's order): a verify step may then take a multi-tile
// config of the plain step's one-tile config and still give the plain step's rows bit for bit.
TEST(CudaGemv, TensorCoreTilesGiveTheOneTileBits) {
  KILN_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    const int64_t M8 = cuda::kGemvMaxM;
    const auto x = random_bf16(size_t(M8 * s.K), 21), w = random_bf16(size_t(s.N * s.K), 22);
    Buffer dx = to_device(x), dw = to_device(w), out(size_t(M8 * s.N) * 4, Device::cuda());
    for (const bool f32 : {false, true}) {
      const GemvEpilogue epi = f32 ? GemvEpilogue::f32 : GemvEpilogue::bf16;
      for (const int warps : {2, 4, 8, 16})
        for (const int64_t M : {int64_t(1), int64_t(3), int64_t(4), M8}) {
          const auto one = run_gemv(dx, s.K, dw, s.K, out, s.N, M, s.N, s.K, epi, GemvConfig{warps, true, 1});
          for (const int tiles : {2, 4}) {
            const GemvConfig cfg{warps, true, tiles};
            const auto got = run_gemv(dx, s.K, dw, s.K, out, s.N, M, s.N, s.K, epi, cfg);
            EXPECT_EQ(got, one) << s.name << " M " << M << " " << test::gemv_config_name(cfg)
                                << (f32 ? " f32" : " bf16") << " differs from one tile";
          }
        }
    }
  }
}

TEST(CudaGemv, RowStridedOperands) {
  KILN_REQUIRE_GPU();
  const int64_t M = 5, N = 70, K = 264, ldx = K + 24, ldw = K + 16, ldo = N + 42;
  const auto x = random_bf16(size_t(M * ldx), 13), w = random_bf16(size_t(N * ldw), 14);
  const auto ref = test::gemm_fp64(x, ldx, w, ldw, M, N, K);
  Buffer dx = to_device(x), dw = to_device(w), out(size_t(M * ldo) * 4, Device::cuda());
  for (const bool f32 : {false, true}) {
    for (const GemvConfig cfg : cuda::kGemvConfigs) {
      run_gemv(dx, ldx, dw, ldw, out, ldo, M, N, K, f32 ? GemvEpilogue::f32 : GemvEpilogue::bf16, cfg);
      const auto got = read_out(out, size_t(M * ldo), f32);
      EXPECT_LE(test::rel_frobenius(ref, N, got, ldo, M), f32 ? 1e-5 : 1.0 / 256)
          << test::gemv_config_name(cfg);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = N; n < ldo; ++n)
          ASSERT_TRUE(std::isnan(got[size_t(m * ldo + n)]))
              << "wrote into the row padding at " << m << ", " << n;
    }
  }
}

// silu_mul's formula (elementwise.h) on the host, for I not a multiple of 8 (the silu_mul kernel needs one).
float silu_mul_host(float g, float u) {
  const float a = bf16_to_f32(f32_to_bf16(g / (1.0f + std::exp(-g))));
  return bf16_to_f32(f32_to_bf16(a * u));
}

TEST(CudaGemv, FusedSiluMulEqualsGemvThenSiluMulBitwise) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t I, K;
  };
  for (const Case c : {Case{9728, 2560}, Case{3072, 1024}, Case{40, 136}, Case{37, 200}, Case{1, 8}}) {
    const int64_t M8 = cuda::kGemvMaxM, N = 2 * c.I;
    // Small weights keep g and u around +-2, where SiLU is far from linear and from zero.
    const auto x = random_bf16(size_t(M8 * c.K), 21), w = random_bf16(size_t(N * c.K), 22, -0.08f, 0.08f);
    Buffer dx = to_device(x), dw = to_device(w);
    Buffer gate_up(size_t(M8 * N) * 2, Device::cuda()), act1(size_t(M8 * c.I) * 2, Device::cuda()),
        act2(size_t(M8 * c.I) * 2, Device::cuda());
    for (const GemvConfig cfg : cuda::kGemvConfigs) {
      for (int64_t M = 1; M <= M8; ++M) {
        const std::string what = "I " + std::to_string(c.I) + " K " + std::to_string(c.K) + " M " +
                                 std::to_string(M) + " " + test::gemv_config_name(cfg);
        const auto gu = run_gemv(dx, c.K, dw, c.K, gate_up, N, M, N, c.K, GemvEpilogue::bf16, cfg);
        const auto fused = run_gemv(dx, c.K, dw, c.K, act2, c.I, M, N, c.K, GemvEpilogue::silu_mul, cfg);
        const auto again = run_gemv(dx, c.K, dw, c.K, act2, c.I, M, N, c.K, GemvEpilogue::silu_mul, cfg);
        EXPECT_EQ(fused, again) << what << ": two runs differ";
        const size_t used = size_t(M * c.I) * 2;
        for (size_t i = used; i < fused.size(); ++i)
          if (fused[i] != 0xff) {
            ADD_FAILURE() << what << ": wrote past row M - 1";
            break;
          }
        if (c.I % 8 == 0) {
          poison(act1);
          cuda::silu_mul(gate_up.data(), N, act1.data(), c.I, M, c.I, nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const auto unfused = to_host<uint8_t>(act1, act1.bytes());
          EXPECT_EQ(std::memcmp(fused.data(), unfused.data(), used), 0) << what << ": fused != unfused";
        } else {
          // Host formula: expf may differ from std::exp by an ulp, so allow 1 bf16 ulp.
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < c.I; ++j) {
              bf16_t g, u, got;
              std::memcpy(&g.bits, gu.data() + 2 * (m * N + j), 2);
              std::memcpy(&u.bits, gu.data() + 2 * (m * N + c.I + j), 2);
              std::memcpy(&got.bits, fused.data() + 2 * (m * c.I + j), 2);
              const bf16_t want = f32_to_bf16(silu_mul_host(bf16_to_f32(g), bf16_to_f32(u)));
              EXPECT_LE(test::bf16_ulps(got, want), 1) << what << " at " << m << ", " << j;
            }
        }
      }
    }
  }
}

// PDL (pdl = true: griddepcontrol.wait before any load of x): producer kernel -> GEMV -> fused GEMV, the
// second reading the first's output, as in a decode step; bitwise the same launches without PDL. The producer
// rewrites x (x is the tail of a 32 MB fill) after the buffer held other values, so a read of x before the
// wait would see stale data.
TEST(CudaGemv, PdlChainEqualsPlainLaunches) {
  KILN_REQUIRE_GPU();
  const int64_t M = 5, K1 = 2560, N1 = 1024, I2 = 768, fill_n = int64_t(1) << 24;
  const Device dev = Device::cuda();
  Buffer big(size_t(fill_n) * 2, dev);
  void* x = static_cast<uint16_t*>(big.data()) + (fill_n - M * K1);
  const auto w1 = random_bf16(size_t(N1 * K1), 51, -0.05f, 0.05f), w2 = random_bf16(size_t(2 * I2 * N1), 52);
  Buffer dw1 = to_device(w1), dw2 = to_device(w2), o1(size_t(M * N1) * 2, dev), o2(size_t(M * I2) * 2, dev);
  cudaStream_t st = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const GemvConfig cfg : cuda::kGemvConfigs) {
    std::vector<uint8_t> want1, want2;
    for (const bool pdl : {false, true}) {
      cuda::fill_random_bf16(big.data(), fill_n, 99, 1.0f, 0.0f, st);  // stale values
      KILN_CUDA_CHECK(cudaStreamSynchronize(st));
      poison(o1);
      poison(o2);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      cuda::fill_random_bf16(big.data(), fill_n, 7, 1.0f, 0.0f, st);  // the producer of x
      cuda::gemv(x, K1, dw1.data(), K1, o1.data(), N1, M, N1, K1, GemvEpilogue::bf16, cfg, st, pdl);
      cuda::gemv(o1.data(), N1, dw2.data(), N1, o2.data(), I2, M, 2 * I2, N1, GemvEpilogue::silu_mul, cfg, st,
                 pdl);
      KILN_CUDA_CHECK(cudaStreamSynchronize(st));
      auto got1 = to_host<uint8_t>(o1, o1.bytes()), got2 = to_host<uint8_t>(o2, o2.bytes());
      if (!pdl) {
        want1 = std::move(got1);
        want2 = std::move(got2);
        continue;
      }
      EXPECT_EQ(got1, want1) << test::gemv_config_name(cfg) << ": GEMV after the producer, with PDL";
      EXPECT_EQ(got2, want2) << test::gemv_config_name(cfg) << ": fused GEMV after the GEMV, with PDL";
    }
    // The plain launches are right: the first against fp64, the second fully written (no poison left).
    std::vector<bf16_t> xh(size_t(M * K1));
    KILN_CUDA_CHECK(cudaMemcpy(xh.data(), x, xh.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> got1(size_t(M * N1));
    for (size_t i = 0; i < got1.size(); ++i) {
      bf16_t v;
      std::memcpy(&v.bits, want1.data() + 2 * i, 2);
      got1[i] = bf16_to_f32(v);
    }
    EXPECT_LE(test::rel_error(xh, K1, w1, got1, N1, M, N1, K1), 1.0 / 256) << test::gemv_config_name(cfg);
    for (size_t i = 0; i + 1 < want2.size(); i += 2)
      if (want2[i] == 0xff && want2[i + 1] == 0xff) {
        ADD_FAILURE() << test::gemv_config_name(cfg) << ": fused output element " << i / 2 << " not written";
        break;
      }
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(CudaGemv, BadArgumentsAreErrorsAndLaunchNothing) {
  KILN_REQUIRE_GPU();
  Buffer x(64 * 1024, Device::cuda()), w(64 * 1024, Device::cuda()), out(64 * 1024, Device::cuda());
  KILN_CUDA_CHECK(cudaMemset(x.data(), 0, x.bytes()));
  KILN_CUDA_CHECK(cudaMemset(w.data(), 0, w.bytes()));
  poison(out);
  const GemvConfig ok{4};
  auto call = [&](const void* xp, int64_t ldx, const void* wp, int64_t ldw, void* op, int64_t ldo, int64_t m,
                  int64_t n, int64_t k, GemvEpilogue e, GemvConfig c) {
    return test_support::error_of([&] { cuda::gemv(xp, ldx, wp, ldw, op, ldo, m, n, k, e, c, nullptr); });
  };
  const auto bf = GemvEpilogue::bf16;
  char* xb = static_cast<char*>(x.data());
  char* ob = static_cast<char*>(out.data());
  test_support::expect_contains(call(x.data(), 64, w.data(), 64, out.data(), 64, 9, 64, 64, bf, ok), {"M"});
  test_support::expect_contains(call(x.data(), 64, w.data(), 64, out.data(), 64, -1, 64, 64, bf, ok), {"M"});
  test_support::expect_contains(call(x.data(), 64, w.data(), 64, out.data(), 64, 1, 64, 60, bf, ok), {"K"});
  test_support::expect_contains(call(x.data(), 64, w.data(), 64, out.data(), 64, 1, 0, 64, bf, ok), {"N"});
  test_support::expect_contains(call(xb + 2, 64, w.data(), 64, out.data(), 64, 1, 64, 64, bf, ok),
                                {"aligned"});
  test_support::expect_contains(call(x.data(), 64, w.data(), 64, ob + 8, 64, 1, 64, 64, bf, ok), {"aligned"});
  test_support::expect_contains(call(x.data(), 60, w.data(), 64, out.data(), 64, 1, 64, 64, bf, ok),
                                {"stride"});
  test_support::expect_contains(call(x.data(), 72, w.data(), 68, out.data(), 64, 1, 64, 64, bf, ok),
                                {"stride"});
  test_support::expect_contains(call(x.data(), 64, w.data(), 64, out.data(), 32, 1, 64, 64, bf, ok),
                                {"stride"});
  test_support::expect_contains(
      call(x.data(), 64, w.data(), 64, out.data(), 64, 1, 63, 64, GemvEpilogue::silu_mul, ok), {"even"});
  test_support::expect_contains(
      call(x.data(), 64, w.data(), 64, out.data(), 64, 1, 64, 64, bf, GemvConfig{3}), {"warps"});
  // M = 0 is a no-op (valid otherwise).
  EXPECT_EQ(call(x.data(), 64, w.data(), 64, out.data(), 64, 0, 64, 64, bf, ok), "<no kiln::Error thrown>");
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto after = to_host<uint8_t>(out, out.bytes());
  for (size_t i = 0; i < after.size(); ++i)
    ASSERT_EQ(after[i], 0xff) << "a rejected call or M = 0 wrote the output at byte " << i;
}

TEST(CudaGemv, SupportedPredicate) {
  using cuda::gemv_supported;
  EXPECT_TRUE(gemv_supported(1, 2560, 9728, 9728, 9728, 2560, GemvEpilogue::bf16));
  EXPECT_TRUE(gemv_supported(8, 5, 8, 8, 8, 5, GemvEpilogue::f32));
  EXPECT_FALSE(gemv_supported(9, 64, 64, 64, 64, 64, GemvEpilogue::bf16));
  EXPECT_FALSE(gemv_supported(0, 64, 64, 64, 64, 64, GemvEpilogue::bf16));
  EXPECT_FALSE(gemv_supported(1, 64, 60, 64, 64, 64, GemvEpilogue::bf16));
  EXPECT_FALSE(gemv_supported(1, 63, 64, 64, 64, 64, GemvEpilogue::silu_mul));
  EXPECT_TRUE(gemv_supported(1, 64, 64, 64, 64, 32, GemvEpilogue::silu_mul));
  EXPECT_FALSE(gemv_supported(1, 64, 64, 64, 64, 32, GemvEpilogue::bf16));
}

// Runs without a GPU: the cache line of a GEMV pseudo-tactic survives format -> parse, and damaged or
// foreign lines are refused.
TEST(CudaGemv, TacticLineRoundTrip) {
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv.warps = 8;
  t.us = 12.5f;
  t.describe = "kiln-gemv warps 8 rows 4";
  const cuda::GemmShape s{4, 19456, 2560, cuda::GemmOut::bf16};
  const std::string line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(line, "4 19456 2560 bf16 12.5 gemv 8 0 0 0 0 0 0 0 # kiln-gemv warps 8 rows 4");
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2));
  EXPECT_EQ(s2, s);
  EXPECT_EQ(t2.kind, cuda::GemmKind::gemv);
  EXPECT_EQ(t2.gemv.warps, 8);
  EXPECT_EQ(t2.us, 12.5f);
  EXPECT_EQ(t2.describe, t.describe);
  EXPECT_EQ(cuda::format_tactic_line(s2, t2), line);
  t.gemv.tensor_cores = true;
  t.describe = "kiln-gemv-tc warps 8 rows 8";
  const std::string tc_line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(tc_line, "4 19456 2560 bf16 12.5 gemv 8 1 0 0 0 0 0 0 # kiln-gemv-tc warps 8 rows 8");
  ASSERT_TRUE(cuda::parse_tactic_line(tc_line, s2, t2));
  EXPECT_EQ(t2.gemv, (GemvConfig{8, true}));
  EXPECT_FALSE(t2.gemv_norm_in);
  t.gemv_norm_in = true;  // the residual-norm prologue won: word 2
  const std::string ni_line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(ni_line, "4 19456 2560 bf16 12.5 gemv 8 1 1 0 0 0 0 0 # kiln-gemv-tc warps 8 rows 8");
  ASSERT_TRUE(cuda::parse_tactic_line(ni_line, s2, t2));
  EXPECT_TRUE(t2.gemv_norm_in);
  EXPECT_EQ(cuda::format_tactic_line(s2, t2), ni_line);
  t.gemv_norm_in = false;
  t.gemv.tiles = 4;  // four 8-row tiles: word 3
  t.describe = "kiln-gemv-tc warps 8 rows 32";
  const std::string tiles_line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(tiles_line, "4 19456 2560 bf16 12.5 gemv 8 1 0 4 0 0 0 0 # kiln-gemv-tc warps 8 rows 32");
  ASSERT_TRUE(cuda::parse_tactic_line(tiles_line, s2, t2));
  EXPECT_EQ(t2.gemv, (GemvConfig{8, true, 4}));
  EXPECT_EQ(cuda::format_tactic_line(s2, t2), tiles_line);

  cuda::GemmTactic lt;
  for (int i = 0; i < 8; ++i) lt.algo[i] = 0x1000u + uint64_t(i);
  lt.us = 3.25f;
  lt.describe = "algo 21 tile 17 stages 8 splitK 1";
  const cuda::GemmShape s3{64, 2560, 9728, cuda::GemmOut::f32};
  ASSERT_TRUE(cuda::parse_tactic_line(cuda::format_tactic_line(s3, lt), s2, t2));
  EXPECT_EQ(s2, s3);
  EXPECT_EQ(t2.kind, cuda::GemmKind::cublaslt);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(t2.algo[i], lt.algo[i]);

  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 3 0 0 0 0 0 0 0 # bad warps", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("16 19456 2560 bf16 12.5 gemv 4 0 0 0 0 0 0 0 # M > 8", s2, t2));
  EXPECT_FALSE(
      cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 0 0 1 0 0 0 0 # one tile as 1", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 1 0 3 0 0 0 0 # 3 tiles", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 0 0 2 0 0 0 0 # fma tiles", s2, t2));
  // The prologue runs multi-tile configs (gemv.h: gemv_norm_in_fusable).
  ASSERT_TRUE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 1 1 4 0 0 0 0 # norm-in tiles", s2, t2));
  EXPECT_EQ(t2.gemv, (GemvConfig{4, true, 4}));
  EXPECT_TRUE(t2.gemv_norm_in);
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 0 0 0 0 1 0 0 # junk", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 2 0 0 0 0 0 0 # kernel 2", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 gemv 4 0 2 0 0 0 0 0 # norm-in 2", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2564 bf16 12.5 gemv 4 0 0 0 0 0 0 0 # K % 8", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 xyz 4 0 0 0 0 0 0 0 # kind", s2, t2));
  // A v1 line (no kind field) does not parse as v2.
  EXPECT_FALSE(cuda::parse_tactic_line("4 19456 2560 bf16 12.5 1 2 3 4 5 6 7 8 # v1", s2, t2));
}

TEST(CudaGemv, EngineLoadsDispatchesAndSavesGemvTactic) {
  KILN_REQUIRE_GPU();
  const std::string path = (kiln::test_support::process_scratch_dir("cuda_gemv") / "tactics.txt").string();
  const int64_t N = 2560, K = 4096;
  const cuda::GemmShape s{4, N, K, cuda::GemmOut::bf16};
  const auto x = random_bf16(size_t(3 * K), 31), w = random_bf16(size_t(N * K), 32);
  Buffer dx = to_device(x), dw = to_device(w), o1(size_t(3 * N) * 2, Device::cuda()),
         o2(size_t(3 * N) * 2, Device::cuda());
  cuda::GemmEngine eng;
  test::write_gemv_cache(eng, path, s, GemvConfig{8, true});
  ASSERT_TRUE(eng.load(path));
  ASSERT_EQ(eng.tactics().size(), size_t(1));
  EXPECT_EQ(eng.tactics().begin()->second.kind, cuda::GemmKind::gemv);
  ASSERT_TRUE(eng.gemv_choice(3, N, K, cuda::GemmOut::bf16).has_value());  // bucket 4
  EXPECT_EQ(*eng.gemv_choice(3, N, K, cuda::GemmOut::bf16), (GemvConfig{8, true}));
  EXPECT_FALSE(eng.gemv_choice(3, N, K, cuda::GemmOut::f32).has_value());
  EXPECT_FALSE(eng.gemv_choice(1, N, K, cuda::GemmOut::bf16).has_value());  // bucket 1: not tuned

  // M = 3 (bucket 4) runs the GEMV: bitwise the direct call with the same block size.
  poison(o1);
  eng.run(dx.data(), dw.data(), o1.data(), 3, N, K, cuda::GemmOut::bf16, nullptr);
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  EXPECT_EQ(eng.fallbacks(), 0);
  const auto direct = run_gemv(dx, K, dw, K, o2, N, 3, N, K, GemvEpilogue::bf16, GemvConfig{8, true});
  EXPECT_EQ(to_host<uint8_t>(o1, o1.bytes()), direct);
  EXPECT_LE(test::rel_error(x, K, w, test::widen(to_host<bf16_t>(o1, size_t(3 * N))), N, 3, N, K), 1.0 / 256);

  // Disabled: the same call goes to cuBLASLt's heuristic (the GEMV tactic is no cuBLASLt algorithm).
  eng.set_gemv_enabled(false);
  EXPECT_FALSE(eng.gemv_choice(3, N, K, cuda::GemmOut::bf16).has_value());
  poison(o1);
  eng.run(dx.data(), dw.data(), o1.data(), 3, N, K, cuda::GemmOut::bf16, nullptr);
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  EXPECT_EQ(eng.fallbacks(), 1);
  EXPECT_LE(test::rel_error(x, K, w, test::widen(to_host<bf16_t>(o1, size_t(3 * N))), N, 3, N, K), 1.0 / 256);
  eng.set_gemv_enabled(true);

  // save -> load keeps the GEMV tactic, line for line.
  const std::string path2 = path + ".2";
  eng.save(path2);
  cuda::GemmEngine eng2;
  ASSERT_TRUE(eng2.load(path2));
  ASSERT_EQ(eng2.tactics().size(), size_t(1));
  EXPECT_EQ(cuda::format_tactic_line(eng2.tactics().begin()->first, eng2.tactics().begin()->second),
            cuda::format_tactic_line(eng.tactics().begin()->first, eng.tactics().begin()->second));

  // A v1 file (the format before GEMV tactics) is ignored, not misread.
  std::ofstream(path) << "kiln-gemm-tactics v1\nkey " << eng.key()
                      << "\n4 2560 4096 bf16 1 1 2 3 4 5 6 7 8 # x\n";
  cuda::GemmEngine eng3;
  EXPECT_FALSE(eng3.load(path));
  std::filesystem::remove(path);
  std::filesystem::remove(path2);
}

TEST(CudaGemv, TunerTimesGemvOnlyForSmallBuckets) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  eng.tune({{1, 2560, 2560, cuda::GemmOut::bf16}, {16, 2560, 2560, cuda::GemmOut::bf16}});
  ASSERT_EQ(eng.tactics().size(), size_t(2));
  for (const auto& [s, t] : eng.tactics()) {
    EXPECT_GT(t.us, 0.0f);
    if (s.m_bucket > 8) {
      EXPECT_EQ(t.kind, cuda::GemmKind::cublaslt);
    }
    std::printf("M<=%lld: %s %.2f us\n", (long long)s.m_bucket, t.describe.c_str(), double(t.us));
  }
}

// ops::linear_silu_mul on CUDA: the fused GEMV when the engine's tactic for [M, 2I, K] is the GEMV (bitwise
// ops::linear then ops::silu_and_mul, which then also run the GEMV), else cuBLASLt + silu_mul; both against
// the CPU op within bf16 tolerance.
TEST(CudaGemv, LinearSiluMulOpFusedAndUnfused) {
  KILN_REQUIRE_GPU();
  const int64_t M = 5, I = 1024, K = 768, N = 2 * I;
  const auto x = random_bf16(size_t(M * K), 41), w = random_bf16(size_t(N * K), 42, -0.1f, 0.1f);
  std::vector<bf16_t> gu_cpu(size_t(M * N)), act_cpu(size_t(M * I));
  ops::linear_silu_mul(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {M, K}),
                       Tensor(const_cast<bf16_t*>(w.data()), DType::bf16, {N, K}),
                       Tensor(gu_cpu.data(), DType::bf16, {M, N}),
                       Tensor(act_cpu.data(), DType::bf16, {M, I}));
  const Device dev = Device::cuda();
  Buffer dx = to_device(x), dw = to_device(w), gu(size_t(M * N) * 2, dev), a1(size_t(M * I) * 2, dev),
         a2(size_t(M * I) * 2, dev);
  const Tensor tx(dx.data(), DType::bf16, {M, K}, dev), tw(dw.data(), DType::bf16, {N, K}, dev),
      tgu(gu.data(), DType::bf16, {M, N}, dev), t1(a1.data(), DType::bf16, {M, I}, dev),
      t2(a2.data(), DType::bf16, {M, I}, dev);
  auto close_to_cpu = [&](const Buffer& b) {
    const auto got = to_host<bf16_t>(b, size_t(M * I));
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = double(bf16_to_f32(got[i])) - bf16_to_f32(act_cpu[i]);
      num += d * d;
      den += double(bf16_to_f32(act_cpu[i])) * bf16_to_f32(act_cpu[i]);
    }
    return std::sqrt(num / den);
  };
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const std::string path = (kiln::test_support::process_scratch_dir("cuda_gemv") / "op_tactics.txt").string();
  test::write_gemv_cache(eng, path, {8, N, K, cuda::GemmOut::bf16}, GemvConfig{4, false});
  ASSERT_TRUE(eng.load(path));
  std::filesystem::remove(path);
  const int64_t before = eng.gemv_dispatches();
  poison(a1);
  ops::linear_silu_mul(tx, tw, tgu, t1);  // fused (gemv_dispatches counts run() calls only)
  EXPECT_EQ(eng.gemv_dispatches(), before);
  poison(gu);
  poison(a2);
  ops::linear(tx, tw, tgu);  // run() -> the GEMV
  ops::silu_and_mul(tgu, t2);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(eng.gemv_dispatches(), before + 1);
  EXPECT_EQ(to_host<uint16_t>(a1, size_t(M * I)), to_host<uint16_t>(a2, size_t(M * I))) << "fused != unfused";
  EXPECT_LE(close_to_cpu(a1), 1.0 / 128);

  eng.set_gemv_enabled(false);  // cuBLASLt + silu_mul through gate_up
  poison(a1);
  poison(gu);
  ops::linear_silu_mul(tx, tw, tgu, t1);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  eng.set_gemv_enabled(true);
  EXPECT_LE(close_to_cpu(a1), 1.0 / 128);
  const auto gu_host = to_host<uint16_t>(gu, size_t(M * N));
  EXPECT_NE(gu_host[0], 0xffffu) << "the unfused path goes through gate_up";
}

}  // namespace
}  // namespace kiln
