#include "server/generation.h"

namespace kiln::server {

bool EventQueue::push(const TokenEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(e);
  unwoken_tokens_ += e.ids.size();
  const bool wake = e.finished || e.ids.empty() ||
                    (every_ > 0 && (!woke_with_tokens_ || unwoken_tokens_ >= size_t(every_)));
  if (wake) {
    woke_with_tokens_ = woke_with_tokens_ || !e.ids.empty();
    unwoken_tokens_ = 0;
  }
  return wake;
}

void EventQueue::take(std::vector<TokenEvent>& out) {
  out.clear();
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(events_);
}

OutputTracker::OutputTracker(const TextCodec& codec, const GenSpec& spec)
    : stream_(codec.stream()),
      stop_(spec.stop),
      want_logprobs_(spec.logprobs),
      include_stop_(spec.include_stop_str),
      min_tokens_(spec.sampling.min_new_tokens),
      prompt_tokens_(int(spec.prompt.size())) {}

void OutputTracker::finish_text(Delta& d) {
  const StopMatcher::Result r = stop_.push(stream_->flush());
  d.text += r.text;
  if (r.matched) {
    if (include_stop_) d.text += r.stop;
    stopped_by_string_ = true;
    finish_reason_ = "stop";
    matched_ = r.stop;
  } else {
    d.text += stop_.finish();
  }
}

Delta OutputTracker::consume(const TokenEvent& e) {
  Delta d;
  if (finished_) return d;
  if (!e.prompt_logprobs.empty()) prompt_logprobs_ = e.prompt_logprobs;
  if (!e.score_logprobs.empty()) score_logprobs_ = e.score_logprobs;
  if (e.prompt_tokens > 0) prompt_tokens_ = e.prompt_tokens;
  cached_tokens_ = e.cached_tokens;
  spec_ = e.spec;
  const size_t n = e.ids.size();
  for (size_t i = 0; i < n && !finished_; ++i) {
    const int32_t id = e.ids[i];
    // The stop/eos token that ended the request is counted but its text is not shown.
    const bool hidden = e.finished && e.finish_reason == "stop" && i + 1 == n && id == e.matched_stop;
    if (!hidden && completion_tokens_ + 1 < min_tokens_) {
      d.text += stream_->push(id);  // before min_tokens no stop string counts (vLLM's rule)
    } else if (!hidden) {
      const StopMatcher::Result r = stop_.push(stream_->push(id));
      d.text += r.text;
      if (r.matched) {
        if (include_stop_) d.text += r.stop;
        finished_ = stopped_by_string_ = true;
        finish_reason_ = "stop";
        matched_ = r.stop;
      }
    }
    ++completion_tokens_;
    d.ids.push_back(id);
    output_ids_.push_back(id);
    if (want_logprobs_) {
      TokenOut t;
      t.id = id;
      if (i < e.logprobs.size()) t.logprob = e.logprobs[i];
      if (i < e.top_logprobs.size()) t.top = e.top_logprobs[i];
      d.tokens.push_back(t);
      tokens_.push_back(std::move(t));
    }
  }
  if (!finished_ && e.finished) {
    finished_ = true;
    finish_reason_ = e.finish_reason;
    if (e.matched_stop >= 0) matched_ = e.matched_stop;
    error_ = e.error;
    hidden_ = e.hidden;
    if (e.completion_tokens > completion_tokens_) completion_tokens_ = e.completion_tokens;
    finish_text(d);  // may still find a stop string in the detokenizer's tail
  }
  text_ += d.text;
  return d;
}

}  // namespace kiln::server
