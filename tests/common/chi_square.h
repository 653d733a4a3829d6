// Pearson chi-square checks of a sampler's output against the distribution it must follow (test_spec_verify,
// test_spec_tree). The thresholds are the chi-square quantiles with upper tail 1e-10 for their degrees of
// freedom (computed offline), so even unseeded a correct sampler would fail one check with probability below
// 1e-9; with fixed seeds the outcome is deterministic.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "spec/categorical.h"

namespace kiln::test_support {

inline constexpr double kChi2Df3 = 49.54, kChi2Df7 = 60.90, kChi2Df15 = 79.15;

// Pearson's statistic over the cells with positive expectation; a count in a cell of probability 0 is
// infinity (the sampler emitted what the target can never produce).
inline double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n) {
  double x = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] <= 0.0) {
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    const double e = probs[i] * double(n);
    x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
  }
  return x;
}

// The probabilities of ids 0 .. vocab - 1 under c.
inline std::vector<double> probs_of(const spec::Categorical& c, size_t vocab) {
  std::vector<double> p(vocab);
  for (size_t v = 0; v < vocab; ++v) p[v] = c.prob(int32_t(v));
  return p;
}

// The counts of the cell `one` returns (0 .. cells - 1), over n draws from one generator seeded with seed.
inline std::vector<int64_t> emitted_counts(size_t cells, int64_t n, uint64_t seed,
                                           const std::function<int32_t(std::mt19937_64&)>& one) {
  std::vector<int64_t> counts(cells, 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) ++counts[size_t(one(rng))];
  return counts;
}

}  // namespace kiln::test_support
