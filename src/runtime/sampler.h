// Sampler: one request's token sampler on the CPU. It owns the request's generator (std::mt19937_64
// seeded with the request's seed, or a caller-chosen fallback when seed is -1), so a seeded request draws
// the same tokens whatever else is batched with it. The draw itself is draw_token (token_draw.h): greedy
// at temperature 0 (lowest id on ties), else temperature -> top-k -> top-p -> min-p -> inverse-CDF draw.
// Before the draw the request's LogitProcessor (logit_bias, min_new_tokens, repetition / frequency /
// presence penalties: logit_processor.h) rewrites a copy of the row. The reported logprob is the natural
// log-softmax of those PROCESSED logits, before temperature, top-k, top-p and min-p: with no bias, mask
// or penalty that is the model's raw distribution (OpenAI's logprobs, vLLM's "raw_logprobs"); with them,
// the distribution the request actually asked for (a token forced by logit_bias reports about 0), as
// SGLang reports and as vLLM's "processed_logprobs" mode does, less the temperature. Top alternatives
// likewise.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "runtime/engine.h"
#include "runtime/logit_processor.h"
#include "runtime/token_draw.h"

namespace kiln {

// Throws kiln::Error naming the first bad field: temperature finite >= 0, top_p in (0, 1], top_k -1 or
// >= 0, min_p in [0, 1], top_logprobs in [0, 20], presence/frequency_penalty in [-2, 2],
// repetition_penalty in (0, 2], logit_bias values in [-100, 100], min_new_tokens in [0, max_new_tokens].
// (Token ids are checked against the vocabulary by the engine.)
void validate_sampling_params(const SamplingParams& p);

class Sampler {
 public:
  // Validates p. The logprob of the chosen token is computed unless always_logprob is false and p does
  // not ask for it (the engine's case: a log-softmax over a 152k vocabulary per row is not free).
  // `prompt` feeds the repetition penalty; `masked` are the ids min_new_tokens holds back.
  Sampler(const SamplingParams& p, uint64_t fallback_seed, bool always_logprob = true,
          std::span<const int32_t> prompt = {}, std::vector<int32_t> masked = {});
  // One draw from a row of logits (f32 [vocab], finite), processed first (the row itself is not changed).
  Draw sample(std::span<const float> logits);
  // Every token the request generated, in order (drawn here or by a device sampler): the penalties'
  // history and the min_new_tokens count.
  void observe(int32_t token) { proc_.observe(token); }
  const SamplingParams& params() const { return p_; }
  const LogitProcessor& processor() const { return proc_; }
  LogitProcessor& processor() { return proc_; }  // the engine sets the grammar mask of the next draw
  // The request's generator: speculative verification (runtime/engine_spec.cpp) draws from it too.
  std::mt19937_64& generator() { return rng_; }

 private:
  SamplingParams p_;
  LogitProcessor proc_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;  // the processed row
};

}  // namespace kiln
