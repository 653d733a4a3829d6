// LogitProcessor: one request's logit processing before the draw, on the CPU, in vLLM's order:
//   1. logit_bias: logit[id] += bias                      (OpenAI's map, bias in [-100, 100])
//   2. min_new_tokens: while fewer tokens were generated, every stop id and (unless ignore_eos) EOS is
//      set to -inf                                        (vLLM min_tokens, SGLang min_new_tokens)
//   3. repetition_penalty r over the prompt AND the generated tokens: a logit > 0 is divided by r,
//      one <= 0 multiplied by r                           (HF/vLLM/SGLang's CTRL-style penalty)
//   4. frequency_penalty f over the generated tokens: logit -= f * count(id)
//   5. presence_penalty p over the generated tokens: logit -= p (once, if the id occurs)
//   6. structured output: every id the step's grammar mask does not allow is set to -inf (a bitmask, bit
//      id%32 of word id/32; runtime/grammar_masks.h). Ids the mask allows are not held back by step 2: the
//      grammar decides where a structured output may end.
// Every step is fp32 with one rounding per operation, in this order; the GPU kernel
// (ops/cuda/sampling_penalties.h) computes the same values bit for bit. Temperature, top-k/p and min-p
// come after (token_draw.h), and the reported logprobs are those of the processed logits (module
// comment in sampler.h).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace kiln {

class LogitProcessor {
 public:
  // `masked`: the ids that min_new_tokens holds back (stop ids, plus EOS unless ignore_eos).
  LogitProcessor(const SamplingParams& p, std::span<const int32_t> prompt, std::vector<int32_t> masked);

  // Whether the penalties (3-5) need the token history: the GPU keeps a count table for such rows.
  bool has_penalties() const { return penalties_; }
  // Whether apply() changes anything at all now (penalties, a bias, an active min-token mask, or a grammar
  // mask).
  bool active() const;
  // Step 6's bitmask for the next draw; empty: no grammar constrains it. The engine fills it before the
  // draw and clears it after.
  std::vector<uint32_t>& token_mask() { return token_mask_; }
  const std::vector<uint32_t>& token_mask() const { return token_mask_; }
  // A token the request generated (every accepted token, whichever sampler drew it).
  void observe(int32_t token);

  // Applies 1-6 to a row of logits [vocab] in place.
  void apply(float* logits, int64_t vocab) const;
  // Steps 1-2 as sparse additions, ids ascending and unique (a masked id adds -inf): what the GPU applies
  // before its penalty sweep.
  std::vector<std::pair<int32_t, float>> sparse_adds() const;

  float presence() const { return presence_; }
  float frequency() const { return frequency_; }
  float repetition() const { return repetition_; }
  const std::vector<int32_t>& prompt() const { return prompt_; }
  const std::vector<int32_t>& generated() const { return generated_; }

 private:
  struct Seen {
    int32_t count = 0;  // among the generated tokens
    bool in_prompt = false;
  };
  float presence_, frequency_, repetition_;
  bool penalties_;
  int min_new_tokens_;
  std::vector<std::pair<int32_t, float>> bias_;  // ids ascending, unique
  std::vector<int32_t> masked_;                  // ascending, unique
  std::vector<uint32_t> token_mask_;             // step 6 (empty: none)
  std::vector<int32_t> prompt_, generated_;
  std::unordered_map<int32_t, Seen> seen_;  // only when penalties_
};

// The penalty arithmetic of steps 3-5 on the logit of an id that occurs in the prompt or the output
// (`count` times in the output); every other logit is left as it is.
inline float penalize_logit(float x, int32_t count, float presence, float frequency, float repetition) {
  x = x > 0.0f ? x / repetition : x * repetition;
  const float f = frequency * float(count);
  x = x - f;
  if (count > 0) x = x - presence;
  return x;
}

// Step 6 on one row: logits[id] = -inf for every id in [0, vocab) whose bit (id%32 of words[id/32]) is
// clear; ids past n_words * 32 count as clear. The CPU reference of ops/cuda/logit_mask.h.
void apply_token_bitmask(float* logits, int64_t vocab, const uint32_t* words, size_t n_words);

}  // namespace kiln
