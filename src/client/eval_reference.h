// `kiln eval reference`: greedy outputs and per-token log-probs on a prompt set, stored as a dump
// (--write) or compared with a stored dump: agreement rate, first divergence per prompt, log-prob drift.
//
// Dump (JSON): {"kind": "kiln-eval-reference", "version": 1, "api", "model", "source", "date_utc",
//   "max_tokens", "records": [{"prompt", "text", "tokens": [string], "logprobs": [number]}]}.
// Tokens are strings so dumps from any server compare: /v1/completions gives token strings
// (choices[0].logprobs.tokens / token_logprobs); /generate gives ids (meta_info.output_token_logprobs
// entries [logprob, id, ...]), stored as decimal strings. Compare dumps taken through the same API.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/http.h"
#include "client/request.h"

namespace kiln::client {

struct RefRecord {
  std::string prompt;
  std::string text;
  std::vector<std::string> tokens;
  std::vector<double> logprobs;  // of the chosen token, one per entry of tokens
};

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

// One greedy (temperature 0) non-streamed request with log-probs.
RefRecord query_greedy(HttpClient& http, Api api, const std::string& model, const std::string& prompt,
                       int64_t max_tokens);

struct PromptComparison {
  size_t index = 0;
  int64_t first_divergence =
      -1;  // first position where the tokens differ (or one output ends); -1: identical
  size_t ref_tokens = 0, got_tokens = 0;
  std::string ref_token, got_token;              // at the divergence ("" past an end)
  double max_abs_drift = 0, mean_abs_drift = 0;  // |logprob difference| over the common prefix
};

struct ReferenceReport {
  size_t prompts = 0, identical = 0;
  double agreement_rate = 0;   // identical / prompts
  double token_agreement = 0;  // tokens before the first divergence / reference tokens
  double mean_abs_drift = 0;   // over all common-prefix positions of all prompts
  double max_abs_drift = 0;
  std::vector<PromptComparison> per_prompt;
};

ReferenceReport compare_dumps(const RefDump& ref, const RefDump& got);
nlohmann::json report_to_json(const ReferenceReport& r);

}  // namespace kiln::client
