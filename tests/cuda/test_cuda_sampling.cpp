// GPU sampling: greedy = argmax (lowest id on ties), log-probabilities = log_softmax in fp64 within 1e-4,
// top-k / top-p keep exactly the intended set, seeds reproduce, and temperature sampling follows softmax
// (a chi-square bound over 4000 draws of a 6-token distribution). Logit processing (bias, min-token mask,
// repetition / frequency / presence penalties) through DevicePenalties equals the CPU LogitProcessor bit
// for bit over several steps whose history grows on the device, after host-drawn steps, row reuse and
// count-table growth; greedy on the processed row equals the CPU's choice.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include "ops/cuda/sampling.h"
#include "ops/cuda/sampling_penalties.h"
#include "runtime/device_penalties.h"
#include "runtime/logit_processor.h"
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

// The processors of one batch: every combination of penalties, a bias, a min-token mask, none at all.
std::vector<SamplingParams> penalty_params(int R) {
  std::vector<SamplingParams> v(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    SamplingParams& p = v[size_t(r)];
    p.max_new_tokens = 100;
    if (r % 6 == 5) continue;  // no processing: the row must come back untouched
    p.presence_penalty = r % 2 ? 1.25f : -0.5f;
    p.frequency_penalty = r % 3 ? 0.3f : -1.7f;
    p.repetition_penalty = r % 4 == 0 ? 1.0f : 0.4f + 0.3f * float(r % 5);
    if (r % 3 == 1) p.logit_bias = {{int32_t(7 + r), 4.5f}, {int32_t(151000 - r), -30.0f}};
    if (r % 4 == 2) p.min_new_tokens = 3;
    if (r == 4) p.presence_penalty = p.frequency_penalty = 0, p.repetition_penalty = 1;  // bias only
  }
  return v;
}

TEST(CudaSampling, PenaltiesEqualTheCpuProcessorBitForBitAsTheHistoryGrows) {
  KILN_REQUIRE_GPU();
  const int64_t V = 151936;
  const int R = 20;  // more penalized rows than the table's first 8: it grows (and copies) mid-step
  std::mt19937 g(3);
  std::vector<SamplingParams> sp = penalty_params(R);
  std::vector<std::unique_ptr<LogitProcessor>> procs;
  std::vector<ModelRunner::RowSampling> rows(static_cast<size_t>(R));
  auto fresh = [&](int r, uint64_t request) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 50 + r; ++i) prompt.push_back(int32_t(g() % 2000));  // repeats among them
    procs[size_t(r)] =
        std::make_unique<LogitProcessor>(sp[size_t(r)], prompt, std::vector<int32_t>{151643, 3});
    rows[size_t(r)].proc = procs[size_t(r)].get();
    rows[size_t(r)].request = request;
  };
  procs.resize(size_t(R));
  for (int r = 0; r < R; ++r) fresh(r, uint64_t(r + 1));
  DevicePenalties dp(Device::cuda(), V);
  Buffer tok(size_t(R) * 4, Device::cuda()), lp(size_t(R) * 4, Device::cuda());
  const std::vector<cuda::SampleParams> greedy(static_cast<size_t>(R));
  Buffer params = to_device(greedy);
  for (int step = 0; step < 7; ++step) {
    // Logits whose maxima the processing moves: the prompt ids and recent outputs score high.
    std::vector<float> logits = random_logits(R * V, uint32_t(10 + step), 2.0f);
    for (int r = 0; r < R; ++r)
      for (int32_t t : procs[size_t(r)]->prompt()) logits[size_t(r) * size_t(V) + size_t(t)] += 6.0f;
    Buffer dl = to_device(logits);
    auto* d = static_cast<float*>(dl.data());
    ASSERT_TRUE(dp.apply(d, V, rows, nullptr));
    cuda::sample(d, V, R, V, static_cast<const cuda::SampleParams*>(params.data()),
                 static_cast<int32_t*>(tok.data()), static_cast<float*>(lp.data()), 0, nullptr, nullptr,
                 nullptr);
    dp.count_sampled(static_cast<int32_t*>(tok.data()), R, nullptr);
    const std::vector<float> got = to_host<float>(dl, size_t(R * V));
    const std::vector<int32_t> tokens = to_host<int32_t>(tok, size_t(R));
    for (int r = 0; r < R; ++r) {
      std::vector<float> want(logits.begin() + r * V, logits.begin() + (r + 1) * V);
      procs[size_t(r)]->apply(want.data(), V);
      const float* row = got.data() + size_t(r) * size_t(V);
      int bad = 0;
      for (int64_t i = 0; i < V && bad < 3; ++i)
        if (std::memcmp(&row[i], &want[size_t(i)], 4) != 0) {
          ++bad;
          ADD_FAILURE() << "step " << step << " row " << r << " id " << i << ": " << row[i] << " vs "
                        << want[size_t(i)];
        }
      const int64_t am = std::max_element(want.begin(), want.end()) - want.begin();
      EXPECT_EQ(tokens[size_t(r)], am) << "step " << step << " row " << r;
      procs[size_t(r)]->observe(tokens[size_t(r)]);
    }
    if (step == 2) procs[0]->observe(42);  // a host-drawn token the device has not seen: uploaded next step
    if (step == 3) {  // row 1's request ends; a new one takes the freed (and re-zeroed) count row
      dp.release(rows[1].request);
      fresh(1, 1000);
    }
  }
  EXPECT_EQ(dp.count_rows_in_use(), 16);  // rows 4 (bias only) and 5, 11, 17 (none) hold no count row
  for (int r = 0; r < R; ++r) dp.release(rows[size_t(r)].request);
  EXPECT_EQ(dp.count_rows_in_use(), 0);
}

