// draw_token: the CPU token choice (greedy ties and NaN, top-k / top-p / min-p, softmax frequencies,
// raw logprobs).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "runtime/token_draw.h"

namespace kiln {
namespace {

TEST(TokenDraw, GreedyTopKOneAndFilters) {
  const std::vector<float> logits{0.5f, 2.0f, 1.0f, 2.0f, -1.0f};  // ties at ids 1 and 3
  std::mt19937_64 rng(1);
  SamplingParams g;
  g.temperature = 0.0f;
  EXPECT_EQ(draw_token(logits.data(), 5, g, rng).token, 1);  // lowest id on ties
  SamplingParams k1;
  k1.top_k = 1;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(draw_token(logits.data(), 5, k1, rng).token, 1);
  SamplingParams tp;  // top-p 0.5: the two tied leaders hold ~0.71 together, one alone ~0.36 < 0.5
  tp.top_p = 0.5f;
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[draw_token(logits.data(), 5, tp, rng).token];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 120);
  EXPECT_GT(seen[3], 120);
  SamplingParams mp;  // min-p 0.5 keeps ids with p >= 0.5 * p_max: 1, 3 (2 has e^-1 ~ 0.37 of the max)
  mp.min_p = 0.5f;
  seen.clear();
  for (int i = 0; i < 400; ++i) ++seen[draw_token(logits.data(), 5, mp, rng).token];
  EXPECT_EQ(seen.size(), 2u);
}

TEST(TokenDraw, GreedyArgmaxOnOddSizesTiesAndNaN) {
  std::mt19937_64 rng(1);
  SamplingParams g;
  g.temperature = 0.0f;
  for (int n : {1, 7, 8, 9, 17, 1000, 151936}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) x[size_t(i)] = float((i * 37) % 101) * 0.01f;
    x[size_t(n - 1)] = 5.0f;  // the maximum in the tail that the 8-wide loop leaves over
    EXPECT_EQ(draw_token(x.data(), n, g, rng).token, n - 1) << n;
    if (n > 3) {
      x[2] = 5.0f;  // a tie: the lowest id wins
      EXPECT_EQ(draw_token(x.data(), n, g, rng).token, 2) << n;
      x[1] = std::nanf("");  // NaN never wins
      EXPECT_EQ(draw_token(x.data(), n, g, rng).token, 2) << n;
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> y{-inf, -inf, 1.0f, inf, 3.0f};
  EXPECT_EQ(draw_token(y.data(), 5, g, rng).token, 3);
}

TEST(TokenDraw, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = k / 10
  std::mt19937_64 rng(42);
  SamplingParams p;
  std::vector<int> n(4, 0);
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++n[size_t(draw_token(logits.data(), 4, p, rng).token)];
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(double(n[size_t(k)]) / N, (k + 1) / 10.0, 0.015) << k;
  // Temperature 2 flattens: p ~ sqrt(k + 1) / sum.
  p.temperature = 2.0f;
  std::fill(n.begin(), n.end(), 0);
  double z = 0;
  for (int k = 0; k < 4; ++k) z += std::sqrt(k + 1.0);
  for (int i = 0; i < N; ++i) ++n[size_t(draw_token(logits.data(), 4, p, rng).token)];
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(double(n[size_t(k)]) / N, std::sqrt(k + 1.0) / z, 0.015) << k;
}

TEST(TokenDraw, LogprobsAreOfTheRawLogits) {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  std::mt19937_64 rng(3);
  SamplingParams p;
  p.temperature = 0.0f;
  p.return_logprob = true;
  p.top_logprobs = 2;
  const Draw d = draw_token(logits.data(), 4, p, rng);
  EXPECT_EQ(d.token, 3);
  EXPECT_NEAR(d.logprob, std::log(0.4), 1e-6);
  ASSERT_EQ(d.top.size(), 2u);
  EXPECT_EQ(d.top[1].id, 2);
  EXPECT_NEAR(d.top[1].logprob, std::log(0.3), 1e-6);
}

}  // namespace
}  // namespace kiln
