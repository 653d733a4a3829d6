// Statistics of the client tools: percentiles, summaries and the seeded (paired) bootstrap on known data.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "client/stats.h"
#include "kiln/error.h"

using namespace kiln::client;

TEST(ClientStats, PercentileInterpolatesLikeNumpy) {
  const std::vector<double> xs = {7, 1, 10, 4, 2, 9, 3, 8, 6, 5};  // 1..10, unsorted
  EXPECT_DOUBLE_EQ(percentile(xs, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(xs, 100), 10);
  EXPECT_DOUBLE_EQ(percentile(xs, 50), 5.5);
  EXPECT_NEAR(percentile(xs, 95), 9.55, 1e-12);  // numpy.percentile(range(1, 11), 95)
  EXPECT_NEAR(percentile(xs, 99), 9.91, 1e-12);
  EXPECT_NEAR(percentile(xs, 25), 3.25, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({42}, 99), 42);
}

TEST(ClientStats, PercentileRejectsBadInput) {
  EXPECT_THROW(percentile({}, 50), kiln::Error);
  EXPECT_THROW(percentile({1, 2}, -1), kiln::Error);
  EXPECT_THROW(percentile({1, 2}, 100.5), kiln::Error);
}

TEST(ClientStats, SummaryOfKnownData) {
  const Summary s = summarize({2, 4, 4, 4, 5, 5, 7, 9});
  EXPECT_EQ(s.n, 8u);
  EXPECT_DOUBLE_EQ(s.mean, 5);
  EXPECT_DOUBLE_EQ(s.median, 4.5);
  EXPECT_DOUBLE_EQ(s.min, 2);
  EXPECT_DOUBLE_EQ(s.max, 9);
  EXPECT_NEAR(s.p95, 8.3, 1e-12);  // rank 6.65: 7 + 0.65 * 2
  const Summary e = summarize({});
  EXPECT_EQ(e.n, 0u);
  EXPECT_EQ(e.mean, 0);
}

TEST(ClientStats, BootstrapOfConstantDataCollapses) {
  const std::vector<double> xs(50, 3.0);
  const Interval iv = bootstrap(
      xs.size(),
      [&](const std::vector<size_t>& idx) {
        double s = 0;
        for (size_t i : idx) s += xs[i];
        return s / double(idx.size());
      },
      500, 7);
  EXPECT_DOUBLE_EQ(iv.point, 3);
  EXPECT_DOUBLE_EQ(iv.lo, 3);
  EXPECT_DOUBLE_EQ(iv.hi, 3);
}

TEST(ClientStats, BootstrapMeanIntervalHasTheTextbookWidthAndIsSeeded) {
  // 400 draws of N(10, 2^2): the 95% interval of the mean is about 10 +- 1.96 * 2 / 20 = 10 +- 0.196.
  std::mt19937_64 rng(99);
  std::normal_distribution<double> normal(10, 2);
  std::vector<double> xs(400);
  for (auto& x : xs) x = normal(rng);
  auto mean_of = [&](const std::vector<size_t>& idx) {
    double s = 0;
    for (size_t i : idx) s += xs[i];
    return s / double(idx.size());
  };
  const Interval a = bootstrap(xs.size(), mean_of, 2000, 1);
  EXPECT_LT(a.lo, a.point);
  EXPECT_GT(a.hi, a.point);
  EXPECT_NEAR(a.hi - a.lo, 2 * 0.196, 0.08);
  EXPECT_LT(a.lo, 10.0 + 0.3);
  EXPECT_GT(a.hi, 10.0 - 0.3);
  const Interval b = bootstrap(xs.size(), mean_of, 2000, 1);
  EXPECT_EQ(a.lo, b.lo);  // same seed, same interval
  EXPECT_EQ(a.hi, b.hi);
  const Interval c = bootstrap(xs.size(), mean_of, 2000, 2);
  EXPECT_NE(a.lo, c.lo);
}

TEST(ClientStats, PairedChangeOfAnExactScaleHasAZeroWidthInterval) {
  std::vector<double> a, b;
  for (int i = 1; i <= 40; ++i) {
    a.push_back(double(i % 7 + 1));
    b.push_back(1.25 * a.back());
  }
  for (Reducer f : {reduce_mean, reduce_median, reduce_p95, reduce_p99}) {
    const Interval iv = paired_change(a, b, a, f, 300, 5);
    EXPECT_NEAR(iv.point, 0.25, 1e-12);
    EXPECT_NEAR(iv.lo, 0.25, 1e-12);
    EXPECT_NEAR(iv.hi, 0.25, 1e-12);
  }
}

TEST(ClientStats, PairedChangeCancelsLinearDriftOfA) {
  // A drifts from x to x + 2 between its windows; B sits in the middle (x + 1): no change in the mean.
  std::vector<double> a1, b, a2;
  for (int i = 0; i < 30; ++i) {
    const double x = 10 + (i * 37 % 11);
    a1.push_back(x);
    b.push_back(x + 1);
    a2.push_back(x + 2);
  }
  const Interval iv = paired_change(a1, b, a2, reduce_mean, 500, 3);
  EXPECT_NEAR(iv.point, 0, 1e-12);
  EXPECT_NEAR(iv.lo, 0, 1e-12);
  EXPECT_NEAR(iv.hi, 0, 1e-12);
}

TEST(ClientStats, PairedChangeOnNoisyDataCoversTheTrueChange) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0, 0.05);
  std::uniform_real_distribution<double> base(50, 150);
  std::vector<double> a1, b, a2;
  for (int i = 0; i < 200; ++i) {
    const double x = base(rng);
    a1.push_back(x * (1 + noise(rng)));
    a2.push_back(x * (1 + noise(rng)));
    b.push_back(x * 1.2 * (1 + noise(rng)));
  }
  const Interval iv = paired_change(a1, b, a2, reduce_mean, 2000, 17);
  EXPECT_LT(iv.lo, 0.2);
  EXPECT_GT(iv.hi, 0.2);
  EXPECT_GT(iv.lo, 0.15);  // the pairing removes the large between-prompt spread
  EXPECT_LT(iv.hi, 0.25);
  EXPECT_THROW(paired_change(a1, {1, 2}, a2, reduce_mean, 100, 1), kiln::Error);
}
