// GPU sampling: greedy = argmax (lowest id on ties), log-probabilities = log_softmax in fp64 within 1e-4,
// top-k / top-p keep exactly the intended set, seeds reproduce, and temperature sampling follows softmax
// (a chi-square bound over 4000 draws of a 6-token distribution).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "ops/cuda/sampling.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_lp;
};

Result sample(const std::vector<float>& logits, int64_t R, int64_t V,
              const std::vector<cuda::SampleParams>& sp, int top_n = 0) {
  Buffer dl = to_device(logits), dp = to_device(sp);
  Buffer tok(size_t(R) * 4 + 16, Device::cuda()), lp(size_t(R) * 4 + 16, Device::cuda());
  Buffer ti(size_t(R) * 80 + 16, Device::cuda()), tl(size_t(R) * 80 + 16, Device::cuda());
  cuda::sample(static_cast<float*>(dl.data()), V, R, V, static_cast<cuda::SampleParams*>(dp.data()),
               static_cast<int32_t*>(tok.data()), static_cast<float*>(lp.data()), top_n,
               static_cast<int32_t*>(ti.data()), static_cast<float*>(tl.data()), nullptr);
  return {to_host<int32_t>(tok, size_t(R)), to_host<float>(lp, size_t(R)),
          to_host<int32_t>(ti, size_t(R * top_n)), to_host<float>(tl, size_t(R * top_n))};
}

std::vector<double> log_softmax(const float* x, int64_t V) {
  double mx = -1e300, s = 0;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(x[i]));
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(x[i]) - mx);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) out[size_t(i)] = double(x[i]) - mx - std::log(s);
  return out;
}

std::vector<float> random_logits(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CudaSampling, GreedyLogprobsAndTopN) {
  KILN_REQUIRE_GPU();
  const int64_t R = 3, V = 151936;
  auto logits = random_logits(R * V, 1, 3.0f);
  logits[size_t(V + 500)] = 40.0f;  // row 1: a tie at the maximum, lowest id must win
  logits[size_t(V + 70000)] = 40.0f;
  const auto res = sample(logits, R, V, std::vector<cuda::SampleParams>(size_t(R)), 5);
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits.data() + r * V;
    const int64_t am = std::max_element(x, x + V) - x;  // first maximum
    EXPECT_EQ(res.tokens[size_t(r)], am);
    const auto ls = log_softmax(x, V);
    EXPECT_NEAR(res.logprobs[size_t(r)], ls[size_t(am)], 1e-4);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    for (int n = 0; n < 5; ++n) {
      EXPECT_EQ(res.top_ids[size_t(r * 5 + n)], order[size_t(n)]) << "row " << r << " n " << n;
      EXPECT_NEAR(res.top_lp[size_t(r * 5 + n)], ls[size_t(order[size_t(n)])], 1e-4);
    }
  }
  EXPECT_EQ(res.tokens[1], 500);
}

TEST(CudaSampling, TopKAndTopPKeepTheIntendedSet) {
  KILN_REQUIRE_GPU();
  const int64_t V = 50000, R = 64;
  const auto row = random_logits(V, 2, 2.0f);
  std::vector<float> logits;
  for (int r = 0; r < R; ++r) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  // top-k = 5: every draw among the 5 largest; with 64 seeds more than one distinct token appears.
  std::vector<cuda::SampleParams> sp(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    sp[size_t(r)] = {.temperature = 1.0f, .top_k = 5, .top_p = 1.0f, .seed = uint64_t(r)};
  auto res = sample(logits, R, V, sp);
  std::map<int32_t, int> seen;
  for (auto t : res.tokens) {
    EXPECT_NE(std::find(order.begin(), order.begin() + 5, t), order.begin() + 5) << t;
    ++seen[t];
  }
  EXPECT_GT(seen.size(), 1u);
  // top-p: the smallest prefix of the sorted distribution with mass >= p.
  const double p = 0.3;
  std::vector<double> pr(static_cast<size_t>(V));
  double z = 0, mx = row[size_t(order[0])];
  for (int64_t i = 0; i < V; ++i) z += (pr[size_t(i)] = std::exp(double(row[size_t(i)]) - mx));
  int64_t keep = 0;
  for (double mass = 0; mass < p * z; ++keep) mass += pr[size_t(order[size_t(keep)])];
  for (int r = 0; r < R; ++r)
    sp[size_t(r)] = {.temperature = 1.0f, .top_k = 0, .top_p = float(p), .seed = uint64_t(r)};
  res = sample(logits, R, V, sp);
  for (auto t : res.tokens)
    EXPECT_NE(std::find(order.begin(), order.begin() + keep, t), order.begin() + keep)
        << t << " keep " << keep;
  // top-k 1 and a tiny top-p are greedy.
  for (int r = 0; r < R; ++r)
    sp[size_t(r)] = {
        .temperature = 0.7f, .top_k = r % 2 ? 1 : 0, .top_p = r % 2 ? 1.0f : 1e-6f, .seed = uint64_t(r)};
  res = sample(logits, R, V, sp);
  for (auto t : res.tokens) EXPECT_EQ(t, order[0]);
}

TEST(CudaSampling, SeedsReproduceAndFollowSoftmax) {
  KILN_REQUIRE_GPU();
  const int64_t V = 6, R = 4000;
  const std::vector<float> row = {1.0f, 2.0f, 0.5f, -1.0f, 2.5f, 0.0f};
  const float T = 0.8f;
  std::vector<float> logits;
  std::vector<cuda::SampleParams> sp(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    sp[size_t(r)] = {.temperature = T, .seed = 1234, .step = uint64_t(r)};
  }
  const auto a = sample(logits, R, V, sp), b = sample(logits, R, V, sp);
  EXPECT_EQ(a.tokens, b.tokens) << "same (seed, step) must give the same tokens";
  for (int r = 0; r < R; ++r) sp[size_t(r)].seed = 99;
  const auto c = sample(logits, R, V, sp);
  EXPECT_NE(a.tokens, c.tokens);
  std::vector<double> expect(static_cast<size_t>(V));
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += (expect[size_t(i)] = std::exp(double(row[size_t(i)]) / T));
  std::vector<int> count(size_t(V), 0);
  for (auto t : a.tokens) {
    ASSERT_TRUE(t >= 0 && t < V);
    ++count[size_t(t)];
  }
  double chi2 = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double e = expect[size_t(i)] / z * R;
    chi2 += (count[size_t(i)] - e) * (count[size_t(i)] - e) / e;
  }
  EXPECT_LT(chi2, 25.0) << "5 degrees of freedom: p < 1e-4 for a correct sampler";  // deterministic seeds
  // The logprob reported is of the unscaled distribution.
  const auto ls = log_softmax(row.data(), V);
  for (int r = 0; r < 10; ++r) EXPECT_NEAR(a.logprobs[size_t(r)], ls[size_t(a.tokens[size_t(r)])], 1e-5);
}

TEST(CudaSampling, BadArgumentsAreErrors) {
  KILN_REQUIRE_GPU();
  Buffer b(1024, Device::cuda());
  auto* f = static_cast<float*>(b.data());
  auto* i = static_cast<int32_t*>(b.data());
  auto* sp = static_cast<cuda::SampleParams*>(b.data());
  EXPECT_THROW(cuda::sample(f, 4, 1, 8, sp, i, f, 0, nullptr, nullptr, nullptr), Error);  // ld < V
  EXPECT_THROW(cuda::sample(f, 8, 1, 8, sp, i, f, 21, i, f, nullptr), Error);             // top_n > 20
  EXPECT_THROW(cuda::sample(f, 8, 1, 8, sp, i, f, 2, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace kiln
