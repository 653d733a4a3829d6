// `kiln bench ab`: A1 -> B -> A2 windows on identical workloads (same prompts, same order, same
// concurrency; each window warms up and flushes the cache first). The change of B against mean(A1, A2)
// cancels a linear drift of A over time. Per-request metrics (TTFT, TPOT, E2E) get a paired bootstrap 95%
// interval: request i carries the same prompt in all three windows, so one index draw resamples all three.
// Window-level throughput has one value per window and is reported as a point change only.
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
  int resamples = 2000;
  uint64_t bootstrap_seed = 12345;
};

struct AbMetric {
  std::string name;  // e.g. "ttft_ms.median"
  bool lower_is_better = true;
  double a1 = 0, b = 0, a2 = 0;
  bool has_interval = false;
  Interval change;  // relative: B / mean(A1, A2) - 1 (point, and lo/hi when has_interval)
};

struct AbResult {
  std::string date_utc;
  LevelMetrics a1, b, a2;
  size_t paired = 0;  // requests that succeeded in all three windows (the bootstrap sample)
  bool valid = false;
  std::vector<std::string> notes;
  std::vector<AbMetric> metrics;
};

// The comparison alone, from three finished windows over the same specs (testable without a server).
AbResult compare_windows(const Window& a1, const Window& b, const Window& a2, int resamples, uint64_t seed);

AbResult run_ab(const AbOptions& opt);

nlohmann::json ab_to_json(const AbOptions& opt, const AbResult& r);
std::string ab_to_markdown(const AbOptions& opt, const AbResult& r);

}  // namespace kiln::client
