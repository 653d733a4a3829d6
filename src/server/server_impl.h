// Private to src/server: the state behind ApiServer, shared by server.cpp (routes, auth, lifecycle) and
// handlers.cpp (generation and embedding requests).
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <unordered_set>

#include "server/protocol.h"
#include "server/server.h"

namespace kiln::server {

enum class Outcome { completed, error, aborted };

struct ApiServer::Impl {
  Impl(EngineApi& e, const TextCodec& c, ServerOptions o) : engine(e), codec(c), opts(std::move(o)) {}

  EngineApi& engine;
  const TextCodec& codec;
  ServerOptions opts;
  httplib::Server http;
  ServerCounters counters;
  std::atomic<bool> draining{false};
  int bound_port = -1;
  int listen_fd = -1;  // the listening socket, seen through httplib's socket-options hook

  std::mutex mu;  // guards active_ids and rng
  std::condition_variable idle_cv;
  std::unordered_set<RequestId> active_ids;
  std::mt19937_64 rng{std::random_device{}()};

  ApiLimits limits() const;
  std::string make_id(const char* prefix);

  void setup_routes();
  // Runs `fn`, turning ApiError and kiln::Error into OpenAI-shaped error responses (and counting them).
  template <typename Fn>
  void guarded(httplib::Response& res, Fn&& fn);
  void send_error(httplib::Response& res, int status, const nlohmann::json& body);

  // Accepted requests: registered once the engine gave an id, ended exactly once with an outcome.
  void on_accepted(RequestId id);
  void on_ended(RequestId id, Outcome o);

  void handle_generation(Endpoint ep, const httplib::Request& req, httplib::Response& res);
  void handle_embeddings(const httplib::Request& req, httplib::Response& res);
  // Submits to the engine, mapping its refusals to ApiError (busy -> 503, bad input -> 400).
  RequestId submit(Request r, std::function<void(const TokenEvent&)> cb);
};

}  // namespace kiln::server
