#include "client/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kiln/error.h"

namespace kiln::client {

double percentile(std::vector<double> xs, double p) {
  KILN_CHECK(!xs.empty(), "percentile of an empty sample");
  KILN_CHECK(p >= 0 && p <= 100, "percentile ", p, " is outside [0, 100]");
  std::sort(xs.begin(), xs.end());
  const double rank = p / 100.0 * double(xs.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, xs.size() - 1);
  const double frac = rank - double(lo);
  return xs[lo] + (xs[hi] - xs[lo]) * frac;
}

Summary summarize(const std::vector<double>& xs) {
  Summary s;
  if (xs.empty()) return s;
  s.n = xs.size();
  s.mean = std::accumulate(xs.begin(), xs.end(), 0.0) / double(xs.size());
  s.median = percentile(xs, 50);
  s.p95 = percentile(xs, 95);
  s.p99 = percentile(xs, 99);
  s.min = *std::min_element(xs.begin(), xs.end());
  s.max = *std::max_element(xs.begin(), xs.end());
  return s;
}

Interval bootstrap(size_t n, const std::function<double(const std::vector<size_t>&)>& stat, int resamples,
                   uint64_t seed, double level) {
  KILN_CHECK(n > 0, "bootstrap of an empty sample");
  KILN_CHECK(resamples >= 10, "bootstrap needs at least 10 resamples, got ", resamples);
  KILN_CHECK(level > 0 && level < 1, "bootstrap level must be in (0, 1), got ", level);
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  Interval out;
  out.point = stat(idx);
  std::mt19937_64 rng(seed);
  std::vector<double> values;
  values.reserve(size_t(resamples));
  for (int r = 0; r < resamples; ++r) {
    for (auto& i : idx) i = size_t(rng() % n);
    const double v = stat(idx);
    if (std::isfinite(v)) values.push_back(v);
  }
  KILN_CHECK(!values.empty(), "bootstrap statistic was never finite");
  out.lo = percentile(values, (1 - level) / 2 * 100);
  out.hi = percentile(values, (1 + level) / 2 * 100);
  return out;
}

double reduce_mean(const std::vector<double>& xs) {
  KILN_CHECK(!xs.empty(), "mean of an empty sample");
  return std::accumulate(xs.begin(), xs.end(), 0.0) / double(xs.size());
}
double reduce_median(const std::vector<double>& xs) {
  return percentile(xs, 50);
}
double reduce_p95(const std::vector<double>& xs) {
  return percentile(xs, 95);
}
double reduce_p99(const std::vector<double>& xs) {
  return percentile(xs, 99);
}

Interval paired_change(const std::vector<double>& a1, const std::vector<double>& b,
                       const std::vector<double>& a2, Reducer f, int resamples, uint64_t seed, double level) {
  KILN_CHECK(a1.size() == b.size() && a2.size() == b.size(), "paired samples differ in size: A1 ", a1.size(),
             ", B ", b.size(), ", A2 ", a2.size());
  auto stat = [&](const std::vector<size_t>& idx) {
    std::vector<double> sa1, sb, sa2;
    sa1.reserve(idx.size());
    sb.reserve(idx.size());
    sa2.reserve(idx.size());
    for (size_t i : idx) {
      sa1.push_back(a1[i]);
      sb.push_back(b[i]);
      sa2.push_back(a2[i]);
    }
    const double base = (f(sa1) + f(sa2)) / 2;
    return base == 0 ? std::nan("") : f(sb) / base - 1;
  };
  return bootstrap(b.size(), stat, resamples, seed, level);
}

}  // namespace kiln::client
