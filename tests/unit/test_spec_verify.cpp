// The verification rule (spec/verify.h) on the sampler's own distribution (token_distribution): greedy keeps
// exactly the target's greedy tokens; rejection sampling leaves the target's distribution unchanged, checked
// by Pearson chi-square tests over many draws from fixed seeds. Each test's threshold is the chi-square
// quantile with upper tail 1e-10 for its degrees of freedom (computed offline: df 3: 49.54, 7: 60.90,
// 15: 79.15), so even with unseeded draws a correct sampler would fail one of these checks with probability
// below 1e-9; with the fixed seeds the outcome is deterministic. Each test also runs a deliberately wrong
// verifier through the same statistic and requires it to fail, so the checks have the power to fail.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "common/chi_square.h"
#include "runtime/token_draw.h"
#include "spec/verify.h"

namespace kiln::spec {
namespace {

constexpr int kDraws = 400000;

Categorical dist_of(const std::vector<float>& logits, const SamplingParams& p) {
  Categorical c;
  token_distribution(logits.data(), int64_t(logits.size()), p, &c);
  return c;
}

using test_support::chi_square;
using test_support::kChi2Df15;
using test_support::kChi2Df3;
using test_support::kChi2Df7;
using test_support::probs_of;

// The counts of the token one verify position emits, over kDraws seeded draws.
std::vector<int64_t> emitted_counts(size_t vocab, uint64_t seed,
                                    const std::function<int32_t(std::mt19937_64&)>& one) {
  return test_support::emitted_counts(vocab, kDraws, seed, one);
}

const std::vector<float> kLogits{2.0f, 1.5f, 1.1f, 0.4f, 0.0f, -0.3f, -1.0f, -1.6f};

TEST(SpecVerify, PointDraftKeepsTheTargetDistribution) {
  struct Case {
    float temperature, top_p;
    int top_k;
    float min_p;
    int32_t draft;
    double threshold;
  };
  // Unfiltered (df 7, a middling and the likeliest draft); top-k 4 with a draft outside it (never kept) and
  // inside it (df 3); top-p plus min-p (df from the kept set, at most 7: the df-7 bound is the looser).
  const Case cases[] = {{1.0f, 1.0f, -1, 0.0f, 2, kChi2Df7},
                        {0.7f, 1.0f, -1, 0.0f, 0, kChi2Df7},
                        {1.3f, 1.0f, 4, 0.0f, 6, kChi2Df3},
                        {1.0f, 1.0f, 4, 0.0f, 1, kChi2Df3},
                        {1.0f, 0.9f, -1, 0.05f, 3, kChi2Df7}};
  uint64_t seed = 1000;
  for (const Case& c : cases) {
    SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_p = c.top_p;
    sp.top_k = c.top_k;
    sp.min_p = c.min_p;
    const Categorical p = dist_of(kLogits, sp);
    const std::vector<double> want = probs_of(p, kLogits.size());
    const auto counts = emitted_counts(kLogits.size(), ++seed, [&](std::mt19937_64& rng) {
      return verify_point_draft(p, c.draft, rng).token;
    });
    EXPECT_LT(chi_square(counts, want, kDraws), c.threshold) << "draft " << c.draft << " T " << c.temperature;
    // A wrong residual (the rejected draft may come back) is caught by the same test.
    const auto wrong = emitted_counts(kLogits.size(), seed, [&](std::mt19937_64& rng) {
      const Verdict v = verify_point_draft(p, c.draft, rng);
      return v.accepted ? v.token : p.draw(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
    });
    if (want[size_t(c.draft)] > 0.0) {
      EXPECT_GT(chi_square(wrong, want, kDraws), c.threshold) << c.draft;
    }
  }
}

TEST(SpecVerify, SampledDraftKeepsTheTargetDistribution) {
  SamplingParams sp;
  sp.temperature = 0.9f;
  const Categorical p = dist_of(kLogits, sp);
  const std::vector<double> want = probs_of(p, kLogits.size());
  // A draft model that disagrees: nearly flat, with its own favourite.
  std::vector<double> q{0.05, 0.1, 0.1, 0.3, 0.15, 0.1, 0.1, 0.1};
  std::discrete_distribution<int32_t> draft_from_q(q.begin(), q.end());
  const auto counts = emitted_counts(kLogits.size(), 77, [&](std::mt19937_64& rng) {
    const int32_t x = draft_from_q(rng);
    return verify_sampled_draft(p, q, x, rng).token;
  });
  EXPECT_LT(chi_square(counts, want, kDraws), kChi2Df7);
  // Keeping every draft samples q, not p.
  const auto wrong =
      emitted_counts(kLogits.size(), 77, [&](std::mt19937_64& rng) { return draft_from_q(rng); });
  EXPECT_GT(chi_square(wrong, want, kDraws), kChi2Df7);
}

// A two-position chain over a vocabulary of 4 whose second position depends on the first token: the pair of
// tokens the chain emits (the second one drawn by the next step when the chain stops after one) must follow
// p0(t0) * p1(t1 | t0): 16 cells, df 15.
TEST(SpecVerify, ChainKeepsTheJointDistribution) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  const Categorical p0 = dist_of({1.0f, 0.2f, -0.5f, 0.6f}, sp);
  std::vector<Categorical> p1;
  for (int t = 0; t < 4; ++t)
    p1.push_back(dist_of({0.3f * float(t), -0.4f, 0.8f - 0.5f * float(t), 0.1f * float(t * t)}, sp));
  std::vector<double> want(16);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) want[size_t(a * 4 + b)] = p0.prob(a) * p1[size_t(a)].prob(b);
  const std::vector<int32_t> draft{3, 0};
  auto run = [&](bool condition_on_draft) {
    return emitted_counts(16, 4242, [&](std::mt19937_64& rng) {
      const std::vector<int32_t> out = verify_chain(
          draft,
          [&](size_t j) {
            // The right target at position 1 is conditioned on the kept draft; the wrong one on token 1.
            const Categorical* d = j == 0 ? &p0 : &p1[size_t(condition_on_draft ? draft[0] : 1)];
            return TargetPosition{-1, d};
          },
          rng);
      EXPECT_GE(out.size(), 1u);
      EXPECT_LE(out.size(), 3u);
      const int32_t t0 = out[0];
      const int32_t t1 = out.size() > 1
                             ? out[1]
                             : p1[size_t(t0)].draw(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
      return t0 * 4 + t1;
    });
  };
  EXPECT_LT(chi_square(run(true), want, kDraws), kChi2Df15);
  EXPECT_GT(chi_square(run(false), want, kDraws), kChi2Df15);
}

TEST(SpecVerify, GreedyKeepsExactlyTheTargetsTokens) {
  const std::vector<int32_t> target{5, 6, 7, 8};  // the target's greedy token at positions 0..3
  std::mt19937_64 rng(1);
  auto greedy_at = [&](size_t j) { return TargetPosition{target[j], nullptr}; };
  EXPECT_EQ(verify_chain(std::vector<int32_t>{5, 6, 7}, greedy_at, rng), (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(verify_chain(std::vector<int32_t>{5, 9, 7}, greedy_at, rng), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(verify_chain(std::vector<int32_t>{1}, greedy_at, rng), (std::vector<int32_t>{5}));
  EXPECT_EQ(verify_chain(std::vector<int32_t>{}, greedy_at, rng), (std::vector<int32_t>{5}));
  std::mt19937_64 untouched(1);
  EXPECT_EQ(rng(), untouched());  // greedy draws no uniforms
}

// draw_token's draw is token_distribution's draw at the same uniform: the verifier judges drafts against
// exactly what the sampler draws from.
TEST(SpecVerify, TokenDistributionIsWhatDrawTokenDraws) {
  std::mt19937_64 gen(9);
  for (int trial = 0; trial < 300; ++trial) {
    const int V = 1 + int(gen() % 200);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = float(int(gen() % 2000) - 1000) / 250.0f;
    SamplingParams sp;
    sp.temperature = 0.2f + float(gen() % 20) / 10.0f;
    sp.top_k = trial % 3 == 0 ? 1 + int(gen() % 10) : -1;
    sp.top_p = trial % 4 == 1 ? 0.3f + float(gen() % 7) / 10.0f : 1.0f;
    sp.min_p = trial % 5 == 2 ? float(gen() % 5) / 10.0f : 0.0f;
    Categorical c;
    token_distribution(logits.data(), V, sp, &c);
    std::mt19937_64 a{uint64_t(trial)}, b{uint64_t(trial)};
    for (int i = 0; i < 20; ++i) {
      const int32_t drawn = draw_token(logits.data(), V, sp, a).token;
      ASSERT_EQ(drawn, c.draw(std::uniform_real_distribution<double>(0.0, 1.0)(b))) << trial;
      ASSERT_GT(c.prob(drawn), 0.0);
    }
    double total = 0.0;
    for (int v = 0; v < V; ++v) total += c.prob(v);
    EXPECT_NEAR(total, 1.0, 1e-9);
  }
}

}  // namespace
}  // namespace kiln::spec
