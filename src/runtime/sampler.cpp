#include "runtime/sampler.h"

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
}

Sampler::Sampler(const SamplingParams& p, uint64_t fallback_seed, bool always_logprob) : p_(p) {
  validate_sampling_params(p_);
  p_.return_logprob = p_.return_logprob || always_logprob;
  rng_.seed(p_.seed >= 0 ? uint64_t(p_.seed) : fallback_seed);
}

Draw Sampler::sample(std::span<const float> logits) {
  require(!logits.empty(), "sampler: empty logits row");
  return draw_token(logits.data(), int64_t(logits.size()), p_, rng_);
}

}  // namespace kiln
