#include "runtime/logit_processor.h"

#include <algorithm>
#include <limits>

namespace kiln {

LogitProcessor::LogitProcessor(const SamplingParams& p, std::span<const int32_t> prompt,
                               std::vector<int32_t> masked)
    : presence_(p.presence_penalty),
      frequency_(p.frequency_penalty),
      repetition_(p.repetition_penalty),
      penalties_(p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f),
      min_new_tokens_(p.min_new_tokens),
      bias_(p.logit_bias),
      masked_(std::move(masked)) {
  std::stable_sort(bias_.begin(), bias_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  // A repeated id keeps its last bias (a JSON object cannot repeat keys; the C++ API can).
  std::vector<std::pair<int32_t, float>> uniq;
  for (size_t i = 0; i < bias_.size(); ++i)
    if (i + 1 == bias_.size() || bias_[i + 1].first != bias_[i].first) uniq.push_back(bias_[i]);
  bias_ = std::move(uniq);
  std::erase_if(bias_, [](const auto& b) { return b.second == 0.0f; });
  std::sort(masked_.begin(), masked_.end());
  masked_.erase(std::unique(masked_.begin(), masked_.end()), masked_.end());
  if (min_new_tokens_ <= 0) masked_.clear();
  if (penalties_) {
    prompt_.assign(prompt.begin(), prompt.end());
    for (int32_t t : prompt_) seen_[t].in_prompt = true;
  }
}

bool LogitProcessor::active() const {
  return penalties_ || !bias_.empty() || (!masked_.empty() && int(generated_.size()) < min_new_tokens_) ||
         !token_mask_.empty();
}

void LogitProcessor::observe(int32_t token) {
  if (!penalties_ && masked_.empty()) return;  // nothing here depends on the history
  generated_.push_back(token);
  if (penalties_) ++seen_[token].count;
}

std::vector<std::pair<int32_t, float>> LogitProcessor::sparse_adds() const {
  std::vector<std::pair<int32_t, float>> out = bias_;
  if (int(generated_.size()) < min_new_tokens_) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int32_t id : masked_) {
      if (!token_mask_.empty() && size_t(id) / 32 < token_mask_.size() &&
          ((token_mask_[size_t(id) / 32] >> (id % 32)) & 1u))
        continue;  // the grammar allows the output to end here
      auto it = std::lower_bound(out.begin(), out.end(), std::pair<int32_t, float>(id, -1e30f),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
      if (it != out.end() && it->first == id)
        it->second = ninf;
      else
        out.insert(it, {id, ninf});
    }
  }
  return out;
}

void LogitProcessor::apply(float* logits, int64_t vocab) const {
  for (const auto& [id, add] : sparse_adds())
    if (id >= 0 && id < vocab) logits[id] = logits[id] + add;
  if (penalties_)
    for (const auto& [id, s] : seen_)
      if (id >= 0 && id < vocab)
        logits[id] = penalize_logit(logits[id], s.count, presence_, frequency_, repetition_);
  if (!token_mask_.empty()) apply_token_bitmask(logits, vocab, token_mask_.data(), token_mask_.size());
}

void apply_token_bitmask(float* logits, int64_t vocab, const uint32_t* words, size_t n_words) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t id = 0; id < vocab; ++id) {
    const size_t w = size_t(id) / 32;
    if (w >= n_words || !((words[w] >> (id % 32)) & 1u)) logits[id] = ninf;
  }
}

}  // namespace kiln
