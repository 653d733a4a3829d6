#include "server/server.h"

#include <chrono>
#include <cstdio>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/metrics_compat.h"
#include "server/request_fields.h"
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

// "Bearer " in any case: authentication schemes are case-insensitive (RFC 9110 11.1).
bool is_bearer(const std::string& auth) {
  if (auth.size() < 7 || auth[6] != ' ') return false;
  for (size_t i = 0; i < 6; ++i)
    if (char(auth[i] | 0x20) != "bearer"[i]) return false;
  return true;
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
  const ModelNames names = model_names();
  l.model_aliases.assign(names.served.begin() + 1, names.served.end());
  l.model_aliases.insert(l.model_aliases.end(), names.accepted.begin(), names.accepted.end());
  l.reasoning_parser =
      opts.reasoning_parser == "qwen3" || (opts.reasoning_parser == "auto" && codec.chat_template_thinks());
  l.tool_call_parser = opts.tool_call_parser != "none";
  l.sampling_defaults = opts.sampling_defaults;
  l.extra_eos_ids = opts.extra_eos_ids;
  l.vision = opts.vision;
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

void ApiServer::Impl::send_error(HttpResponse& res, int status, const json& body) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", std::to_string(opts.retry_after_s));
  res.content_type = "application/json";
  res.body = dump_json(body);
}

template <typename Fn>
void ApiServer::Impl::guarded(HttpResponse& res, Fn&& fn) {
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

void ApiServer::Impl::run_guarded(HttpResponse& res, const std::function<void()>& fn) {
  guarded(res, fn);
}

RequestId ApiServer::Impl::submit(Request r, std::function<void(const TokenEvent&)> cb) {
  if (draining) throw ApiError(503, "the server is shutting down", "", "service_unavailable");
  try {
    std::function<void(const TokenEvent&)> sink = cb;
    const RequestId id = engine.submit(std::move(r), std::move(cb));
    std::lock_guard<std::mutex> lock(mu);
    sinks.emplace(id, std::move(sink));
    return id;
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
    sinks.erase(id);
    counters.active--;
  }
  idle_cv.notify_all();
}

HttpResponse ApiServer::Impl::route(const HttpRequest& req) {
  HttpResponse res;
  const std::string& path = req.path;
  if (auto pre = opts.cors.preflight(req)) return *pre;  // before auth: browsers send no key on a preflight
  if (!opts.api_key.empty() && path != "/health" && path != "/metrics") {
    const std::string auth = req.header("Authorization");
    if (!is_bearer(auth) || !same_secret(auth.substr(7), opts.api_key)) {
      counters.rejected_auth++;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401,
                 error_body(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "", "",
                            "invalid_api_key"));
      return res;
    }
  }
  if (req.method == "GET") {
    // Answered on the I/O thread: snapshots only (the engine's stats are a copy taken under a short lock).
    if (path == "/health") {
      if (draining)
        send_error(res, 503, error_body(503, "the server is shutting down"));
      else
        res.body = "{\"status\":\"ok\"}";
      return res;
    }
    if (path == "/metrics") {
      res.content_type = "text/plain; version=0.0.4; charset=utf-8";
      res.body = render_metrics(engine.stats(), counters, opts.served_model_name);
      if (opts.metrics_compat == "vllm") res.body += vllm_metrics(res.body);
      return res;
    }
    if (path == "/v1/models") {
      json data = json::array();
      for (const auto& name : model_names().served)
        data.push_back(model_card(name, int64_t(std::time(nullptr)), engine.max_context_len()));
      res.body = dump_json({{"object", "list"}, {"data", std::move(data)}});
      return res;
    }
    if (path == "/get_model_info") {
      res.body = dump_json({{"model_path", opts.served_model_name},
                            {"is_generation", !engine.is_embedding_model()},
                            {"max_context_len", engine.max_context_len()}});
      return res;
    }
  } else if (req.method == "POST") {
    if (opts.log_unknown_fields)
      if (const std::string line = unknown_fields_log_line(path, req.body); !line.empty())
        std::fprintf(stderr, "%s\n", line.c_str());
    const bool chat = path == "/v1/chat/completions", completion = path == "/v1/completions";
    if (chat || completion || path == "/generate") {
      const Endpoint ep = chat ? Endpoint::chat : completion ? Endpoint::completion : Endpoint::generate;
      guarded(res, [&] { handle_generation(ep, req, res); });
      return res;
    }
    if (path == "/v1/embeddings") {
      guarded(res, [&] { handle_embeddings(req, res); });
      return res;
    }
    if (path == "/flush_cache") {
      guarded(res, [&] {
        engine.flush_cache();  // waits for the engine's step: POST routes run on a worker thread
        res.body = dump_json({{"success", true}, {"message", "Cache flushed."}});
      });
      return res;
    }
  }
  if (route_vllm(req, res)) return res;
  if (const std::string allow = allowed_methods(path); !allow.empty()) {
    res.set_header("Allow", allow);
    send_error(
        res, 405,
        error_body(405, "method " + req.method + " is not allowed on " + path + "; allowed: " + allow));
    return res;
  }
  send_error(res, 404, error_body(404, "no route for " + req.method + " " + path));
  return res;
}

