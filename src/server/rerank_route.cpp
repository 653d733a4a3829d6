// POST /v1/rerank, /rerank, /score, /v1/score (server/rerank.h): every (query, document) pair is one
// prefill-only engine request asking the log-probabilities of "yes" and "no" at its last position; one JSON
// reply once all have ended.
#include <ctime>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/rerank.h"
#include "server/responses.h"
#include "server/server_impl.h"

namespace kiln::server {

using nlohmann::json;

namespace {

struct RerankSession : ResponseSource {
  RerankSession(ApiServer::Impl& srv, RerankSpec sp) : server(srv), spec(std::move(sp)) {}
  ~RerankSession() override { finish(false); }

  void attach(std::function<void()> fn) override { wake->arm(std::move(fn)); }
  bool pull(Frame& out, HttpResponse& res) override;
  void finish(bool complete) override;

  ApiServer::Impl& server;
  RerankSpec spec;
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  std::shared_ptr<WakeRelay> wake = std::make_shared<WakeRelay>();
  std::vector<RequestId> ids;
  std::vector<double> scores;
  std::vector<bool> done;
  size_t remaining = 0;
  int64_t prompt_tokens = 0;
  std::string error;
  bool aborted = false;
  bool ended = false;
};

bool RerankSession::pull(Frame& frame, HttpResponse& res) {
  std::vector<TokenEvent> events;
  queue->take(events);
  for (const auto& e : events) {
    if (!e.finished) continue;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != e.id || done[i]) continue;
      done[i] = true;
      --remaining;
      // A scored request ends "length" (it generates nothing) with its two log-probabilities.
      const bool ok =
          (e.finish_reason == "length" || e.finish_reason == "stop") && e.score_logprobs.size() == 2;
      const Outcome o = ok                           ? Outcome::completed
                        : e.finish_reason == "abort" ? Outcome::aborted
                                                     : Outcome::error;
      server.on_ended(ids[i], o);
      if (o == Outcome::error) error = e.error.empty() ? "no score came back" : e.error;
      if (o == Outcome::aborted) aborted = true;
      prompt_tokens += e.prompt_tokens;
      if (ok) scores[i] = rerank_score(e.score_logprobs[1], e.score_logprobs[0]);  // score_ids = {no, yes}
    }
  }
  if (remaining > 0) return false;
  if (!error.empty()) {
    server.send_error(res, 500, error_body(500, "scoring failed: " + error));
  } else if (aborted) {
    server.send_error(res, 503, error_body(503, "the request was aborted (server shutting down)"));
  } else {
    res.body = dump_json(
        rerank_response(spec, scores, prompt_tokens, server.make_id(""), int64_t(std::time(nullptr))));
  }
  frame.bytes = std::move(res.body);
  res.body.clear();
  return true;
}

void RerankSession::finish(bool) {
  if (ended) return;
  ended = true;
  wake->disarm();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (done[i]) continue;
    done[i] = true;
    server.engine.abort(ids[i]);
    server.on_ended(ids[i], Outcome::aborted);
  }
}

}  // namespace

void ApiServer::Impl::handle_rerank(const HttpRequest& req, HttpResponse& res, bool score_shape) {
  const json body = parse_body(req.body);
  if (!opts.rerank)
    throw bad_request("this server does not rerank: serve a Qwen3-Reranker checkpoint with --task rerank",
                      "model");
  std::string model;
  check_model(body, limits(), model);
  auto s = std::make_shared<RerankSession>(*this, parse_rerank_request(body, score_shape, model));
  std::vector<std::vector<int32_t>> prompts;  // all tokenized before the first submit
  for (size_t i = 0; i < s->spec.documents.size(); ++i)
    prompts.push_back(
        rerank_prompt(*opts.rerank, codec, s->spec.instruction, s->spec.queries[i], s->spec.documents[i]));
  // On a refusal mid-way, the destructor aborts and counts the pairs already submitted.
  for (auto& p : prompts) {
    Request r;
    r.prompt = std::move(p);
    r.sampling.temperature = 0.0f;
    r.sampling.max_new_tokens = 0;
    r.score_ids = {opts.rerank->no_id, opts.rerank->yes_id};
    const RequestId id = submit(std::move(r), [q = s->queue, w = s->wake](const TokenEvent& e) {
      if (q->push(e)) w->wake();
    });
    s->ids.push_back(id);
    s->done.push_back(false);
    s->scores.push_back(0.0);
    s->remaining++;
    on_accepted(id);
  }
  res.source = std::move(s);
}

}  // namespace kiln::server
