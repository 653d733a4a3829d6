// The split-K GEMV configs (ops/cuda/gemv.h: GemvConfig::ksplit, kGemvSplitKConfigs): accuracy against an
// fp64 reference for M = 1..8 on the down and O shapes they are offered for and odd ones (K shorter than the
// splits, so some splits own no K block; N not a multiple of 8), two runs bitwise equal, a row's result
// independent of M, nothing written past row M - 1; with PDL and in a replayed CUDA graph bitwise the eager
// launch; the calls it does not take (f32 and silu_mul epilogues, FP8 W, the fused forms) refused before any
// launch; the tactic line's word 7 round trip; and the engine dispatching a split-K tactic. Every output is
// poisoned (all bits set: NaN) before each run.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "gemm_reference.h"
#include "gemv_test_util.h"
#include "kiln/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using cuda::GemvConfig;
using cuda::GemvEpilogue;
using test::poison;
using test::random_bf16;
using test::to_device;
using test::to_host;

std::string name(GemvConfig c) {
  return test::gemv_config_name(c) + " split " + std::to_string(c.ksplit);
}

// The GEMV into a poisoned buffer; its raw bytes (rows * ldo bf16).
std::vector<uint8_t> run(const Buffer& x, int64_t ldx, const Buffer& w, const Buffer& out, int64_t ldo,
                         int64_t m, int64_t n, int64_t k, GemvConfig cfg, cudaStream_t st = nullptr,
                         bool pdl = false) {
  poison(out);
  cuda::gemv(x.data(), ldx, w.data(), k, out.data(), ldo, m, n, k, GemvEpilogue::bf16, cfg, st, pdl);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<uint8_t>(out, out.bytes());
}

struct Shape {
  const char* name;
  int64_t n, k;
};
// 4B down and O, 8B down, 30B-A3B O, 0.6B down; odd: N not a multiple of 8, K of 5 32-element blocks (splits
// 8 leave 3 of them empty), K not a multiple of 32.
const Shape kShapes[] = {{"4B down", 2560, 9728},      {"4B o", 2560, 4096},      {"8B down", 4096, 12288},
                         {"30B o", 2048, 4096},        {"0.6B down", 1024, 3072}, {"odd 37x160", 37, 160},
                         {"odd 1001x1000", 1001, 1000}};

TEST(CudaGemvSplitK, MatchesFp64ReferenceDeterministicRowIndependent) {
  KILN_REQUIRE_GPU();
  if (!cuda::gemv_split_k_available()) GTEST_SKIP() << "split-K runs on sm_90 only";
  for (const Shape& s : kShapes) {
    const int64_t M8 = cuda::kGemvMaxM;
    const auto x = random_bf16(size_t(M8 * s.k), 41), w = random_bf16(size_t(s.n * s.k), 42);
    const auto ref = test::gemm_fp64(x, s.k, w, s.k, M8, s.n, s.k);
    Buffer dx = to_device(x), dw = to_device(w), out(size_t(M8 * s.n) * 2, Device::cuda());
    for (const GemvConfig cfg : cuda::kGemvSplitKConfigs) {
      const auto full = run(dx, s.k, dw, out, s.n, M8, s.n, s.k, cfg);
      for (int64_t m = M8; m >= 1; --m) {
        const std::string what = std::string(s.name) + " M " + std::to_string(m) + " " + name(cfg);
        const auto a = run(dx, s.k, dw, out, s.n, m, s.n, s.k, cfg);
        EXPECT_EQ(a, run(dx, s.k, dw, out, s.n, m, s.n, s.k, cfg)) << what << ": two runs differ";
        const size_t used = size_t(m * s.n) * 2;
        EXPECT_EQ(std::memcmp(a.data(), full.data(), used), 0) << what << ": rows depend on M";
        for (size_t i = used; i < a.size(); ++i)
          if (a[i] != 0xff) {
            ADD_FAILURE() << what << ": wrote past row M - 1 at byte " << i;
            break;
          }
        std::vector<float> got(size_t(m * s.n));
        for (size_t i = 0; i < got.size(); ++i) {
          bf16_t v;
          std::memcpy(&v.bits, a.data() + 2 * i, 2);
          got[i] = bf16_to_f32(v);
        }
        const double err = test::rel_frobenius(ref, s.n, got, s.n, m);
        EXPECT_LE(err, 1.0 / 256) << what;  // NaN (an unwritten element) fails too
        EXPECT_GT(err, 0.0) << what << ": bf16 output must show its rounding";
      }
    }
  }
}

