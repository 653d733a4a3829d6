// ApiServer: the OpenAI/SGLang-compatible HTTP front of kiln, over the event-driven transport of
// server/http_transport.h (Boost.Beast on Boost.Asio).
//
//   POST /v1/chat/completions  /v1/completions  /v1/responses  /v1/embeddings  /generate  /flush_cache
//        /tokenize  /detokenize  /v1/rerank  /v2/rerank  /rerank  /score  /v1/score (--task rerank)
//   GET  /v1/models  /v1/models/{id}  /health  /metrics  /get_model_info  /version  /get_server_info
//        /health_generate  /v1/responses/{id}
// A known path asked with another method gets 405 with Allow; OPTIONS preflights get CORS (server/cors.h).
//
// Connections are multiplexed on `http_threads` I/O threads; the GET routes are answered there from
// snapshots (never waiting on the engine), the POST routes are parsed, tokenized and submitted on
// `http_workers` threads. A generation response holds no thread while it waits: each engine event wakes
// its connection, which writes what was released (SSE frames as they come, or one JSON body at the end).
// A client that goes away is noticed at the next event (or within a second) and its engine request is
// aborted, freeing its pages.
//
// Lifecycle: bind() -> listen() (blocks) on one thread; from another: begin_drain() (new requests get
// 503, /health turns 503), wait_idle(timeout), end_all() (every stream ends with a final chunk and [DONE]),
// wait_idle(short), stop(). The server never owns the engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/backend.h"
#include "server/cors.h"
#include "server/images.h"
#include "server/metrics.h"

namespace kiln::server {

struct RerankSetup;  // server/rerank.h

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8000;                 // 0: any free port (see ApiServer::port())
  std::string api_key;             // non-empty: every route except /health and /metrics needs "Bearer <key>"
  std::string served_model_name = "kiln";
  size_t max_body_bytes = 16u << 20;                // larger bodies get 413
  int http_threads = 2;                             // I/O threads: every connection is served on one of them
  int http_workers = 2;                             // threads parsing and submitting POST requests
  int max_connections = 4096;                       // beyond: 503 with Retry-After, connection closed
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive: idle connections closed after this
  std::chrono::milliseconds header_timeout{10000};  // first byte to end of headers, else 408
  std::chrono::milliseconds body_timeout{30000};    // end of headers to end of body, else 408
  std::chrono::milliseconds write_timeout{30000};   // a client not reading for this long is dropped
  int retry_after_s = 1;                            // Retry-After on 503
  // Model names (server/model_names.h): served_model_name is echoed by responses and labels /metrics;
  // more_served_model_names are listed by /v1/models too; model_aliases (--model as given, its basename)
  // are accepted in "model" but not listed.
  std::vector<std::string> more_served_model_names;
  std::vector<std::string> model_aliases;
  // --allowed-origins (server/cors.h): vLLM's default, every origin.
  CorsPolicy cors;
  // /v1/responses kept in memory for previous_response_id; past it the oldest is dropped.
  size_t max_stored_responses = 1024;
  // "vllm": /metrics also carries vLLM's names (server/metrics_compat.h); "": kiln's only.
  std::string metrics_compat;
  // Streaming: a response's connection is woken, and a chunk written, once this many tokens have arrived
  // since the last (the first token at once; the end always): SGLang's --stream-interval.
  int stream_interval = 1;
  // Chat output parsing. reasoning_parser: "auto" (on when the chat template thinks), "qwen3", "none".
  // tool_call_parser: "qwen25" (Qwen's <tool_call> JSON blocks, SGLang's name) or "none".
  std::string reasoning_parser = "auto";
  std::string tool_call_parser = "qwen25";
  // Request defaults from generation_config.json (server/generation_config.h); empty: none.
  SamplingParams sampling_defaults;
  std::vector<int32_t> extra_eos_ids;
  // A vision-language checkpoint's image inputs (processor config, limits, token ids, URL fetching); null for
  // a text-only model, which answers 400 to any image.
  std::shared_ptr<const VisionSetup> vision;
  // --task rerank (server/rerank.h): the Qwen3-Reranker's yes/no ids and prompt; null: the rerank and score
  // routes answer 400.
  std::shared_ptr<const RerankSetup> rerank;
  // --log-level debug: each POST's top-level fields that kiln does not read are logged to stderr
  // (server/request_fields.h); such fields are accepted and ignored, and this is where a user sees them.
  bool log_unknown_fields = false;

  // Structured output (server/structured_output.h): --grammar-lenient drops JSON Schema keywords the engine
  // cannot enforce (else a 400 names them); compiles run on their own threads, each request waiting at most
  // --grammar-compile-timeout-ms.
  bool grammar_lenient = false;
  int grammar_compile_threads = 2;
  int grammar_compile_timeout_ms = 10000;
};

class ApiServer {
 public:
  ApiServer(EngineApi& engine, const TextCodec& codec, ServerOptions opts);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the socket; throws kiln::Error when the address cannot be bound. Returns the port.
  int bind();
  // Serves until stop(). Call after bind().
  void listen();
  int port() const;
  bool running() const;  // listen() has started and stop() not yet been called

  void begin_drain();
  bool draining() const;
  // True when no accepted request is still in flight (waits up to `timeout`).
  bool wait_idle(std::chrono::milliseconds timeout);
  // Aborts every in-flight request in the engine (each still ends, as "abort", and is counted).
  void abort_all();
  // Aborts every in-flight request in the engine AND ends its response at once, without waiting for the
  // engine (which may be in a long step): a stream gets a final chunk with finish_reason "abort", then
  // `data: [DONE]` and the chunked terminator; a whole reply ends as an abort too (finish_reason "abort";
  // /v1/embeddings: 503). Each is counted as aborted once its
  // bytes are handed to the socket (wait_idle then returns true). The drain's last act.
  void end_all();
  void stop();

  const ServerCounters& counters() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
