#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "kiln/error.h"

namespace kiln {
namespace {

// The message alone: these reach users (CLI, HTTP 400) as they are.
template <typename... A>
void require(bool ok, const A&... parts) {
  if (!ok) throw_error(detail::concat(parts...));
}

}  // namespace

void validate_sampling_params(const SamplingParams& p) {
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature must be finite and >= 0, got ",
          p.temperature);
  require(std::isfinite(p.top_p) && p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got ",
          p.top_p);
  require(p.top_k >= -1, "top_k must be -1 (disabled), 0 (disabled) or >= 1, got ", p.top_k);
  require(std::isfinite(p.min_p) && p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got ",
          p.min_p);
  require(p.top_logprobs >= 0 && p.top_logprobs <= 20, "top_logprobs must be in [0, 20], got ",
          p.top_logprobs);
  require(std::isfinite(p.presence_penalty) && std::fabs(p.presence_penalty) <= 2.0f,
          "presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  require(std::isfinite(p.frequency_penalty) && std::fabs(p.frequency_penalty) <= 2.0f,
          "frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f && p.repetition_penalty <= 2.0f,
          "repetition_penalty must be in (0, 2], got ", p.repetition_penalty);
  for (const auto& [id, bias] : p.logit_bias)
    require(std::isfinite(bias) && std::fabs(bias) <= 100.0f, "logit_bias for token ", id,
            " must be in [-100, 100], got ", bias);
  require(p.min_new_tokens >= 0 && p.min_new_tokens <= std::max(p.max_new_tokens, 0),
          "min_new_tokens must be in [0, max_new_tokens = ", p.max_new_tokens, "], got ", p.min_new_tokens);
}

Sampler::Sampler(const SamplingParams& p, uint64_t fallback_seed, bool always_logprob,
                 std::span<const int32_t> prompt, std::vector<int32_t> masked)
    : p_(p), proc_(p, prompt, std::move(masked)) {
  validate_sampling_params(p_);
  p_.return_logprob = p_.return_logprob || always_logprob;
  rng_.seed(p_.seed >= 0 ? uint64_t(p_.seed) : fallback_seed);
}

Draw Sampler::sample(std::span<const float> logits) {
  require(!logits.empty(), "sampler: empty logits row");
  if (!proc_.active()) return draw_token(logits.data(), int64_t(logits.size()), p_, rng_);
  scratch_.assign(logits.begin(), logits.end());
  proc_.apply(scratch_.data(), int64_t(scratch_.size()));
  return draw_token(scratch_.data(), int64_t(scratch_.size()), p_, rng_);
}

}  // namespace kiln
