// `kiln bench ab`: A1 -> B -> A2 windows on identical workloads (same prompts, same order, same
// concurrency; each window warms up and flushes the cache first). The change of B against mean(A1, A2)
// cancels a linear drift of A over time. With rounds K > 1 the windows cross over: A1 B1 A2 B2 ... A(K+1),
// and B_k is flanked by A_k and A_(k+1).
// Per-request metrics (TTFT, TPOT, E2E) get a paired bootstrap 95% interval: a unit is (round k, request i)
// and carries A_k[i], B_k[i], A_(k+1)[i] for the same prompt; resampling units keeps the triples together.
// The statistic is f(B) / ((f(A left) + f(A right)) / 2) - 1 over the pooled units, f = mean, median, p95
// or p99. Window-level throughput has one value per window and is reported as a point change only.
// The interval covers request-to-request variation within the windows; drift that is not linear within
// a round is not in it (more rounds average it out).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/serve_bench.h"
#include "client/stats.h"

namespace kiln::client {

struct AbOptions {
  SweepOptions sweep;  // workload, warm-ups, flush; sweep.run.base_url is ignored
  std::string url_a, url_b;
  std::string model_a, model_b;  // "model" for /v1/completions per server
  int concurrency = 16;
  size_t num_prompts = 80;
  int rounds = 1;  // K: windows A1 B1 ... BK A(K+1)
  int resamples = 2000;
  uint64_t bootstrap_seed = 12345;
};

struct AbMetric {
  std::string name;  // e.g. "ttft_ms.median"
  bool lower_is_better = true;
  double a1 = 0, b = 0, a2 = 0;  // f over the A windows left of each B, over the Bs, right of each B
  bool has_interval = false;
  Interval change;  // relative: B / mean(A1, A2) - 1 (point, and lo/hi when has_interval)
};

struct AbResult {
  std::string date_utc;
  std::vector<LevelMetrics> a, b;  // K + 1 A windows and K B windows, in time order A1 B1 A2 ...
  size_t paired = 0;  // (round, request) units that succeeded in their three windows (the bootstrap sample)
  bool valid = false;
  std::vector<std::string> notes;
  std::vector<AbMetric> metrics;
};

// The comparison alone, from finished windows over the same specs (testable without a server):
// a.size() == b.size() + 1.
AbResult compare_windows(const std::vector<Window>& a, const std::vector<Window>& b, int resamples,
                         uint64_t seed);

AbResult run_ab(const AbOptions& opt);

nlohmann::json ab_to_json(const AbOptions& opt, const AbResult& r);
std::string ab_to_markdown(const AbOptions& opt, const AbResult& r);

}  // namespace kiln::client
