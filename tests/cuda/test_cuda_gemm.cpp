// cuBLASLt GEMM: accuracy against an fp64 reference (relative Frobenius error), strided operands, f32
// output, and the tactic cache (tune -> save -> load round trip, a foreign key ignored, AlgoCheck fallback).
// The GEMV pseudo-tactic's own tests (cache lines, dispatch) are in test_cuda_gemv.cpp.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <cuda_runtime_api.h>

#include "common/test_support.h"
#include "gemm_reference.h"
#include "ops/cuda/gemm.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::random_bf16;
using test::rel_error;
using test::to_device;
using test::to_host;
using test::widen;

TEST(CudaGemm, MatchesFp64ReferenceAcrossShapes) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape s : {Shape{1, 256, 512}, Shape{7, 136, 72}, Shape{64, 2560, 256}, Shape{300, 384, 1024}}) {
    const auto x = random_bf16(size_t(s.M * s.K), 1), w = random_bf16(size_t(s.N * s.K), 2);
    Buffer dx = to_device(x), dw = to_device(w);
    Buffer o16(size_t(s.M * s.N) * 2, Device::cuda()), o32(size_t(s.M * s.N) * 4, Device::cuda());
    eng.run(dx.data(), dw.data(), o16.data(), s.M, s.N, s.K, cuda::GemmOut::bf16, nullptr);
    eng.run(dx.data(), dw.data(), o32.data(), s.M, s.N, s.K, cuda::GemmOut::f32, nullptr);
    const double e16 =
        rel_error(x, s.K, w, widen(to_host<bf16_t>(o16, size_t(s.M * s.N))), s.N, s.M, s.N, s.K);
    const double e32 = rel_error(x, s.K, w, to_host<float>(o32, size_t(s.M * s.N)), s.N, s.M, s.N, s.K);
    EXPECT_LE(e16, 1.0 / 256) << s.M << "x" << s.N << "x" << s.K;
    EXPECT_GT(e16, 0.0) << "bf16 output must show its rounding";
    EXPECT_LE(e32, 1e-5) << s.M << "x" << s.N << "x" << s.K;
  }
}

TEST(CudaGemm, RowStridedOperands) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  const int64_t M = 5, N = 64, K = 128, ldx = 160, ldo = 80;
  const auto x = random_bf16(size_t(M * ldx), 3), w = random_bf16(size_t(N * K), 4);
  Buffer dx = to_device(x), dw = to_device(w);
  std::vector<float> sentinel(size_t(M * ldo), -7.0f);
  Buffer o = to_device(sentinel);
  eng.run(dx.data(), ldx, dw.data(), K, o.data(), ldo, M, N, K, cuda::GemmOut::f32, nullptr);
  const auto got = to_host<float>(o, size_t(M * ldo));
  EXPECT_LE(rel_error(x, ldx, w, got, ldo, M, N, K), 1e-5);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < ldo; ++n) EXPECT_EQ(got[size_t(m * ldo + n)], -7.0f) << "wrote past N";
}

TEST(CudaGemm, BadArgumentsAreErrors) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  Buffer b(4096, Device::cuda());
  EXPECT_THROW(eng.run(b.data(), b.data(), b.data(), 0, 8, 8, cuda::GemmOut::bf16, nullptr), Error);
  // Any N and K run (test_cuda_gemm_any_shape.cpp); strides shorter than a row do not.
  EXPECT_THROW(eng.run(b.data(), 8, b.data(), 12, b.data(), 8, 1, 8, 12, cuda::GemmOut::bf16, nullptr),
               Error);
  EXPECT_THROW(eng.run(b.data(), 16, b.data(), 16, b.data(), 7, 1, 8, 16, cuda::GemmOut::bf16, nullptr),
               Error);
}

TEST(CudaGemm, BucketsArePowersOfTwo) {
  EXPECT_EQ(cuda::gemm_m_bucket(1), 1);
  EXPECT_EQ(cuda::gemm_m_bucket(3), 4);
  EXPECT_EQ(cuda::gemm_m_bucket(64), 64);
  EXPECT_EQ(cuda::gemm_m_bucket(65), 128);
  EXPECT_EQ(cuda::gemm_m_bucket(100000), 16384);
  const auto shapes = cuda::qwen3_gemm_shapes(1024, 2048, 1024, 3072, 151936, 8, 2);
  EXPECT_EQ(shapes.size(), size_t(4 * 4 + 2));  // buckets 1, 2, 4, 8; LM head for 1 and 2
  // No logit rows (an embedding model): no LM head shape.
  EXPECT_EQ(cuda::qwen3_gemm_shapes(1024, 2048, 1024, 3072, 151669, 8, 0).size(), size_t(4 * 4));
}

