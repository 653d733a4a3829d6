// The A/B comparison on synthetic windows (no server): drift cancellation over crossover rounds, exact
// scale changes, pairing when requests fail, and validity.
#include <gtest/gtest.h>

#include "client/ab.h"
#include "kiln/error.h"

using namespace kiln::client;

namespace {

// A window of n requests with TTFT = ttft(i) ms and TPOT = tpot(i) ms over 5 output tokens.
template <typename F, typename G>
Window window(size_t n, F ttft, G tpot, bool valid = true) {
  Window w;
  w.specs.resize(n);
  w.run.results.resize(n);
  for (size_t i = 0; i < n; ++i) {
    RequestResult& r = w.run.results[i];
    r.ok = true;
    r.completion_tokens = 5;
    r.prompt_tokens = 10;
    r.ttft_s = ttft(i) * 1e-3;
    r.e2e_s = r.ttft_s + 4 * tpot(i) * 1e-3;
  }
  w.metrics.valid = valid;
  w.metrics.output_tok_s = 100;
  w.metrics.req_s = 20;
  return w;
}

const AbMetric& metric(const AbResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return m;
  throw std::runtime_error("no metric " + name);
}

}  // namespace

TEST(ClientAb, ExactScaleChangeForEveryReducer) {
  auto base = [](size_t i) { return 10.0 + double(i % 5); };
  const Window a = window(20, base, base);
  const Window b = window(
      20, [&](size_t i) { return 1.5 * base(i); }, [&](size_t i) { return 0.8 * base(i); });
  const AbResult r = compare_windows({a, a}, {b}, 300, 1);
  EXPECT_TRUE(r.valid);
  EXPECT_EQ(r.paired, 20u);
  for (const char* red : {"mean", "median", "p95", "p99"}) {
    const AbMetric t = metric(r, std::string("ttft_ms.") + red);
    EXPECT_TRUE(t.has_interval);
    EXPECT_NEAR(t.change.point, 0.5, 1e-9) << red;
    EXPECT_NEAR(t.change.lo, 0.5, 1e-9) << red;
    EXPECT_NEAR(t.change.hi, 0.5, 1e-9) << red;
    EXPECT_NEAR(metric(r, std::string("tpot_ms.") + red).change.point, -0.2, 1e-9) << red;
  }
  EXPECT_NEAR(metric(r, "output_tok_s").change.point, 0, 1e-12);
  EXPECT_FALSE(metric(r, "output_tok_s").has_interval);
}

TEST(ClientAb, CrossoverCancelsLinearDrift) {
  // Windows at times 0..4 (A1 B1 A2 B2 A3); every request slows down by 1 ms per window. B equals A at the
  // same time, so the change must be exactly zero although B's raw TTFTs differ from every single A window.
  auto at = [](double t) { return [t](size_t i) { return 20.0 + double(i % 7) + t; }; };
  const std::vector<Window> a = {window(14, at(0), at(0)), window(14, at(2), at(2)),
                                 window(14, at(4), at(4))};
  const std::vector<Window> b = {window(14, at(1), at(1)), window(14, at(3), at(3))};
  const AbResult r = compare_windows(a, b, 500, 9);
  EXPECT_EQ(r.paired, 28u);  // 2 rounds x 14 requests
  const AbMetric m = metric(r, "ttft_ms.mean");
  EXPECT_NEAR(m.change.point, 0, 1e-12);
  EXPECT_NEAR(m.change.lo, 0, 1e-12);
  EXPECT_NEAR(m.change.hi, 0, 1e-12);
  EXPECT_NEAR(m.b, (m.a1 + m.a2) / 2, 1e-12);
  EXPECT_EQ(r.a.size(), 3u);
  EXPECT_EQ(r.b.size(), 2u);
}

TEST(ClientAb, FailedRequestsLeaveThePairingAndInvalidWindowsAreFlagged) {
  auto c = [](size_t) { return 10.0; };
  Window a1 = window(6, c, c), b = window(6, c, c), a2 = window(6, c, c, /*valid=*/false);
  b.run.results[2].ok = false;
  a1.run.results[4].ttft_s = -1;  // no output chunk arrived
  const AbResult r = compare_windows({a1, a2}, {b}, 100, 1);
  EXPECT_EQ(r.paired, 4u);
  EXPECT_FALSE(r.valid);
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_NE(r.notes[0].find("INVALID"), std::string::npos);
  EXPECT_NE(r.notes[1].find("2 (round, request) units"), std::string::npos) << r.notes[1];
  EXPECT_THROW(compare_windows({a1}, {b}, 100, 1), kiln::Error);                   // K B needs K + 1 A
  EXPECT_THROW(compare_windows({a1, window(5, c, c)}, {b}, 100, 1), kiln::Error);  // different sizes
}
