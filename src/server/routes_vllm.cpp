// The routes vLLM and SGLang users expect beside the OpenAI ones, answered as those servers answer them:
//   GET  /v1/models/{id}            OpenAI's model object, or 404 model_not_found
//   POST /tokenize                  vLLM: {prompt | messages, add_special_tokens, ...} -> {count,
//   max_model_len,
//                                   tokens, token_strs}
//   POST /detokenize                vLLM: {tokens} -> {prompt}
//   GET  /version                   vLLM: {"version": ...}
//   GET  /get_server_info           SGLang: the server's settings and engine counters
//   GET  /health_generate           SGLang: generates one token; 200 when the engine did, else 503
//   POST /v1/responses, GET /v1/responses/{id}   OpenAI's Responses API (responses_route.cpp)
//   POST /v1/rerank, /rerank, /score, /v1/score   Qwen3-Reranker (server/rerank.h, rerank_route.cpp)
// and the 405 (with Allow) for a known path asked with another method.
#include <ctime>

#include "server/api_error.h"
#include "server/model_names.h"
#include "server/protocol_fields.h"
#include "server/responses.h"
#include "server/server_impl.h"

namespace kiln::server {

using nlohmann::json;

namespace {

constexpr const char* kVersion = "0.1.0";  // `kiln version` prints the same

// /health_generate's reply: the one-token /generate reply it wraps, reduced to {"status": "ok"}, or 503
// with the error when the engine failed or aborted it.
struct HealthGenerateSource : ResponseSource {
  explicit HealthGenerateSource(std::shared_ptr<ResponseSource> in) : inner(std::move(in)) {}
  void attach(std::function<void()> wake) override { inner->attach(std::move(wake)); }
  bool pull(Frame& out, HttpResponse& res) override {
    if (!inner->pull(scratch, res)) return false;
    const std::string body = scratch.str();
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.contains("error") ||
        j.value("meta_info", json::object()).value("finish_reason", json()).value("type", "") == "abort") {
      res.status = 503;
      out.bytes = dump_json(error_body(503, "the engine did not generate: " + body));
    } else {
      out.bytes = "{\"status\":\"ok\"}";
    }
    return true;
  }
  void finish(bool complete) override { inner->finish(complete); }

  std::shared_ptr<ResponseSource> inner;
  Frame scratch;
};

// Known paths and the methods each answers (HEAD is served as GET).
const std::vector<std::pair<std::string, std::string>>& route_methods() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {"/health", "GET, HEAD"},
      {"/metrics", "GET, HEAD"},
      {"/v1/models", "GET, HEAD"},
      {"/get_model_info", "GET, HEAD"},
      {"/version", "GET, HEAD"},
      {"/get_server_info", "GET, HEAD"},
      {"/health_generate", "GET, HEAD, POST"},
      {"/v1/chat/completions", "POST"},
      {"/v1/completions", "POST"},
      {"/v1/responses", "POST"},
      {"/v1/embeddings", "POST"},
      {"/generate", "POST"},
      {"/flush_cache", "POST"},
      {"/tokenize", "POST"},
      {"/detokenize", "POST"},
      {"/v1/rerank", "POST"},
      {"/rerank", "POST"},
      {"/v2/rerank", "POST"},
      {"/score", "POST"},
      {"/v1/score", "POST"},
  };
  return r;
}

}  // namespace

std::string allowed_methods(const std::string& path) {
  for (const auto& [p, m] : route_methods())
    if (p == path) return m;
  if (path.rfind("/v1/models/", 0) == 0 || path.rfind("/v1/responses/", 0) == 0) return "GET, HEAD";
  return "";
}

ModelNames ApiServer::Impl::model_names() const {
  ModelNames m;
  m.served.push_back(opts.served_model_name);
  for (const auto& n : opts.more_served_model_names)
    if (!m.accepts(n)) m.served.push_back(n);
  for (const auto& n : opts.model_aliases)
    if (!m.accepts(n)) m.accepted.push_back(n);
  return m;
}

bool ApiServer::Impl::route_vllm(const HttpRequest& req, HttpResponse& res) {
  const std::string& path = req.path;
  if (req.method == "GET") {
    if (path.rfind("/v1/models/", 0) == 0) {
      const std::string id = path.substr(std::string("/v1/models/").size());
      const ModelNames names = model_names();
      if (!names.accepts(id)) {
        send_error(res, 404, model_not_found_body(id, names));
        return true;
      }
      res.body = dump_json(model_card(id, int64_t(std::time(nullptr)), engine.max_context_len()));
      return true;
    }
    if (path.rfind("/v1/responses/", 0) == 0) {
      get_stored_response(path.substr(std::string("/v1/responses/").size()), res);
      return true;
    }
    if (path == "/version") {
      res.body = dump_json({{"version", kVersion}});
      return true;
    }
    if (path == "/get_server_info") {
      const EngineStats st = engine.stats();
      const ModelNames names = model_names();
      res.body = dump_json({{"version", kVersion},
                            {"model_path", opts.served_model_name},
                            {"served_model_name", names.served},
                            {"is_generation", !engine.is_embedding_model()},
                            {"max_context_len", engine.max_context_len()},
                            {"max_total_num_tokens", st.kv_pages_total * st.page_size},
                            {"page_size", st.page_size},
                            {"host", opts.host},
                            {"port", bound_port},
                            {"stream_interval", opts.stream_interval},
                            {"reasoning_parser", opts.reasoning_parser},
                            {"tool_call_parser", opts.tool_call_parser},
                            {"max_body_bytes", opts.max_body_bytes},
                            {"max_connections", opts.max_connections},
                            {"api_key_required", !opts.api_key.empty()},
                            {"allowed_origins", opts.cors.allowed_origins},
                            {"max_stored_responses", opts.max_stored_responses}});
      return true;
    }
  }
  if (path == "/health_generate" && (req.method == "GET" || req.method == "POST")) {
    run_guarded(res, [&] {
      if (draining) throw ApiError(503, "the server is shutting down", "", "service_unavailable");
      HttpRequest probe = req;
      probe.method = "POST";
      if (engine.is_embedding_model()) {
        probe.body = R"({"input": [0]})";
        handle_embeddings(probe, res);
      } else {
        probe.body = R"({"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})";
        handle_generation(Endpoint::generate, probe, res);
      }
      res.source = std::make_shared<HealthGenerateSource>(std::move(res.source));
    });
    return true;
  }
  if (req.method != "POST") return false;
  if (path == "/v1/responses") {
    run_guarded(res, [&] { handle_responses(req, res); });
    return true;
  }
  if (path == "/v1/rerank" || path == "/v2/rerank" || path == "/rerank" || path == "/score" ||
      path == "/v1/score") {
    run_guarded(res, [&] { handle_rerank(req, res, path == "/score" || path == "/v1/score"); });
    return true;
  }
  if (path == "/tokenize") {
    run_guarded(res, [&] { res.body = dump_json(tokenize_request(parse_body(req.body), codec, limits())); });
    return true;
  }
  if (path == "/detokenize") {
    run_guarded(res,
                [&] { res.body = dump_json(detokenize_request(parse_body(req.body), codec, limits())); });
    return true;
  }
  return false;
}

}  // namespace kiln::server
