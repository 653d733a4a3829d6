// Log-probabilities of chosen token rows, taken from the step that runs anyway: the prompt's own tokens
// (vLLM's prompt_logprobs, SGLang's input_token_logprobs, OpenAI completions' echo + logprobs) and a
// reranker's yes/no scores (Request::score_ids). Never a second forward.
//
// Contract of one query (row r of a step, ids, top_n), on every backend:
//   x = the row's f32 logits [vocab]; m = max x; lse = m + log(sum_i exp(x_i - m)) (the sum in f64 on the
//   host, f32 on the device: a difference within 1e-5 relative, tests/cuda/test_cuda_row_logprobs.cpp);
//   logprob(id) = x[id] - lse in f32; rank(id) = 1 + #{i : x_i > x[id]};
//   top = the top_n largest x, descending, ties by lowest id, each with x_i - lse.
// Memory: a request asking prompt logprobs is prefilled at most kPromptLogprobChunk tokens per step, so a
// step's query rows are bounded whatever the chunked-prefill size; Qwen3Runner reduces them on the device
// kRowLogprobGroup rows at a time and copies back only the answers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace kiln {

inline constexpr int32_t kPromptLogprobChunk = 512;  // prompt tokens per step of a prompt-logprobs request
inline constexpr int32_t kRowLogprobGroup = 64;      // query rows per device LM-head pass (Qwen3Runner)
inline constexpr int kMaxPromptTopLogprobs = 20;
inline constexpr size_t kMaxScoreIds = 16;

struct LogprobQuery {
  int32_t row = 0;           // token row of the step's batch
  std::vector<int32_t> ids;  // ids whose log-probabilities are wanted
  int32_t top_n = 0;         // and this many most likely ids
};

struct RowLogprobs {
  std::vector<float> logprobs;  // per query id
  std::vector<int32_t> ranks;   // per query id
  std::vector<TokenLogprob> top;
};

// submit()'s checks of Request::prompt_logprobs_from, prompt_top_logprobs and score_ids (kiln::Error naming
// the field; max_prompt_logprob_tokens names EngineOptions' limit).
void validate_prompt_queries(const Request& r, int64_t vocab, int64_t max_prompt_logprob_tokens);

// The host reference of the contract above, on one row of logits.
RowLogprobs row_logprobs(std::span<const float> logits, const std::vector<int32_t>& ids, int top_n);

}  // namespace kiln
