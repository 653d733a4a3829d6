// Sampler: greedy, raw logprobs, seeded determinism, and the sampled distribution under temperature,
// top-k, top-p and min-p (frequencies over many draws against the exact renormalised probabilities).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/sampler.h"

using namespace kiln;

namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

// Frequencies of each id over n draws.
std::vector<double> frequencies(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) f[size_t(s.sample(logits).token)] += 1.0 / n;
  return f;
}

SamplingParams params(float t, int top_k = -1, float top_p = 1.0f, float min_p = 0.0f, int64_t seed = 1) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

}  // namespace

TEST(Sampler, GreedyPicksFirstMaxAndReportsRawLogprob) {
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f};
  SamplingParams p = params(0.0f);
  p.top_logprobs = 3;
  Sampler s(p, 0);
  const Draw d = s.sample(l);
  EXPECT_EQ(d.token, 1);
  double sum = 0;
  for (float x : l) sum += std::exp(double(x));
  EXPECT_NEAR(d.logprob, 3.0 - std::log(sum), 1e-6);
  ASSERT_EQ(d.top.size(), 3u);
  EXPECT_EQ(d.top[0].id, 1);
  EXPECT_EQ(d.top[1].id, 2);
  EXPECT_EQ(d.top[2].id, 0);
  EXPECT_NEAR(d.top[2].logprob, 1.0 - std::log(sum), 1e-6);
}

TEST(Sampler, LogprobIsOfTheRawDistributionUnderTemperature) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.2});
  Sampler s(params(0.7f, 2), 0);
  for (int i = 0; i < 20; ++i) {
    const Draw d = s.sample(l);
    EXPECT_NEAR(d.logprob, l[size_t(d.token)], 1e-6);  // log(p) of the unmodified distribution
  }
}

TEST(Sampler, SeededDeterminism) {
  const std::vector<float> l = logits_of({0.2, 0.2, 0.2, 0.2, 0.2});
  auto run = [&](int64_t seed, uint64_t fallback) {
    Sampler s(params(1.0f, -1, 1.0f, 0.0f, seed), fallback);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.sample(l).token);
    return ids;
  };
  EXPECT_EQ(run(42, 0), run(42, 99));  // an explicit seed ignores the fallback
  EXPECT_NE(run(42, 0), run(43, 0));
  EXPECT_EQ(run(-1, 7), run(-1, 7));
  EXPECT_NE(run(-1, 7), run(-1, 8));
}

TEST(Sampler, DistributionsMatch) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.2});
  const int n = 40000;
  const double tol = 0.015;  // > 4 standard deviations of a frequency at n = 40000
  struct Case {
    SamplingParams p;
    std::vector<double> want;
  };
  const double t2[3] = {std::sqrt(0.5), std::sqrt(0.3), std::sqrt(0.2)};
  const double t2s = t2[0] + t2[1] + t2[2];
  const std::vector<Case> cases = {
      {params(1.0f), {0.5, 0.3, 0.2}},
      {params(2.0f), {t2[0] / t2s, t2[1] / t2s, t2[2] / t2s}},  // p^(1/2), renormalised
      {params(1.0f, 2), {0.625, 0.375, 0.0}},                   // top-k 2
      {params(1.0f, -1, 0.7f), {0.625, 0.375, 0.0}},            // top-p: 0.5 < 0.7 <= 0.8
      {params(1.0f, -1, 0.5f), {1.0, 0.0, 0.0}},                // top-p reached by the first token
      {params(1.0f, -1, 1.0f, 0.5f), {0.625, 0.375, 0.0}},      // min-p: keep p >= 0.25
      {params(1.0f, 1), {1.0, 0.0, 0.0}},                       // top-k 1 is greedy
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    Sampler s(cases[c].p, 0);
    const auto f = frequencies(s, l, n);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(f[i], cases[c].want[i], tol) << "case " << c << " id " << i;
  }
}

TEST(Sampler, RejectsBadParams) {
  EXPECT_THROW(Sampler(params(-1.0f), 0), Error);
  EXPECT_THROW(Sampler(params(NAN), 0), Error);
  EXPECT_THROW(Sampler(params(1.0f, -1, 0.0f), 0), Error);
  EXPECT_THROW(Sampler(params(1.0f, -1, 1.5f), 0), Error);
  EXPECT_THROW(Sampler(params(1.0f, -2), 0), Error);
  EXPECT_THROW(Sampler(params(1.0f, -1, 1.0f, 2.0f), 0), Error);
  SamplingParams p = params(1.0f);
  p.top_logprobs = 21;
  EXPECT_THROW(Sampler(p, 0), Error);
  Sampler ok(params(1.0f), 0);
  EXPECT_THROW(ok.sample(std::span<const float>()), Error);
}
