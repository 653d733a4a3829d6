// GemmEngine::set_tactic_rows (verify steps of speculative decoding): calls of M <= 8 take the tactic the
// plain decode step of M = rows takes, so a verify step's rows are bitwise the plain step's. Checked: the
// GEMV configuration chosen with and without it (a tactic file with different configs at M buckets 1 and 4),
// the switch off, M > 8 unaffected; a 4-row call under it bitwise equal to four 1-row calls; an untuned shape
// (as the LM head above M = 1) takes cuBLASLt's heuristic algorithm of the plain M, and its rows match the
// plain call's.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/test_support.h"
#include "ops/cuda/gemm.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::random_bf16;
using test::to_device;
using test::to_host;

constexpr int64_t kN = 1024, kK = 512;

// An engine whose tactics are: M bucket 1 -> GEMV c1, M bucket 4 -> GEMV c4, for [N, K] bf16 out.
void load_tactics(cuda::GemmEngine& eng, cuda::GemvConfig c1, cuda::GemvConfig c4) {
  const std::string path =
      (test_support::process_scratch_dir("cuda_gemm_verify_tactics") / "tactics.txt").string();
  std::ofstream out(path);
  out << "kiln-gemm-tactics v3\nkey " << eng.key() << "\n";
  for (const auto& [bucket, cfg] : {std::pair{int64_t(1), c1}, std::pair{int64_t(4), c4}}) {
    cuda::GemmTactic t;
    t.kind = cuda::GemmKind::gemv;
    t.gemv = cfg;
    t.us = 1.0f;
    t.describe = "kiln-gemv (test)";
    out << cuda::format_tactic_line({bucket, kN, kK, cuda::GemmOut::bf16}, t) << "\n";
  }
  out.close();
  ASSERT_TRUE(eng.load(path));
}

TEST(CudaGemmVerifyTactics, CallsTakeThePlainStepsGemvConfig) {
  KILN_REQUIRE_GPU();
  const cuda::GemvConfig c1{2, false, 1}, c4{4, true, 2};
  cuda::GemmEngine eng;
  eng.set_gemv_enabled(true);
  eng.set_verify_tactics(true);
  load_tactics(eng, c1, c4);
  EXPECT_EQ(eng.gemv_choice(1, kN, kK, cuda::GemmOut::bf16), c1);
  EXPECT_EQ(eng.gemv_choice(4, kN, kK, cuda::GemmOut::bf16), c4);
  eng.set_tactic_rows(1);
  EXPECT_EQ(eng.gemv_choice(4, kN, kK, cuda::GemmOut::bf16), c1) << "a verify call of 4 rows, plain M = 1";
  EXPECT_EQ(eng.gemv_choice(8, kN, kK, cuda::GemmOut::bf16), c1);
  EXPECT_FALSE(eng.gemv_choice(16, kN, kK, cuda::GemmOut::bf16)) << "M > 8 has no GEMV";
  eng.set_verify_tactics(false);
  EXPECT_EQ(eng.gemv_choice(4, kN, kK, cuda::GemmOut::bf16), c4) << "switched off: the call's own bucket";
  eng.set_verify_tactics(true);
  eng.set_tactic_rows(0);
  EXPECT_EQ(eng.gemv_choice(4, kN, kK, cuda::GemmOut::bf16), c4);

  // Four rows under tactic rows 1 equal the four rows run one at a time (the plain steps), bit for bit.
  const int64_t M = 4;
  const auto x = random_bf16(size_t(M * kK), 11), w = random_bf16(size_t(kN * kK), 12);
  Buffer dx = to_device(x), dw = to_device(w), o4(size_t(M * kN) * 2, Device::cuda()),
         o1(size_t(M * kN) * 2, Device::cuda()), own(size_t(M * kN) * 2, Device::cuda());
  for (int64_t m = 0; m < M; ++m)
    eng.run(static_cast<const uint16_t*>(dx.data()) + m * kK, kK, dw.data(), kK,
            static_cast<uint16_t*>(o1.data()) + m * kN, kN, 1, kN, kK, cuda::GemmOut::bf16, nullptr);
  eng.run(dx.data(), kK, dw.data(), kK, own.data(), kN, M, kN, kK, cuda::GemmOut::bf16, nullptr);
  eng.set_tactic_rows(1);
  eng.run(dx.data(), kK, dw.data(), kK, o4.data(), kN, M, kN, kK, cuda::GemmOut::bf16, nullptr);
  eng.set_tactic_rows(0);
  const auto a = to_host<uint16_t>(o4, size_t(M * kN)), b = to_host<uint16_t>(o1, size_t(M * kN)),
             c = to_host<uint16_t>(own, size_t(M * kN));
  size_t diff = 0, diff_own = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i], diff_own += c[i] != b[i];
  EXPECT_EQ(diff, 0u) << "the 4-row call under the plain step's config differs from the 1-row calls";
  std::printf(
      "4 rows with their own bucket's config (%s) differ from the 1-row calls in %zu of %zu outputs\n",
      c4.tensor_cores ? "tensor cores" : "FMA", diff_own, c.size());
}

// An untuned shape (the LM head's f32 rows above M = 1): the verify call of 8 rows under tactic rows 2 runs
// the algorithm cuBLASLt's heuristic gives M = 2, whose rows match the plain M = 2 call's.
TEST(CudaGemmVerifyTactics, UntunedShapeTakesThePlainMsHeuristic) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  eng.set_verify_tactics(true);
  const int64_t N = 4096, K = 256, M = 8, plain = 2;
  const auto x = random_bf16(size_t(M * K), 13), w = random_bf16(size_t(N * K), 14);
  Buffer dx = to_device(x), dw = to_device(w), ov(size_t(M * N) * 4, Device::cuda()),
         op(size_t(M * N) * 4, Device::cuda());
  for (int64_t m = 0; m < M; m += plain)
    eng.run(static_cast<const uint16_t*>(dx.data()) + m * K, K, dw.data(), K,
            static_cast<float*>(op.data()) + m * N, N, plain, N, K, cuda::GemmOut::f32, nullptr);
  eng.set_tactic_rows(plain);
  eng.run(dx.data(), K, dw.data(), K, ov.data(), N, M, N, K, cuda::GemmOut::f32, nullptr);
  eng.set_tactic_rows(0);
  const auto a = to_host<uint32_t>(ov, size_t(M * N)), b = to_host<uint32_t>(op, size_t(M * N));
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0u) << "of " << a.size() << " f32 outputs";
}

}  // namespace
}  // namespace kiln
