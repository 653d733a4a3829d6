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
#include "spec/categorical.h"

namespace kiln {

struct Draw {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // when top_logprobs > 0
};

Draw draw_token(const float* logits, int64_t vocab, const SamplingParams& params, std::mt19937_64& rng);

// The two halves of draw_token, for speculative verification (spec/verify.h), which must judge drafts against
// exactly what draw_token would draw from. greedy_token: the temperature-0 choice (lowest id among the
// maximal logits; NaN never wins). token_distribution (temperature > 0): softmax(logits / T) with top-k,
// top-p and min-p applied; draw_token's draw is out->draw(u) for one uniform u.
int32_t greedy_token(const float* logits, int64_t vocab);
void token_distribution(const float* logits, int64_t vocab, const SamplingParams& params,
                        spec::Categorical* out);
// draw_token's reporting for out->token: its logprob and, when asked, the top alternatives (nothing when the
// params ask for neither).
void token_logprobs(const float* logits, int64_t vocab, const SamplingParams& params, Draw* out);

}  // namespace kiln