TEST(CudaSampling, PenaltyKernelsSkipWhatTheyShould) {
  KILN_REQUIRE_GPU();
  const int64_t V = 1000;
  std::vector<float> x = random_logits(2 * V, 9, 1.0f);
  std::vector<uint32_t> counts(static_cast<size_t>(V), 0);
  counts[5] = cuda::kPromptBit;      // prompt only: repetition, no presence
  counts[6] = 2;                     // generated twice
  counts[7] = cuda::kPromptBit | 1;  // both
  std::vector<cuda::PenaltyRow> rows = {{.count_row = 0,
                                         .adds_begin = 0,
                                         .adds_end = 2,
                                         .presence = 0.5f,
                                         .frequency = 0.25f,
                                         .repetition = 2.0f},
                                        {.count_row = -1, .adds_begin = 2, .adds_end = 3}};
  const std::vector<int32_t> ids = {5, 2000, 9};  // 2000 is outside the vocabulary: skipped
  const std::vector<float> vals = {1.0f, 3.0f, -2.0f};
  Buffer dx = to_device(x), dr = to_device(rows), di = to_device(ids), dv = to_device(vals),
         dc = to_device(counts);
  cuda::apply_penalties(static_cast<float*>(dx.data()), V, 2, V, static_cast<cuda::PenaltyRow*>(dr.data()),
                        static_cast<int32_t*>(di.data()), static_cast<float*>(dv.data()),
                        static_cast<uint32_t*>(dc.data()), nullptr);
  const auto y = to_host<float>(dx, size_t(2 * V));
  auto rep = [](float v) { return v > 0 ? v / 2.0f : v * 2.0f; };
  for (int64_t i = 0; i < V; ++i) {
    float want = x[size_t(i)];
    if (i == 5) want = rep(want + 1.0f);
    if (i == 6) want = rep(want) - 0.25f * 2.0f - 0.5f;
    if (i == 7) want = rep(want) - 0.25f - 0.5f;
    EXPECT_EQ(y[size_t(i)], want) << i;
    EXPECT_EQ(y[size_t(V + i)], x[size_t(V + i)] + (i == 9 ? -2.0f : 0.0f)) << i;
  }
  // count_tokens: repeated pairs all count; prompt marks OR in; negative rows and bad ids are skipped.
  const std::vector<int32_t> crow = {0, 0, -1, 0, 0}, cid = {3, 3, 3, 4000, 8};
  Buffer dcr = to_device(crow), dci = to_device(cid);
  cuda::count_tokens(static_cast<uint32_t*>(dc.data()), V, static_cast<int32_t*>(dcr.data()),
                     static_cast<int32_t*>(dci.data()), 5, false, nullptr);
  cuda::count_tokens(static_cast<uint32_t*>(dc.data()), V, static_cast<int32_t*>(dcr.data()),
                     static_cast<int32_t*>(dci.data()), 5, true, nullptr);
  const auto c = to_host<uint32_t>(dc, size_t(V));
  EXPECT_EQ(c[3], cuda::kPromptBit | 2u);
  EXPECT_EQ(c[8], cuda::kPromptBit | 1u);
  EXPECT_EQ(c[6], 2u);
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
