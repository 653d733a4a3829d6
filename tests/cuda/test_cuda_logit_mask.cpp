// Structured output on the GPU: ops/cuda/logit_mask.h equals the CPU reference (apply_token_bitmask) bit
// for bit on Qwen3's vocabulary with random masks, rows not listed untouched and words past the mask
// counting as clear; and DevicePenalties applies a processor's grammar mask together with bias and
// penalties exactly as LogitProcessor::apply does, so a greedy draw lands on an allowed id.
#include <cstring>
#include <random>

#include "ops/cuda/logit_mask.h"
#include "ops/cuda/sampling.h"
#include "runtime/device_penalties.h"
#include "runtime/logit_processor.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

std::vector<float> random_logits(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint32_t> random_mask(size_t words, uint32_t seed, int density_percent) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> m(words, 0u);
  for (size_t w = 0; w < words; ++w)
    for (int b = 0; b < 32; ++b)
      if (int(rng() % 100) < density_percent) m[w] |= 1u << b;
  return m;
}

TEST(CudaLogitMask, KernelEqualsTheCpuReference) {
  KILN_REQUIRE_GPU();
  const int64_t V = 151936, R = 5, ld = V + 7;
  const size_t W = size_t((V + 31) / 32);
  std::vector<float> logits = random_logits(R * ld, 1);
  // Rows 0, 2, 3 masked (row 3 with a short mask: ids past it are clear); rows 1 and 4 untouched.
  const std::vector<int32_t> rows{0, 2, 3};
  std::vector<uint32_t> masks;
  for (int j = 0; j < 3; ++j) {
    std::vector<uint32_t> m = random_mask(W, uint32_t(10 + j), j == 1 ? 2 : 50);
    if (j == 2) std::fill(m.begin() + long(W / 2), m.end(), 0u);
    masks.insert(masks.end(), m.begin(), m.end());
  }
  Buffer dl = to_device(logits), dr = to_device(rows), dm = to_device(masks);
  cuda::apply_token_bitmask(static_cast<float*>(dl.data()), ld, V, static_cast<int32_t*>(dr.data()),
                            static_cast<uint32_t*>(dm.data()), int64_t(W), int64_t(rows.size()), nullptr);
  const std::vector<float> got = to_host<float>(dl, size_t(R * ld));
  std::vector<float> want = logits;
  for (size_t j = 0; j < rows.size(); ++j)
    apply_token_bitmask(want.data() + size_t(rows[j]) * size_t(ld), V, masks.data() + j * W, W);
  size_t masked = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "element " << i << ": " << got[i] << " vs " << want[i];
    masked += std::isinf(want[i]) ? 1 : 0;
  }
  EXPECT_GT(masked, size_t(V));  // the test masks something
}

TEST(CudaLogitMask, DevicePenaltiesApplyTheGrammarMaskWithBiasAndPenalties) {
  KILN_REQUIRE_GPU();
  const int64_t V = 151936;
  const int R = 3;
  const size_t W = size_t((V + 31) / 32);
  SamplingParams sp;
  sp.repetition_penalty = 1.3f;
  sp.logit_bias = {{7, 50.0f}};  // id 7 is masked below: the mask wins
  std::vector<std::unique_ptr<LogitProcessor>> procs;
  std::vector<ModelRunner::RowSampling> rows(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    procs.push_back(std::make_unique<LogitProcessor>(r == 1 ? SamplingParams{} : sp,
                                                     std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{}));
    if (r != 2) procs.back()->token_mask() = random_mask(W, uint32_t(20 + r), 1);  // row 2: no grammar
    if (r != 2) procs.back()->token_mask()[0] &= ~(1u << 7);
    rows[size_t(r)].proc = procs.back().get();
    rows[size_t(r)].request = uint64_t(r + 1);
  }
  std::vector<float> logits = random_logits(R * V, 5);
  Buffer dl = to_device(logits);
  DevicePenalties dp(Device::cuda(), V);
  ASSERT_TRUE(dp.apply(static_cast<float*>(dl.data()), V, rows, nullptr));
  const std::vector<cuda::SampleParams> greedy(static_cast<size_t>(R));
  Buffer params = to_device(greedy);
  Buffer tok(size_t(R) * 4, Device::cuda()), lp(size_t(R) * 4, Device::cuda());
  cuda::sample(static_cast<float*>(dl.data()), V, R, V, static_cast<const cuda::SampleParams*>(params.data()),
               static_cast<int32_t*>(tok.data()), static_cast<float*>(lp.data()), 0, nullptr, nullptr,
               nullptr);
  const std::vector<float> got = to_host<float>(dl, size_t(R * V));
  const std::vector<int32_t> tokens = to_host<int32_t>(tok, size_t(R));
  for (int r = 0; r < R; ++r) {
    std::vector<float> want(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    procs[size_t(r)]->apply(want.data(), V);
    for (int64_t i = 0; i < V; ++i)
      ASSERT_EQ(std::memcmp(&got[size_t(r * V + i)], &want[size_t(i)], 4), 0) << "row " << r << " id " << i;
    if (r != 2) {
      const auto& m = procs[size_t(r)]->token_mask();
      const int32_t t = tokens[size_t(r)];
      EXPECT_TRUE((m[size_t(t) / 32] >> (t % 32)) & 1u) << "row " << r << " drew masked id " << t;
    }
  }
}

}  // namespace
}  // namespace kiln
