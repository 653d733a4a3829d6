// `kiln eval reference`: greedy outputs and per-token log-probs on a prompt set, stored as a dump
// (--write) or compared with a stored dump: agreement rate, first divergence per prompt, log-prob drift.
//
// Dump (JSON): {"kind": "kiln-eval-reference", "version": 2, "api", "model", "source", "date_utc",
//   "max_tokens", "records": [{"prompt", "text", "tokens": [string], "logprobs": [number],
//   "top": [[[token, logprob], ...], ...]}]}.
// Tokens are strings so dumps from any server compare: /v1/completions gives token strings
// (choices[0].logprobs.tokens / token_logprobs); /generate gives ids (meta_info.output_token_logprobs
// entries [logprob, id, ...]), stored as decimal strings. Compare dumps taken through the same API.
// "top" (version 2) holds, per generated token, the server's top alternatives at that step (asked: 2;
// completions' top_logprobs maps, /generate's meta_info.output_top_logprobs [logprob, id, text]),
// best first; a server that returns fewer gives shorter lists, one that returns none an empty "top".
// Version 1 dumps (no "top") still load.
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "client/http.h"
#include "client/request.h"

namespace kiln::client {

struct RefRecord {
  std::string prompt;
  std::string text;
  std::vector<std::string> tokens;
  std::vector<double> logprobs;  // of the chosen token, one per entry of tokens
  // Per step, the top alternatives (token, logprob), best first; empty when the server gave none,
  // otherwise one list per entry of tokens (a list may be shorter than 2, or empty).
  std::vector<std::vector<std::pair<std::string, double>>> top;
};

// Alternatives asked per step (logprobs: 2 / top_logprobs_num: 2): the chosen token and the runner-up.
constexpr int kRefTopAlternatives = 2;

struct RefDump {
  std::string api = "completions";
  std::string model, source, date_utc;
  int64_t max_tokens = 32;
  std::vector<RefRecord> records;
};

nlohmann::json dump_to_json(const RefDump& d);
RefDump dump_from_json(const nlohmann::json& j);  // throws a clear error on a malformed dump
RefDump load_dump(const std::string& path);

// Built-in prompt set used when no --prompts file is given.
std::vector<std::string> default_reference_prompts();

// One greedy (temperature 0) non-streamed request with log-probs and the top-2 alternatives per step.
RefRecord query_greedy(HttpClient& http, Api api, const std::string& model, const std::string& prompt,
                       int64_t max_tokens);
// Its pieces: the request body, and the record read from a response (OpenAI/vLLM/SGLang shapes; throws a
// clear error on a malformed one).
nlohmann::json greedy_request_body(Api api, const std::string& model, const std::string& prompt,
                                   int64_t max_tokens);
RefRecord record_from_response(Api api, const std::string& prompt, const nlohmann::json& response);

// Default --tie-margin, in nats. Two correct bf16 runs (different GEMM tactics at different batch sizes)
// drift by about 0.01 in mean |d logprob| on their common prefix (H200, Qwen3-4B shape: 0.011), a few
// times that at the tail; a flip needs the top-1/top-2 gap to move by the sum of two such drifts. 0.05
// is about 4-5x the mean drift: flips inside it are what rounding does, and a real bug (wrong token,
// wrong position, stale cache) almost never lands on the runner-up of a step that close.
constexpr double kDefaultTieMargin = 0.05;

struct PromptComparison {
  size_t index = 0;
  int64_t first_divergence =
      -1;  // first position where the tokens differ (or one output ends); -1: identical
  size_t ref_tokens = 0, got_tokens = 0;
  std::string ref_token, got_token;              // at the divergence ("" past an end)
  double max_abs_drift = 0, mean_abs_drift = 0;  // |logprob difference| over the common prefix
  // At the divergence, from the reference's top alternatives of that step: its margin (its token's
  // logprob minus the best other alternative's, i.e. top-1 - top-2 under greedy; NaN when unknown: no top
  // data, fewer than 2 alternatives, or the reference ended there), and whether the candidate's token is
  // that runner-up. A near tie: the runner-up with ref_margin <= tie_margin.
  double ref_margin = std::numeric_limits<double>::quiet_NaN();
  bool got_was_runner_up = false;
  bool near_tie = false;
  // The same margin seen from the candidate (its token against its best other alternative); NaN: unknown.
  double got_margin = std::numeric_limits<double>::quiet_NaN();
};

struct ReferenceReport {
  size_t prompts = 0, identical = 0;
  double agreement_rate = 0;   // identical / prompts
  double token_agreement = 0;  // tokens before the first divergence / reference tokens
  double mean_abs_drift = 0;   // over all common-prefix positions of all prompts
  double max_abs_drift = 0;
  double tie_margin = kDefaultTieMargin;
  size_t near_tie_divergences = 0;  // divergences classified as near ties
  size_t other_divergences = 0;     // every other divergence (including unknown_margin ones)
  size_t unknown_margin = 0;        // divergences where the reference has no top-2 data for the step
  std::vector<PromptComparison> per_prompt;
};

ReferenceReport compare_dumps(const RefDump& ref, const RefDump& got, double tie_margin = kDefaultTieMargin);
// The summary line: "divergences: N at near ties (margin <= X, ...), M other[ (K without top-2 data)]".
std::string near_tie_summary(const ReferenceReport& r);
nlohmann::json report_to_json(const ReferenceReport& r);

}  // namespace kiln::client
