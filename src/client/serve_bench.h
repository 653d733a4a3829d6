// `kiln bench serve`: a concurrency sweep against any OpenAI-compatible / SGLang-style server.
//
// Per level C: max(64, C) warm-up requests (short outputs, a prompt stream of their own) at concurrency C,
// then POST /flush_cache (skipped, with a note, where the server lacks it), then num_prompts measured
// requests kept C in flight. A level is valid only when every measured request completed with exactly the
// asked input and output token counts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "client/request.h"
#include "client/stats.h"
#include "client/workload.h"

namespace kiln::client {

struct RunOptions {
  std::string base_url;
  std::string api_key;
  StreamOptions stream;
  double timeout_s = 3600;  // per request
  bool progress = true;     // draw the bar (it is drawn only on a TTY anyway)
};

struct RunOutput {
  std::vector<RequestResult> results;  // results[i] answers specs[i]
  double duration_s = 0;               // first send to last completion
};

// Sends specs with `concurrency` workers, each holding one connection and taking the next request as
// soon as its previous one ends.
RunOutput run_concurrent(const RunOptions& opt, const std::vector<RequestSpec>& specs, int concurrency,
                         const std::string& label);

struct LevelMetrics {
  int concurrency = 0;
  size_t num_prompts = 0;
  size_t exact = 0;       // completed with exactly the asked counts
  size_t failed = 0;      // errors (HTTP, transport, malformed stream)
  size_t mismatched = 0;  // completed, but with other token counts than asked
  bool valid = false;
  std::vector<std::string> notes;
  double duration_s = 0;
  double output_tok_s = 0, input_tok_s = 0, req_s = 0;  // over requests that completed
  int64_t output_tokens = 0, input_tokens = 0;
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

// Metrics of one measured window; the accounting notes name at most a few failing requests.
LevelMetrics compute_level(int concurrency, const std::vector<RequestSpec>& specs, const RunOutput& run);

struct SweepOptions {
  RunOptions run;
  Workload workload;
  std::vector<int> concurrency{1, 4, 8, 16, 32, 64, 128};
  std::vector<size_t> num_prompts;  // per level; empty: default_num_prompts(C)
  int64_t warmups = -1;             // per level; -1: max(64, C)
  int64_t warmup_output_len = -1;   // -1: min(output_len, 16)
  bool flush_cache = true;
};

struct SweepResult;
// Called after each level with the levels so far (e.g. to write partial outputs of a long sweep).
using LevelCallback = std::function<void(const SweepResult&)>;

// The default counts: 30, 40, 80, 80, 160, 320, 640 for C = 1, 4, 8, 16, 32, 64, 128; other C:
// max(30, 5C).
size_t default_num_prompts(int concurrency);

struct Window {
  LevelMetrics metrics;
  std::vector<RequestSpec> specs;
  RunOutput run;
};

// Warm-ups, cache flush, then the measured window of n requests from prompt stream `tag`. Notes about
// warm-ups and the flush are appended to window.metrics.notes.
Window run_window(const SweepOptions& opt, int concurrency, size_t n, uint64_t tag, const std::string& label);

struct SweepResult {
  std::string date_utc;
  std::vector<LevelMetrics> levels;
};
// Fails fast when the server does not answer at all; a level that cannot run (e.g. every warm-up failed,
// the server went away) is recorded as invalid with the reason, and the sweep goes on.
SweepResult run_sweep(const SweepOptions& opt, const LevelCallback& on_level = {});

// Throws a clear error when nothing answers HTTP at the base URL.
void check_reachable(const RunOptions& opt);

// POST /flush_cache (or vLLM's /reset_prefix_cache): "" when flushed, otherwise a note saying why not.
std::string flush_cache(const RunOptions& opt);

// "http://..." /v1/models' first id, or "" when the server does not answer it.
std::string discover_model(const RunOptions& opt);

std::string utc_now_iso();

}  // namespace kiln::client
