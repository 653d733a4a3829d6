// GEMMs of any N and K on the GPU (issue 41 point 7: Qwen3-Embedding-0.6B's vocabulary of 151,669 stopped
// `kiln serve --device cuda`). Every shape against the fp64 reference of the CPU (gemm_reference.h) with
// gemm.h's bounds (relative Frobenius error <= 2^-8 bf16, <= 1e-5 f32), nothing written outside [M, N], and
// the dispatch each shape must take: K not a multiple of 8 -> the any-shape kernel; an unaligned output row
// stride -> cuBLASLt through the staging rows; the tuner takes odd N (at the aligned stride) and skips odd K.
// The ops layer (ops::linear, ops::lm_head) with odd shapes against the CPU ops. Skips where no GPU exists.
#include <cmath>
#include <string>
#include <vector>

#include "gemm_reference.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/gemm.h"
#include "ops/linear.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::random_bf16;
using test::to_device;
using test::to_host;
using test::widen;

constexpr float kSentinel = -7.0f;

struct Case {
  int64_t M, N, K, ldo;  // ldo = 0: N (contiguous rows)
};

// Runs one case in both output types; checks accuracy and that padding columns keep their sentinel.
void check_case(cuda::GemmEngine& eng, const Case& c, uint32_t seed) {
  const int64_t ldo = c.ldo ? c.ldo : c.N;
  const auto x = random_bf16(size_t(c.M * c.K), seed), w = random_bf16(size_t(c.N * c.K), seed + 1);
  Buffer dx = to_device(x), dw = to_device(w);
  const std::vector<double> ref = test::gemm_fp64(x, c.K, w, c.K, c.M, c.N, c.K);
  for (const cuda::GemmOut out : {cuda::GemmOut::bf16, cuda::GemmOut::f32}) {
    const bool f32 = out == cuda::GemmOut::f32;
    std::vector<float> got;
    if (f32) {
      Buffer o = to_device(std::vector<float>(size_t(c.M * ldo), kSentinel));
      eng.run(dx.data(), c.K, dw.data(), c.K, o.data(), ldo, c.M, c.N, c.K, out, nullptr);
      got = to_host<float>(o, size_t(c.M * ldo));
    } else {
      Buffer o = to_device(std::vector<bf16_t>(size_t(c.M * ldo), f32_to_bf16(kSentinel)));
      eng.run(dx.data(), c.K, dw.data(), c.K, o.data(), ldo, c.M, c.N, c.K, out, nullptr);
      got = widen(to_host<bf16_t>(o, size_t(c.M * ldo)));
    }
    const std::string what = "M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " K " +
                             std::to_string(c.K) + " ldo " + std::to_string(ldo) + (f32 ? " f32" : " bf16");
    EXPECT_LE(test::rel_frobenius(ref, c.N, got, ldo, c.M), f32 ? 1e-5 : 1.0 / 256) << what;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = c.N; n < ldo; ++n)
        ASSERT_EQ(got[size_t(m * ldo + n)], kSentinel) << what << " wrote past N";
  }
}

TEST(CudaGemmAnyShape, OddNAndKMatchTheCpuReference) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;  // no tactics: cuBLASLt's heuristic, the staging rows and the any-shape kernel
  uint32_t seed = 100;
  for (int64_t M : {1, 3, 17})
    for (int64_t N : {1, 7, 9, 24, 1669})
      for (int64_t K : {1, 7, 9, 24, 72}) check_case(eng, {M, N, K, 0}, seed += 2);
  // Larger M (cuBLASLt tiles and the any-shape kernel's 64-row blocks), strided outputs, a long odd K.
  for (const Case c : {Case{70, 151, 40, 0}, Case{130, 33, 1031, 0}, Case{5, 301, 64, 307}, Case{9, 9, 9, 16},
                       Case{2, 4099, 1024, 4099}})
    check_case(eng, c, seed += 2);
}