// A producer kernel writes x, then the split-K GEMV reads it, with PDL, eagerly and in a graph replayed with
// a new x: bitwise the plain launch on the same x.
TEST(CudaGemvSplitK, PdlAndGraphReplayEqualPlainLaunch) {
  KILN_REQUIRE_GPU();
  if (!cuda::gemv_split_k_available()) GTEST_SKIP() << "split-K runs on sm_90 only";
  const int64_t M = 4, N = 2560, K = 9728;
  Buffer x(size_t(M * K) * 2, Device::cuda()), out(size_t(M * N) * 2, Device::cuda()),
      w = to_device(random_bf16(size_t(N * K), 43));
  cudaStream_t st = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const GemvConfig cfg : cuda::kGemvSplitKConfigs) {
    auto chain = [&](uint64_t seed, bool pdl) {
      cuda::fill_random_bf16(x.data(), M * K, seed, 1.0f, 0.0f, st);
      cuda::gemv(x.data(), K, w.data(), K, out.data(), N, M, N, K, GemvEpilogue::bf16, cfg, st, pdl);
    };
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    chain(7, true);
    KILN_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (const uint64_t seed : {7u, 8u}) {
      poison(out);
      chain(seed, false);
      KILN_CUDA_CHECK(cudaStreamSynchronize(st));
      const auto want = to_host<uint8_t>(out, out.bytes());
      for (uint8_t b : want) ASSERT_NE(b, 0xff) << name(cfg) << ": unwritten output";
      poison(out);
      chain(seed, true);
      KILN_CUDA_CHECK(cudaStreamSynchronize(st));
      EXPECT_EQ(to_host<uint8_t>(out, out.bytes()), want) << name(cfg) << ": PDL launch differs";
      if (seed == 7) {
        poison(out);
        KILN_CUDA_CHECK(cudaGraphLaunch(exec, st));
        KILN_CUDA_CHECK(cudaStreamSynchronize(st));
        EXPECT_EQ(to_host<uint8_t>(out, out.bytes()), want) << name(cfg) << ": graph replay differs";
      }
    }
    KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
    KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
}

// What split-K does not take is refused before any launch (the output stays poisoned), and gemv_takes says
// so: the f32 and silu_mul epilogues, an FP8 W, the fused forms.
TEST(CudaGemvSplitK, RefusesWhatItDoesNotTake) {
  KILN_REQUIRE_GPU();
  const int64_t M = 2, N = 64, K = 256;
  Buffer x = to_device(random_bf16(size_t(M * K), 44)), w = to_device(random_bf16(size_t(N * K), 45)),
         out(size_t(M * N) * 4, Device::cuda()), scales(64, Device::cuda());
  const GemvConfig cfg{8, true, 1, 0, 4};
  ASSERT_TRUE(cuda::gemv_known_config(cfg));
  EXPECT_FALSE(cuda::gemv_fusable(cfg));
  EXPECT_FALSE(cuda::gemv_norm_in_fusable(cfg));
  const cuda::GemvWeight fp8{w.data(), K, static_cast<const float*>(scales.data())};
  EXPECT_EQ(cuda::gemv_takes(cfg, x.data(), K, cuda::GemvWeight{w.data(), K}, out.data(), N, M, N, K,
                             GemvEpilogue::bf16),
            cuda::gemv_split_k_available());
  EXPECT_FALSE(cuda::gemv_takes(cfg, x.data(), K, cuda::GemvWeight{w.data(), K}, out.data(), N, M, N, K,
                                GemvEpilogue::f32));
  EXPECT_FALSE(cuda::gemv_takes(cfg, x.data(), K, cuda::GemvWeight{w.data(), K}, out.data(), N / 2, M, N, K,
                                GemvEpilogue::silu_mul));
  EXPECT_FALSE(cuda::gemv_takes(cfg, x.data(), K, fp8, out.data(), N, M, N, K, GemvEpilogue::bf16));
  poison(out);
  EXPECT_THROW(cuda::gemv(x.data(), K, w.data(), K, out.data(), N, M, N, K, GemvEpilogue::f32, cfg, nullptr),
               Error);
  EXPECT_THROW(
      cuda::gemv(x.data(), K, w.data(), K, out.data(), N / 2, M, N, K, GemvEpilogue::silu_mul, cfg, nullptr),
      Error);
  EXPECT_THROW(cuda::gemv(x.data(), K, fp8, out.data(), N, M, N, K, GemvEpilogue::bf16, cfg, nullptr), Error);
  EXPECT_THROW(cuda::gemv_norm_in(x.data(), K, out.data(), K, w.data(), 1e-6f, w.data(), K, out.data(), N, M,
                                  N, K, GemvEpilogue::bf16, cfg, nullptr),
               Error);
  EXPECT_THROW(cuda::gemv(x.data(), K, w.data(), K, out.data(), N, M, N, K, GemvEpilogue::bf16,
                          GemvConfig{8, true, 1, 0, 3}, nullptr),
               Error);  // 3 splits: no such config
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  for (uint8_t b : to_host<uint8_t>(out, out.bytes())) ASSERT_EQ(b, 0xff) << "a refused call wrote";
}

