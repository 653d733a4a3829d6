// Statistics for the client tools: summaries with linear-interpolated percentiles (numpy's default),
// and a seeded paired bootstrap for A/B comparisons.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace kiln::client {

// Percentile p in [0, 100] of xs with linear interpolation between order statistics: the value at rank
// p/100 * (n - 1). Throws on empty input or p outside [0, 100].
double percentile(std::vector<double> xs, double p);

struct Summary {
  size_t n = 0;
  double mean = 0, median = 0, p95 = 0, p99 = 0, min = 0, max = 0;
};
// All fields 0 (n = 0) for empty input, so a level with no samples still reports.
Summary summarize(const std::vector<double>& xs);

struct Interval {
  double point = 0;  // the statistic on the original sample
  double lo = 0, hi = 0;
};

// Percentile bootstrap: `resamples` times draw n indices with replacement (mt19937_64(seed), index =
// draw % n), evaluate stat on them, and return the (1-level)/2 and (1+level)/2 percentiles of those values.
// stat receives the index list so that several paired samples can be resampled together.
Interval bootstrap(size_t n, const std::function<double(const std::vector<size_t>&)>& stat, int resamples,
                   uint64_t seed, double level = 0.95);

using Reducer = double (*)(const std::vector<double>&);
double reduce_mean(const std::vector<double>& xs);
double reduce_median(const std::vector<double>& xs);
double reduce_p95(const std::vector<double>& xs);
double reduce_p99(const std::vector<double>& xs);

// Relative change of b against the mean of a1 and a2 (the A1 -> B -> A2 design), for the reducer f:
// f(b) / ((f(a1) + f(a2)) / 2) - 1, with a paired bootstrap interval: the three samples are indexed by
// the same request (same prompt in each window), so one index draw resamples all three.
Interval paired_change(const std::vector<double>& a1, const std::vector<double>& b,
                       const std::vector<double>& a2, Reducer f, int resamples, uint64_t seed,
                       double level = 0.95);

}  // namespace kiln::client
