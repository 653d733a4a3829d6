#include "server/batched_source.h"

#include "server/api_error.h"
#include "server/responses.h"

namespace kiln::server {

void BatchedSource::submit(Request r) {
  const RequestId id = server_.submit(std::move(r), [q = queue_, w = wake_](const TokenEvent& e) {
    if (q->push(e)) w->wake();
  });
  ids_.push_back(id);
  done_.push_back(false);
  ++remaining_;
  server_.on_accepted(id);
}

bool BatchedSource::pull(Frame& frame, HttpResponse& res) {
  std::vector<TokenEvent> events;
  queue_->take(events);
  for (const auto& e : events) {
    if (!e.finished) continue;
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] != e.id || done_[i]) continue;
      done_[i] = true;
      --remaining_;
      Outcome o = e.finish_reason == "error"   ? Outcome::error
                  : e.finish_reason == "abort" ? Outcome::aborted
                                               : Outcome::completed;
      prompt_tokens_ += e.prompt_tokens;
      if (o == Outcome::completed && !take(i, e)) o = Outcome::error;
      server_.on_ended(ids_[i], o);
      if (o == Outcome::error) error_ = e.error.empty() ? "no answer came back" : e.error;
      if (o == Outcome::aborted) aborted_ = true;
    }
  }
  if (remaining_ > 0) return false;
  if (!error_.empty()) {
    server_.send_error(res, 500, error_body(500, what_ + " failed: " + error_));
  } else if (aborted_) {
    server_.send_error(res, 503, error_body(503, "the request was aborted (server shutting down)"));
  } else {
    res.body = reply();
  }
  frame.bytes = std::move(res.body);
  res.body.clear();
  return true;
}

void BatchedSource::finish(bool) {
  if (ended_) return;
  ended_ = true;
  wake_->disarm();
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (done_[i]) continue;
    done_[i] = true;
    server_.engine.abort(ids_[i]);
    server_.on_ended(ids_[i], Outcome::aborted);
  }
}

}  // namespace kiln::server
