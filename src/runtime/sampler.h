// Sampler: one request's token sampler on the CPU. It owns the request's generator (std::mt19937_64
// seeded with the request's seed, or a caller-chosen fallback when seed is -1), so a seeded request draws
// the same tokens whatever else is batched with it. The draw itself is draw_token (token_draw.h): greedy
// at temperature 0 (lowest id on ties), else temperature -> top-k -> top-p -> min-p -> inverse-CDF draw.
// The reported logprob is the natural log-softmax of the RAW logits (vLLM's default "raw logprobs",
// OpenAI's logprobs), whatever the sampling parameters; top alternatives likewise.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "runtime/engine.h"
#include "runtime/token_draw.h"

namespace kiln {

// Throws kiln::Error naming the first bad field: temperature finite >= 0, top_p in (0, 1], top_k -1 or
// >= 0, min_p in [0, 1], top_logprobs in [0, 20].
void validate_sampling_params(const SamplingParams& p);

class Sampler {
 public:
  // Validates p. The logprob of the chosen token is computed unless always_logprob is false and p does
  // not ask for it (the engine's case: a log-softmax over a 152k vocabulary per row is not free).
  Sampler(const SamplingParams& p, uint64_t fallback_seed, bool always_logprob = true);
  // One draw from a row of logits (f32 [vocab], finite).
  Draw sample(std::span<const float> logits);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace kiln