TEST(CudaGemm, TuneSaveLoadRoundTrip) {
  KILN_REQUIRE_GPU();
  const std::string path = (kiln::test_support::process_scratch_dir("cuda_gemm") / "tactics.txt").string();
  std::filesystem::remove(path);
  const std::vector<cuda::GemmShape> shapes = {{1, 1024, 512, cuda::GemmOut::bf16},
                                               {16, 1024, 512, cuda::GemmOut::bf16},
                                               {4, 4096, 256, cuda::GemmOut::f32}};
  const auto x = random_bf16(16 * 512, 5), w = random_bf16(4096 * 512, 6);
  Buffer dx = to_device(x), dw = to_device(w), o1(16 * 4096 * 4, Device::cuda()),
         o2(16 * 4096 * 4, Device::cuda());
  {
    cuda::GemmEngine eng;
    EXPECT_FALSE(eng.load(path)) << "no cache yet";
    eng.tune(shapes);
    ASSERT_EQ(eng.tactics().size(), shapes.size());
    for (const auto& [s, t] : eng.tactics()) {
      EXPECT_GT(t.us, 0.0f);
      // Buckets <= 8 may have chosen kiln's GEMV; larger ones are always cuBLASLt.
      if (t.kind == cuda::GemmKind::gemv) {
        EXPECT_LE(s.m_bucket, 8);
        EXPECT_EQ(t.describe.rfind("kiln-gemv", 0), 0u) << t.describe;
      } else {
        EXPECT_NE(t.describe.find("splitK"), std::string::npos);
      }
    }
    eng.save(path);
    eng.run(dx.data(), dw.data(), o1.data(), 13, 1024, 512, cuda::GemmOut::bf16, nullptr);  // bucket 16
    EXPECT_EQ(eng.fallbacks(), 0) << "the tuned tactic should pass AlgoCheck for M 13";
  }
  {
    cuda::GemmEngine eng;
    ASSERT_TRUE(eng.load(path));
    ASSERT_EQ(eng.tactics().size(), shapes.size());
    eng.run(dx.data(), dw.data(), o2.data(), 13, 1024, 512, cuda::GemmOut::bf16, nullptr);
    EXPECT_EQ(eng.fallbacks(), 0);
    // The same tactic on the same data: bitwise the same result.
    const auto a = to_host<uint16_t>(o1, 13 * 1024), b = to_host<uint16_t>(o2, 13 * 1024);
    EXPECT_EQ(a, b);
    // A shape never tuned falls back to the heuristic.
    eng.run(dx.data(), dw.data(), o2.data(), 3, 512, 512, cuda::GemmOut::bf16, nullptr);
    EXPECT_EQ(eng.fallbacks(), 1);
  }
  {
    // A cache keyed for another GPU / library version is ignored.
    std::ifstream in(path);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto pos = all.find("key ");
    all.replace(pos, 4, "key OtherGPU ");
    std::ofstream(path) << all;
    cuda::GemmEngine eng;
    EXPECT_FALSE(eng.load(path));
    EXPECT_TRUE(eng.tactics().empty());
  }
  {
    // A damaged cuBLASLt tactic (garbage algo words) fails AlgoCheck and the heuristic runs instead.
    cuda::GemmEngine good;
    good.tune({shapes[0]});
    good.save(path);
    std::ifstream in(path);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto line = all.find("\n1 1024 512 bf16");
    ASSERT_NE(line, std::string::npos);
    const auto us_end = all.find(' ', line + 17);  // after the time field
    const auto hash = all.find(" #", us_end);
    std::string garbage = " lt";  // whichever kind won, the line is now a cuBLASLt one
    for (int i = 0; i < 8; ++i) garbage += " ffffffffffffffff";
    all.replace(us_end, hash - us_end, garbage);  // the kind and all eight algo words
    std::ofstream(path) << all;
    cuda::GemmEngine eng;
    ASSERT_TRUE(eng.load(path));
    eng.run(dx.data(), dw.data(), o2.data(), 1, 1024, 512, cuda::GemmOut::bf16, nullptr);
    EXPECT_EQ(eng.fallbacks(), 1);
    const auto got = widen(to_host<bf16_t>(o2, 1024));
    EXPECT_LE(rel_error(x, 512, w, got, 1024, 1, 1024, 512), 1.0 / 256);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
