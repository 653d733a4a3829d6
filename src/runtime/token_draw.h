// draw_token: picks one token from a row of logits under SamplingParams, on the CPU, with a
// per-request generator so a seeded request draws the same tokens whatever it is batched with.
// Order of operations (SGLang/vLLM's): temperature 0 -> argmax (lowest id on ties); else logits /
// temperature -> softmax -> top-k -> top-p (smallest set whose mass reaches top_p) -> min-p -> renormalise
// -> inverse-CDF draw. The reported logprob is the token's log-softmax of the logits given (before
// temperature and the filters; the Sampler gives it the processed row), and top alternatives are the
// highest such log-probabilities, ids ascending on ties.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/engine.h"

namespace kiln {

struct Draw {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // when top_logprobs > 0
};

Draw draw_token(const float* logits, int64_t vocab, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace kiln