ApiServer::ApiServer(EngineApi& engine, const TextCodec& codec, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, codec, std::move(opts))) {
  Impl& im = *impl_;
  TransportOptions t;
  t.host = im.opts.host;
  t.port = im.opts.port;
  t.io_threads = im.opts.http_threads;
  t.worker_threads = im.opts.http_workers;
  t.max_connections = im.opts.max_connections;
  t.max_body_bytes = im.opts.max_body_bytes;
  t.idle_timeout = im.opts.idle_timeout;
  t.header_timeout = im.opts.header_timeout;
  t.body_timeout = im.opts.body_timeout;
  t.write_timeout = im.opts.write_timeout;
  t.retry_after_s = im.opts.retry_after_s;
  Routes r;
  // /health_generate submits to the engine: a worker's job.
  r.is_fast = [](const HttpRequest& req) { return req.method != "POST" && req.path != "/health_generate"; };
  r.handle = [&im](const HttpRequest& req) {
    HttpResponse res = im.route(req);
    im.opts.cors.decorate(req, res);
    return res;
  };
  // Statuses the transport produces itself (a malformed request, deadlines, limits) get a JSON body.
  r.error = [&im](int status, const std::string& msg) {
    if (status == 400 || status == 413 || status == 431) im.counters.rejected_invalid++;
    HttpResponse res;
    im.send_error(res, status, error_body(status, msg.empty() ? status_text(status) : msg));
    return res;
  };
  im.http = std::make_unique<HttpTransport>(std::move(t), std::move(r), im.counters);
}

ApiServer::~ApiServer() {
  stop();
}

int ApiServer::bind() {
  impl_->bound_port = impl_->http->bind();
  return impl_->bound_port;
}

void ApiServer::listen() {
  impl_->http->run();
}
int ApiServer::port() const {
  return impl_->bound_port;
}
bool ApiServer::running() const {
  return impl_->http->running();
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

void ApiServer::end_all() {
  std::vector<std::pair<RequestId, std::function<void(const TokenEvent&)>>> open;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    open.assign(impl_->sinks.begin(), impl_->sinks.end());
  }
  for (auto& [id, sink] : open) {
    impl_->engine.abort(id);  // frees its pages once the engine's step ends
    // The response ends now, as an abort: its final chunk and [DONE] (a whole reply: 503) go out at the
    // connection's next pull. The engine's own final event, when it comes, finds the request ended.
    TokenEvent e;
    e.id = id;
    e.finished = true;
    e.finish_reason = "abort";
    sink(e);
  }
}

void ApiServer::stop() {
  if (impl_) impl_->http->stop();
}

const ServerCounters& ApiServer::counters() const {
  return impl_->counters;
}

}  // namespace kiln::server
