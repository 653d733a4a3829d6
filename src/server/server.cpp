#include "server/server.h"

#include <sys/socket.h>

#include <chrono>
#include <cstdio>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/responses.h"
#include "server/server_impl.h"

namespace kiln::server {

using nlohmann::json;

namespace {

// Compares without an early exit so the key's length of common prefix does not leak through timing.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

const char* status_text(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 401:
      return "unauthorized";
    case 404:
      return "not found";
    case 405:
      return "method not allowed";
    case 413:
      return "payload too large";
    case 414:
      return "URI too long";
    case 416:
      return "range not satisfiable";
    case 431:
      return "request header fields too large";
    case 503:
      return "service unavailable";
    default:
      return status >= 500 ? "server error" : "request error";
  }
}

}  // namespace

ApiLimits ApiServer::Impl::limits() const {
  ApiLimits l;
  l.vocab_size = engine.vocab_size();
  l.max_context_len = engine.max_context_len();
  l.hidden_size = engine.hidden_size();
  l.served_model_name = opts.served_model_name;
  l.reasoning_parser =
      opts.reasoning_parser == "qwen3" || (opts.reasoning_parser == "auto" && codec.chat_template_thinks());
  l.tool_call_parser = opts.tool_call_parser != "none";
  l.sampling_defaults = opts.sampling_defaults;
  l.extra_eos_ids = opts.extra_eos_ids;
  return l;
}

std::string ApiServer::Impl::make_id(const char* prefix) {
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = rng();
    b = rng();
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)a,
                (unsigned long long)(b & 0xffffffffu));
  return std::string(prefix) + buf;
}

void ApiServer::Impl::send_error(httplib::Response& res, int status, const json& body) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", std::to_string(opts.retry_after_s));
  res.set_content(dump_json(body), "application/json");
}

template <typename Fn>
void ApiServer::Impl::guarded(httplib::Response& res, Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    (e.status() == 503 ? counters.rejected_busy : counters.rejected_invalid)++;
    send_error(res, e.status(), e.to_json());
  } catch (const kiln::Error& e) {
    counters.rejected_invalid++;
    send_error(res, 400, error_body(400, e.what()));
  } catch (const std::exception& e) {
    send_error(res, 500, error_body(500, std::string("internal error: ") + e.what()));
  }
}

RequestId ApiServer::Impl::submit(Request r, std::function<void(const TokenEvent&)> cb) {
  if (draining) throw ApiError(503, "the server is shutting down", "", "service_unavailable");
  try {
    return engine.submit(std::move(r), std::move(cb));
  } catch (const EngineBusyError& e) {
    throw ApiError(503, std::string("the server is busy: ") + e.what(), "", "service_unavailable");
  } catch (const kiln::Error& e) {
    throw bad_request(e.what());
  }
}

void ApiServer::Impl::on_accepted(RequestId id) {
  counters.accepted++;
  counters.active++;
  std::lock_guard<std::mutex> lock(mu);
  active_ids.insert(id);
}

void ApiServer::Impl::on_ended(RequestId id, Outcome o) {
  (o == Outcome::completed ? counters.completed
   : o == Outcome::error   ? counters.errored
                           : counters.aborted)++;
  {
    std::lock_guard<std::mutex> lock(mu);
    active_ids.erase(id);
    counters.active--;
  }
  idle_cv.notify_all();
}