TEST(CudaGemmAnyShape, EachShapeTakesItsPath) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  eng.set_gemv_enabled(false);
  const auto x = random_bf16(64 * 1032, 1), w = random_bf16(1669 * 1032, 2);
  Buffer dx = to_device(x), dw = to_device(w), o(64 * 1672 * 4, Device::cuda());
  // Aligned: cuBLASLt on the caller's rows, as before.
  eng.run(dx.data(), 1024, dw.data(), 1024, o.data(), 1672, 16, 1669, 1024, cuda::GemmOut::f32, nullptr);
  EXPECT_EQ(eng.any_shape_dispatches(), 0);
  EXPECT_EQ(eng.staged_dispatches(), 0);
  // The logits layout of an odd vocabulary: rows of 1669 f32, not 16-byte strided.
  eng.run(dx.data(), 1024, dw.data(), 1024, o.data(), 1669, 16, 1669, 1024, cuda::GemmOut::f32, nullptr);
  EXPECT_EQ(eng.staged_dispatches(), 1);
  EXPECT_EQ(eng.any_shape_dispatches(), 0);
  // K (and so the row strides) not a multiple of 8.
  eng.run(dx.data(), 1031, dw.data(), 1031, o.data(), 1669, 16, 1669, 1031, cuda::GemmOut::bf16, nullptr);
  EXPECT_EQ(eng.any_shape_dispatches(), 1);
  // An input 2 bytes off 16-byte alignment.
  eng.run(static_cast<const char*>(dx.data()) + 2, 1024, dw.data(), 1024, o.data(), 1672, 16, 1669, 1024,
          cuda::GemmOut::f32, nullptr);
  EXPECT_EQ(eng.any_shape_dispatches(), 2);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaGemmAnyShape, TunerTakesOddNAndSkipsOddK) {
  KILN_REQUIRE_GPU();
  cuda::GemmEngine eng;
  const std::vector<cuda::GemmShape> shapes = {{1, 1669, 256, cuda::GemmOut::f32},
                                               {16, 1669, 256, cuda::GemmOut::f32},
                                               {4, 151669, 64, cuda::GemmOut::f32},
                                               {1, 33, 7, cuda::GemmOut::bf16}};
  ASSERT_NO_THROW(eng.tune(shapes));
  EXPECT_EQ(eng.tactics().size(), 3u);
  EXPECT_EQ(eng.tactics().count(shapes[3]), 0u) << "K 7: nothing to tune, the any-shape kernel runs it";
  // The tuned tactics run at the logits' own (unaligned) row stride and stay accurate.
  for (const Case c :
       {Case{1, 1669, 256, 0}, Case{13, 1669, 256, 0}, Case{4, 151669, 64, 0}, Case{1, 33, 7, 0}})
    check_case(eng, c, 900 + uint32_t(c.M));
  // An embedding model tunes no LM head: max_logit_rows 0 leaves the vocabulary shape out.
  for (const auto& s : cuda::qwen3_gemm_shapes(1024, 2048, 1024, 3072, 151669, 8, 0))
    EXPECT_NE(s.out, cuda::GemmOut::f32) << "N " << s.n;
}

// The ops layer on CUDA tensors, against the CPU ops: linear with odd N and K, and the LM head of an
// odd vocabulary (151,669 rows, Qwen3-Embedding-0.6B's; a real LM with it must run too).
TEST(CudaGemmAnyShape, LinearAndLmHeadOfOddShapesMatchTheCpuOps) {
  KILN_REQUIRE_GPU();
  const auto tensor = [](Buffer& b, DType dt, std::vector<int64_t> shape) {
    return Tensor(b.data(), dt, {shape[0], shape[1]}, b.device());
  };
  {
    const int64_t M = 6, N = 13, K = 9;
    auto x = random_bf16(size_t(M * K), 31), w = random_bf16(size_t(N * K), 32);
    std::vector<bf16_t> want(size_t(M * N));
    ops::cpu::linear(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
                     Tensor(want.data(), DType::bf16, {M, N}));
    Buffer dx = to_device(x), dw = to_device(w), dout(size_t(M * N) * 2, Device::cuda());
    ops::linear(tensor(dx, DType::bf16, {M, K}), tensor(dw, DType::bf16, {N, K}),
                tensor(dout, DType::bf16, {M, N}));
    const auto got = to_host<bf16_t>(dout, size_t(M * N));
    for (size_t i = 0; i < got.size(); ++i)  // one rounding each, summation orders apart: <= 1 bf16 ulp
      EXPECT_NEAR(bf16_to_f32(got[i]), bf16_to_f32(want[i]), std::abs(bf16_to_f32(want[i])) / 128 + 1e-6)
          << i;
  }
  {
    const int64_t T = 5, H = 64, V = 151669;
    auto x = random_bf16(size_t(T * H), 41), w = random_bf16(size_t(V * H), 42);
    std::vector<int32_t> rows = {4, 0, 2};
    const int64_t R = int64_t(rows.size());
    std::vector<float> want(size_t(R * V));
    ops::cpu::lm_head(Tensor(x.data(), DType::bf16, {T, H}), Tensor(rows.data(), DType::i32, {R}),
                      Tensor(w.data(), DType::bf16, {V, H}), Tensor(want.data(), DType::f32, {R, V}));
    Buffer dx = to_device(x), dw = to_device(w), dr = to_device(rows), dl(size_t(R * V) * 4, Device::cuda());
    ops::lm_head(tensor(dx, DType::bf16, {T, H}), Tensor(dr.data(), DType::i32, {R}, dr.device()),
                 tensor(dw, DType::bf16, {V, H}), tensor(dl, DType::f32, {R, V}));
    const auto got = to_host<float>(dl, size_t(R * V));
    int64_t far = 0;
    for (size_t i = 0; i < got.size(); ++i)
      far += std::abs(got[i] - want[i]) > std::abs(want[i]) / 128 + 1e-6f || !std::isfinite(got[i]);
    EXPECT_EQ(far, 0) << "of " << got.size() << " logits, more than 1 bf16 ulp from the CPU's";
  }
}

}  // namespace
}  // namespace kiln