// Cache word 7 holds the splits (0: none, as older caches read); a split-K tactic for an FP8 weight or an f32
// output, or 1 or 3 splits, is a damaged line.
TEST(CudaGemvSplitK, TacticLineRoundTrip) {
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv = GemvConfig{8, true, 1, 0, 4};
  t.us = 12.5f;
  t.describe = "kiln-gemv-tc warps 8 rows 8 splitk 4";
  const cuda::GemmShape s{4, 2560, 9728, cuda::GemmOut::bf16};
  const std::string line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(line, "4 2560 9728 bf16 12.5 gemv 8 1 0 0 0 0 0 4 # kiln-gemv-tc warps 8 rows 8 splitk 4");
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2));
  EXPECT_EQ(t2.gemv, t.gemv);
  EXPECT_EQ(cuda::format_tactic_line(s2, t2), line);
  ASSERT_TRUE(cuda::parse_tactic_line("4 2560 9728 bf16 12.5 gemv 8 1 0 0 0 0 0 0 # none", s2, t2));
  EXPECT_EQ(t2.gemv.ksplit, 1);
  for (const char* bad : {
           "4 2560 9728 bf16 12.5 gemv 8 1 0 0 0 0 0 1 # one split written as 1",
           "4 2560 9728 bf16 12.5 gemv 8 1 0 0 0 0 0 3 # 3 splits: no such config",
           "4 2560 9728 bf16 12.5 gemv 8 0 0 0 0 0 0 4 # the FMA kernel",
           "4 2560 9728 bf16 12.5 gemv 8 1 0 2 0 0 0 4 # two tiles",
           "4 2560 9728 f32 12.5 gemv 8 1 0 0 0 0 0 4 # an f32 output",
           "4 2560 9728 bf16:e4m3 12.5 gemv 8 1 0 0 0 0 0 4 # an FP8 weight",
           "4 2560 9728 bf16 12.5 gemv 8 1 1 0 0 0 0 4 # the residual-norm prologue",
       })
    EXPECT_FALSE(cuda::parse_tactic_line(bad, s2, t2)) << bad;
}

// The engine runs a cached split-K tactic: bitwise the direct call, counted as a GEMV dispatch.
TEST(CudaGemvSplitK, EngineDispatchesSplitKTactic) {
  KILN_REQUIRE_GPU();
  if (!cuda::gemv_split_k_available()) GTEST_SKIP() << "split-K runs on sm_90 only";
  const std::string path =
      (kiln::test_support::process_scratch_dir("cuda_gemv_split_k") / "tactics.txt").string();
  const int64_t M = 3, N = 2560, K = 9728;
  const GemvConfig cfg{16, true, 1, 0, 2};
  const auto x = random_bf16(size_t(M * K), 46), w = random_bf16(size_t(N * K), 47);
  Buffer dx = to_device(x), dw = to_device(w), o1(size_t(M * N) * 2, Device::cuda()),
         o2(size_t(M * N) * 2, Device::cuda());
  cuda::GemmEngine eng;
  test::write_gemv_cache(eng, path, {4, N, K, cuda::GemmOut::bf16}, cfg);
  ASSERT_TRUE(eng.load(path));
  ASSERT_EQ(eng.gemv_choice(M, N, K, cuda::GemmOut::bf16), cfg);
  EXPECT_FALSE(eng.gemv_norm_in_choice(M, N, K).has_value());  // no prologue form
  poison(o1);
  eng.run(dx.data(), dw.data(), o1.data(), M, N, K, cuda::GemmOut::bf16, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  EXPECT_EQ(to_host<uint8_t>(o1, o1.bytes()), run(dx, K, dw, o2, N, M, N, K, cfg));
  EXPECT_LE(test::rel_error(x, K, w, test::widen(to_host<bf16_t>(o1, size_t(M * N))), N, M, N, K), 1.0 / 256);
  // Switched off (KILN_GEMV_SPLIT_K=0): the cached split-K tactic is ignored, cuBLASLt's heuristic runs.
  eng.set_gemv_split_k(false);
  EXPECT_FALSE(eng.gemv_choice(M, N, K, cuda::GemmOut::bf16).has_value());
  poison(o1);
  eng.run(dx.data(), dw.data(), o1.data(), M, N, K, cuda::GemmOut::bf16, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  EXPECT_EQ(eng.fallbacks(), 1);
  EXPECT_LE(test::rel_error(x, K, w, test::widen(to_host<bf16_t>(o1, size_t(M * N))), N, M, N, K), 1.0 / 256);
}

}  // namespace
}  // namespace kiln
