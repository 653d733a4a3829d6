// One JSON reply for several prefill-only engine requests (the inputs of /v1/embeddings, the pairs of the
// reranker routes): each request's final event is handed to the route's `take`, and once all have ended the
// reply is the route's `reply()`, or a 500 (an engine error) or 503 (aborted: the server stopping). Requests
// still running when the client goes away (or the server stops) are aborted and counted so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/server_impl.h"

namespace kiln::server {

class BatchedSource : public ResponseSource {
 public:
  // `what`: the failure's wording in a 500 ("embedding", "scoring").
  BatchedSource(ApiServer::Impl& srv, std::string what) : server_(srv), what_(std::move(what)) {}
  ~BatchedSource() override { finish(false); }

  void attach(std::function<void()> fn) override { wake_->arm(std::move(fn)); }
  bool pull(Frame& out, HttpResponse& res) override;
  void finish(bool complete) override;

  // Submits one engine request (index = the number submitted before it); a refusal throws (the destructor
  // then aborts and counts those already submitted).
  void submit(Request r);
  int64_t prompt_tokens() const { return prompt_tokens_; }

 protected:
  // Request i ended with `e` ("stop"/"length", with its outputs); false: it gave no answer (a 500).
  virtual bool take(size_t i, const TokenEvent& e) = 0;
  virtual std::string reply() = 0;

  ApiServer::Impl& server_;

 private:
  std::string what_;
  std::shared_ptr<EventQueue> queue_ = std::make_shared<EventQueue>();
  std::shared_ptr<WakeRelay> wake_ = std::make_shared<WakeRelay>();
  std::vector<RequestId> ids_;
  std::vector<bool> done_;
  size_t remaining_ = 0;
  int64_t prompt_tokens_ = 0;
  std::string error_;
  bool aborted_ = false;
  bool ended_ = false;
};

}  // namespace kiln::server
