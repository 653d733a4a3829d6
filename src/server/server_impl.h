// Private to src/server: the state behind ApiServer, shared by server.cpp (routes, auth, lifecycle) and
// handlers.cpp (generation and embedding requests). The transport underneath is server/http_transport.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "server/http_transport.h"
#include "server/model_names.h"
#include "server/protocol.h"
#include "server/rerank.h"
#include "server/responses_api.h"
#include "server/server.h"
#include "server/structured_output.h"

namespace kiln::server {

enum class Outcome { completed, error, aborted };

struct ApiServer::Impl {
  Impl(EngineApi& e, const TextCodec& c, ServerOptions o) : engine(e), codec(c), opts(std::move(o)) {}

  EngineApi& engine;
  const TextCodec& codec;
  ServerOptions opts;
  ServerCounters counters;
  // /v1/responses kept for previous_response_id and GET /v1/responses/{id} (responses_route.cpp).
  std::unique_ptr<ResponseStore> response_store = std::make_unique<ResponseStore>(opts.max_stored_responses);
  std::atomic<bool> draining{false};
  int bound_port = -1;

  std::mutex mu;  // guards active_ids, sinks and rng
  std::condition_variable idle_cv;
  std::unordered_set<RequestId> active_ids;
  // Each accepted request's event callback, kept until it ends, so that end_all() can end its response
  // without the engine (which may be inside a long step and deliver its own final event much later).
  std::unordered_map<RequestId, std::function<void(const TokenEvent&)>> sinks;
  std::mt19937_64 rng{std::random_device{}()};
  // Structured output: made on first use (its vocabulary is built then), under grammar_mu.
  std::mutex grammar_mu;
  std::unique_ptr<GrammarService> grammars;

  ApiLimits limits() const;
  std::string make_id(const char* prefix);

  // The reply to one request (auth, then the route); see server.cpp.
  HttpResponse route(const HttpRequest& req);
  // Runs `fn`, turning ApiError and kiln::Error into OpenAI-shaped error responses (and counting them).
  template <typename Fn>
  void guarded(HttpResponse& res, Fn&& fn);
  // guarded() for the route files other than server.cpp (where the template is defined).
  void run_guarded(HttpResponse& res, const std::function<void()>& fn);
  void send_error(HttpResponse& res, int status, const nlohmann::json& body);

  // Accepted requests: registered once the engine gave an id, ended exactly once with an outcome.
  void on_accepted(RequestId id);
  void on_ended(RequestId id, Outcome o);

  // Both leave an HttpResponse with a ResponseSource that is fed by the engine's events.
  void handle_generation(Endpoint ep, const HttpRequest& req, HttpResponse& res);
  void handle_embeddings(const HttpRequest& req, HttpResponse& res);
  // /v1/rerank, /rerank (score_shape false) and /score, /v1/score (true): server/rerank.h.
  void handle_rerank(const HttpRequest& req, HttpResponse& res, bool score_shape);
  void handle_responses(const HttpRequest& req, HttpResponse& res);
  void get_stored_response(const std::string& id, HttpResponse& res);
  // vLLM/SGLang extra routes (routes_vllm.cpp); false when `req` is not one of them.
  bool route_vllm(const HttpRequest& req, HttpResponse& res);
  ModelNames model_names() const;
  // The request's grammar compiled (nullptr when it has none); ApiError as GrammarService::compile says.
  std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const GenSpec& spec);
  // Submits to the engine, mapping its refusals to ApiError (busy -> 503, bad input -> 400).
  RequestId submit(Request r, std::function<void(const TokenEvent&)> cb);

  // Last: destroyed first, while everything its connections' sources reach is still there.
  std::unique_ptr<HttpTransport> http;
};

// Hands `res` the source of a generation reply: SSE (no caching or proxy buffering) or one JSON body.
inline void set_source(HttpResponse& res, std::shared_ptr<ResponseSource> src, bool stream) {
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
  }
  res.content_type = stream ? "text/event-stream" : "application/json";
  res.stream = stream;
  res.source = std::move(src);
}

// The methods a known path answers ("GET, HEAD"), "" for an unknown path (routes_vllm.cpp).
std::string allowed_methods(const std::string& path);

// Engine thread -> the transport's wake-up for one response: the engine's callback may outlive the
// response, so it calls through this, which the response disarms when it finishes.
class WakeRelay {
 public:
  void arm(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = std::move(fn);
  }
  void disarm() { arm(nullptr); }
  void wake() {
    std::lock_guard<std::mutex> lock(mu_);
    if (fn_) fn_();
  }

 private:
  std::mutex mu_;
  std::function<void()> fn_;
};

}  // namespace kiln::server
