// ops::argmax_rows on CUDA against the CPU oracle, bit for bit (comparisons only): rows with planted ties
// (the lower index wins), NaN and -inf, a row stride wider than the row, with and without offsets, widths
// from one column to the Qwen3 vocabulary; the output poisoned first.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "ops/argmax.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

void check(int64_t R, int64_t V, int64_t ld, bool offsets, uint32_t seed) {
  SCOPED_TRACE("R " + std::to_string(R) + " V " + std::to_string(V) + " ld " + std::to_string(ld));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> x(size_t(R * ld), 1e30f);  // columns past V: larger than any logit, never read
  for (int64_t r = 0; r < R; ++r) {
    float* row = x.data() + r * ld;
    for (int64_t i = 0; i < V; ++i) row[i] = float(int(u(rng) * 8)) / 8.0f;  // coarse: many equal values
    switch (r % 4) {
      case 1:  // the maximum twice, far apart: the first must win
        row[V / 3] = row[V - 1] = 9.0f;
        break;
      case 2:  // NaN everywhere but one column
        for (int64_t i = 0; i < V; ++i) row[i] = std::numeric_limits<float>::quiet_NaN();
        row[(V * 2) / 3] = -1.0f;
        break;
      case 3:  // nothing above -inf
        for (int64_t i = 0; i < V; ++i)
          row[i] = i % 2 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
        break;
      default:
        break;
    }
  }
  std::vector<int64_t> d2t(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) d2t[size_t(i)] = (i * 7) % 13;
  std::vector<int32_t> want(static_cast<size_t>(R));
  const Tensor no_offsets;
  ops::argmax_rows(Tensor::strided(x.data(), DType::f32, {R, V}, {ld, 1}, Device::cpu()),
                   offsets ? Tensor(d2t.data(), DType::i64, {V}, Device::cpu()) : no_offsets,
                   Tensor(want.data(), DType::i32, {R}, Device::cpu()));
  const Buffer dx = test::to_device(x), dd = test::to_device(d2t);
  Buffer dout(size_t(R) * 4, Device::cuda());
  test::poison(dout);
  ops::argmax_rows(Tensor::strided(dx.data(), DType::f32, {R, V}, {ld, 1}, Device::cuda()),
                   offsets ? Tensor(dd.data(), DType::i64, {V}, Device::cuda()) : no_offsets,
                   Tensor(dout.data(), DType::i32, {R}, Device::cuda()));
  EXPECT_EQ(test::to_host<int32_t>(dout, size_t(R)), want);
}

TEST(CudaArgmaxRows, EqualsTheCpuOracle) {
  KILN_REQUIRE_GPU();
  check(1, 1, 1, false, 1);
  check(3, 40, 44, true, 2);
  check(8, 255, 256, false, 3);
  check(5, 16384, 16384, true, 4);
  check(64, 1000, 1003, true, 5);
  check(4, 151936, 151936, false, 6);
}

}  // namespace
}  // namespace kiln