void ApiServer::Impl::setup_routes() {
  http.new_task_queue = [n = opts.http_threads] { return new httplib::ThreadPool(size_t(n)); };
  http.set_payload_max_length(opts.max_body_bytes);
  http.set_tcp_nodelay(true);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind a port already in use (the kernel
  // then splits connections between them). SO_REUSEADDR alone allows a quick restart but refuses that.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts.api_key.empty() || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && same_secret(auth.substr(prefix.size()), opts.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    counters.rejected_auth++;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, 401,
               error_body(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "", "",
                          "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });

  // Statuses httplib produces itself (404 no route, 413 body too large, 400 bad HTTP) get a JSON body.
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string msg = status_text(res.status);
        if (res.status == 404) msg = "no route for " + req.method + " " + req.path;
        if (res.status == 413) msg = "request body exceeds " + std::to_string(opts.max_body_bytes) + " bytes";
        if (res.status == 413 || res.status == 400) counters.rejected_invalid++;
        res.set_content(dump_json(error_body(res.status, msg)), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, error_body(500, "internal error: " + what));
  });

  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_generation(Endpoint::chat, req, res); });
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_generation(Endpoint::completion, req, res); });
  });
  http.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_generation(Endpoint::generate, req, res); });
  });
  http.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_embeddings(req, res); });
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", opts.served_model_name},
                        {"object", "model"},
                        {"created", int64_t(std::time(nullptr))},
                        {"owned_by", "kiln"},
                        {"max_model_len", engine.max_context_len()}};
    res.set_content(dump_json({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  http.Get("/get_model_info", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json({{"model_path", opts.served_model_name},
                               {"is_generation", !engine.is_embedding_model()},
                               {"max_context_len", engine.max_context_len()}}),
                    "application/json");
  });
  http.Post("/flush_cache", [this](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] {
      engine.flush_cache();
      res.set_content(dump_json({{"success", true}, {"message", "Cache flushed."}}), "application/json");
    });
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) {
      send_error(res, 503, error_body(503, "the server is shutting down"));
      return;
    }
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(engine.stats(), counters, opts.served_model_name),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

ApiServer::ApiServer(EngineApi& engine, const TextCodec& codec, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, codec, std::move(opts))) {
  impl_->setup_routes();
}

ApiServer::~ApiServer() {
  stop();
}

int ApiServer::bind() {
  auto& im = *impl_;
  // httplib's default options set SO_REUSEPORT, which lets a second server bind a busy port and silently
  // take half its connections: only SO_REUSEADDR here (a restart may reuse a port in TIME_WAIT).
  im.http.set_socket_options([&im](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    im.listen_fd = sock;
  });
  if (im.opts.port == 0) {
    im.bound_port = im.http.bind_to_any_port(im.opts.host);
    KILN_CHECK(im.bound_port > 0, "cannot bind ", im.opts.host, " (any port)");
  } else {
    KILN_CHECK(im.http.bind_to_port(im.opts.host, im.opts.port), "cannot bind ", im.opts.host, ":",
               im.opts.port, " (address in use, or not a local address?)");
    im.bound_port = im.opts.port;
  }
  // Debian's libcpp-httplib listens with a backlog of 5: a burst of clients (a benchmark opening 128
  // connections at once) overflows it. listen() again on the bound socket deepens the queue.
  if (im.listen_fd >= 0) KILN_CHECK(::listen(im.listen_fd, 4096) == 0, "listen() failed on the bound socket");
  return im.bound_port;
}

void ApiServer::listen() {
  impl_->http.listen_after_bind();
}
int ApiServer::port() const {
  return impl_->bound_port;
}
bool ApiServer::running() const {
  return impl_->http.is_running();
}

void ApiServer::begin_drain() {
  impl_->draining = true;
}
bool ApiServer::draining() const {
  return impl_->draining;
}

bool ApiServer::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->idle_cv.wait_for(lock, timeout, [&] { return impl_->active_ids.empty(); });
}

void ApiServer::abort_all() {
  std::vector<RequestId> ids;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ids.assign(impl_->active_ids.begin(), impl_->active_ids.end());
  }
  for (RequestId id : ids) impl_->engine.abort(id);
}

void ApiServer::stop() {
  if (impl_ && impl_->http.is_running()) impl_->http.stop();
}

const ServerCounters& ApiServer::counters() const {
  return impl_->counters;
}

}  // namespace kiln::server
