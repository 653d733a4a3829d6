// Prompt log-probabilities on the HTTP routes: the request fields that ask for them and the response shapes.
// The engine computes them in the prefill (runtime/prompt_logprobs.h); the server asks and renders.
//
//   vLLM prompt_logprobs: k (0..20) on /v1/completions and /v1/chat/completions: every prompt position
//     from 1 with its token and the k most likely; the reply's prompt_logprobs (completions: per choice;
//     chat: top level) is [null, {"<id>": {logprob, rank, decoded_token}, ...}, ...], one entry per prompt
//     token. With "stream": true it is a 400 (as in vLLM).
//   OpenAI completions echo + logprobs k: the choice's logprobs lists start with the prompt's tokens
//     (token_logprobs[0] and top_logprobs[0] null; each top dict holds the k most likely and the prompt's
//     own token; text_offset counts characters from the prompt's start), then the generated ones: what
//     lm-eval-harness' loglikelihood reads (token_logprobs[ctxlen:-1]). With "stream": true it is a 400.
//   SGLang /generate return_logprob + logprob_start_len s (default -1: the last prompt token) +
//     top_logprobs_num k: meta_info.input_token_logprobs = [[logprob, id, text|null], ...] for prompt
//     positions s.. (the first entry's logprob null, as SGLang gives it), and input_top_logprobs (null
//     first, then lists of [logprob, id, text|null]) when k > 0. s past the prompt is clamped to its last
//     token.
// The count of positions asked is bounded by the engine's max_prompt_logprob_tokens (a 400 naming it).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/engine.h"
#include "server/backend.h"
#include "server/protocol.h"

namespace kiln::server {

// vLLM's prompt_logprobs field (OpenAI routes), read into g.
void parse_vllm_prompt_logprobs(const nlohmann::json& body, GenSpec& g);
// Completions: echo with logprobs asks the prompt's logprobs at `top` alternatives.
void ask_echo_logprobs(GenSpec& g, int top);
// /generate: logprob_start_len (with return_logprob), read into g.
void parse_sglang_input_logprobs(const nlohmann::json& body, GenSpec& g);
// Request::prompt_logprobs_from for g's prompt (-1: none asked).
int32_t engine_prompt_logprobs_from(const GenSpec& g);

// [null, {...}, ...]: one entry per prompt token (vLLM).
nlohmann::json vllm_prompt_logprobs(const std::vector<int32_t>& prompt,
                                    const std::vector<PromptTokenLogprob>& lp, const TextCodec& codec);
// Completions echo: the prompt's entries put before the generated ones in `logprobs` (a completions
// logprobs object whose text_offset values already start after the prompt's characters).
void prepend_echo_logprobs(nlohmann::json& logprobs, const std::vector<int32_t>& prompt,
                           const std::vector<PromptTokenLogprob>& lp, const TextCodec& codec);
// Characters of the prompt's token texts (where the generated tokens' text_offset starts under echo).
size_t prompt_text_offset(const std::vector<int32_t>& prompt, const TextCodec& codec);
// /generate: meta_info.input_token_logprobs (and input_top_logprobs) into `meta`.
void add_sglang_input_logprobs(nlohmann::json& meta, const GenSpec& g,
                               const std::vector<PromptTokenLogprob>& lp, const TextCodec& codec);

}  // namespace kiln::server
