// LogitProcessor (runtime/logit_processor.h) against a reference written here the way vLLM writes it:
// dense masks and counts over the whole vocabulary, bias and the min-token mask first, then
// repetition (prompt | output), frequency and presence (output). Then the Sampler on processed rows:
// greedy follows the processed logits, logprobs are of the processed distribution, and the history is
// what observe() was told.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/logit_processor.h"
#include "runtime/sampler.h"

using namespace kiln;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> reference(std::vector<float> x, const SamplingParams& p,
                             const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                             const std::vector<int32_t>& masked) {
  const size_t V = x.size();
  for (const auto& [id, b] : p.logit_bias) x[size_t(id)] += b;
  if (int(output.size()) < p.min_new_tokens)
    for (int32_t id : masked) x[size_t(id)] = kNegInf;
  std::vector<bool> prompt_mask(V, false), output_mask(V, false);
  std::vector<int> counts(V, 0);
  for (int32_t t : prompt) prompt_mask[size_t(t)] = true;
  for (int32_t t : output) output_mask[size_t(t)] = true, ++counts[size_t(t)];
  for (size_t v = 0; v < V; ++v) {
    if (!(prompt_mask[v] || output_mask[v])) continue;
    x[v] = x[v] > 0 ? x[v] / p.repetition_penalty : x[v] * p.repetition_penalty;
    x[v] -= p.frequency_penalty * float(counts[v]);
    x[v] -= p.presence_penalty * (output_mask[v] ? 1.0f : 0.0f);
  }
  return x;
}

std::vector<float> random_logits(size_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> x(V);
  for (float& v : x) v = n(g);
  return x;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))
        << "id " << i << ": " << a[i] << " vs " << b[i];
}

}  // namespace

TEST(LogitProcessor, MatchesTheDenseReferenceOverRandomRowsAndHistories) {
  std::mt19937_64 g(5);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t V = 37 + size_t(trial) * 13;
    SamplingParams p;
    p.presence_penalty = std::uniform_real_distribution<float>(-2, 2)(g);
    p.frequency_penalty = std::uniform_real_distribution<float>(-2, 2)(g);
    p.repetition_penalty = std::uniform_real_distribution<float>(0.05f, 2)(g);
    if (trial % 5 == 0) p.presence_penalty = 0;  // one penalty at a time, too
    if (trial % 7 == 0) p.repetition_penalty = 1;
    for (int i = 0; i < trial % 4; ++i)  // distinct ids (a repeated one keeps its last bias: tested below)
      p.logit_bias.push_back(
          {int32_t(i * 11 + trial % 7), std::uniform_real_distribution<float>(-100, 100)(g)});
    p.max_new_tokens = 64;
    p.min_new_tokens = trial % 3 == 0 ? 4 : 0;
    std::vector<int32_t> prompt, masked = {int32_t(g() % V), int32_t(g() % V)};
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t(g() % (V / 2)));  // repeats, too
    LogitProcessor proc(p, prompt, masked);
    std::vector<int32_t> output;
    for (int step = 0; step < 8; ++step) {
      const std::vector<float> x = random_logits(V, uint64_t(trial * 100 + step));
      std::vector<float> got = x;
      proc.apply(got.data(), int64_t(V));
      expect_same_bits(got, reference(x, p, prompt, output, masked));
      const int32_t t = int32_t(g() % V);
      output.push_back(t);
      proc.observe(t);
      if (step == 2) output.push_back(output.back()), proc.observe(output.back());  // a repeat
    }
  }
}

TEST(LogitProcessor, SparseAddsMergeBiasAndMaskAndLapseAfterMinTokens) {
  SamplingParams p;
  p.logit_bias = {{9, 1.5f}, {2, -3.0f}, {9, 4.0f}, {5, 0.0f}};  // a repeated id keeps its last bias
  p.max_new_tokens = 10;
  p.min_new_tokens = 2;
  LogitProcessor proc(p, {}, {7, 2, 7});
  EXPECT_FALSE(proc.has_penalties());
  EXPECT_TRUE(proc.active());
  using E = std::vector<std::pair<int32_t, float>>;
  EXPECT_EQ(proc.sparse_adds(), (E{{2, kNegInf}, {7, kNegInf}, {9, 4.0f}}));
  proc.observe(1);
  proc.observe(1);
  EXPECT_EQ(proc.sparse_adds(), (E{{2, -3.0f}, {9, 4.0f}}));
  LogitProcessor none(SamplingParams{}, std::vector<int32_t>{1, 2, 3}, {4});
  EXPECT_FALSE(none.active());
  EXPECT_TRUE(none.sparse_adds().empty());
}

TEST(LogitProcessor, SamplerDrawsAndReportsTheProcessedDistribution) {
  // Greedy would pick 3; a bias forces 1, then a huge repetition penalty pushes 1 away after it appears.
  std::vector<float> x = {0.5f, 2.0f, 1.0f, 4.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{1, 3.0f}};
  p.repetition_penalty = 2.0f;
  p.return_logprob = true;
  p.top_logprobs = 2;
  Sampler s(p, 0, true, std::vector<int32_t>{3});  // 3 is in the prompt: 4 / 2 = 2
  Draw d = s.sample(x);
  EXPECT_EQ(d.token, 1);  // 2 + 3 = 5 beats everything
  const std::vector<float> processed = {0.5f, 5.0f, 1.0f, 2.0f, -1.0f};
  double z = 0;
  for (float v : processed) z += std::exp(double(v));
  EXPECT_NEAR(d.logprob, 5.0 - std::log(z), 1e-5);
  ASSERT_EQ(d.top.size(), 2u);
  EXPECT_EQ(d.top[1].id, 3);
  EXPECT_NEAR(d.top[1].logprob, 2.0 - std::log(z), 1e-5);
  s.observe(d.token);
  d = s.sample(x);  // 1: (2 + 3) / 2 = 2.5 now beats 3's 2
  EXPECT_EQ(d.token, 1);
  EXPECT_EQ(x[1], 2.0f);  // the caller's row is not changed
  // min_new_tokens: the masked id cannot be drawn until enough tokens were observed.
  SamplingParams m;
  m.temperature = 0.0f;
  m.max_new_tokens = 5;
  m.min_new_tokens = 2;
  Sampler ms(m, 0, true, {}, {3});
  EXPECT_EQ(ms.sample(x).token, 1);
  ms.observe(1);
  EXPECT_EQ(ms.sample(x).token, 1);
  ms.observe(1);
  EXPECT_EQ(ms.sample(x).token, 3);
}

TEST(LogitProcessor, OutOfRangeParametersAreRejected) {
  auto bad = [](auto set) {
    SamplingParams p;
    set(p);
    EXPECT_THROW(validate_sampling_params(p), Error);
  };
  bad([](SamplingParams& p) { p.presence_penalty = 2.5f; });
  bad([](SamplingParams& p) { p.frequency_penalty = -2.01f; });
  bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; });
  bad([](SamplingParams& p) { p.repetition_penalty = std::nanf(""); });
  bad([](SamplingParams& p) { p.logit_bias = {{1, 101.0f}}; });
  bad([](SamplingParams& p) { p.min_new_tokens = -1; });
  bad([](SamplingParams& p) { p.min_new_tokens = p.max_new_tokens + 1; });
  SamplingParams ok;
  ok.presence_penalty = -2;
  ok.frequency_penalty = 2;
  ok.repetition_penalty = 2;
  ok.logit_bias = {{1, -100.0f}};
  ok.min_new_tokens = ok.max_new_tokens;
  EXPECT_NO_THROW(validate_sampling_params(ok));
}
