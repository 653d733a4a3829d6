// kiln serve: the OpenAI/SGLang-compatible HTTP server (src/server) over one engine.
//   kiln serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key K] [--served-model-name X [Y ...]]
//              [--allowed-origins '["*"]'] [--max-stored-responses N] [--metrics-compat vllm]
//              [--task generate|rerank] [--max-prompt-logprob-tokens N] [--log-level info|debug]
//              [--device auto|cpu|cuda|cuda:N] [--load-format auto|random] [--quantization none|fp8]
//              [--page-size 32]
//              [--kv-layout nhd|hnd] [--kv-cache-dtype auto|bf16|fp8_e4m3] [--max-total-tokens N]
//              [--mem-fraction F] [--chunked-prefill-size N] [--max-prefill-chunk-ms MS]
//              [--max-running-requests N] [--max-queue N]
//              [--max-context-len N] [--max-body-bytes N] [--http-threads N] [--http-workers N]
//              [--max-connections N] [--http-idle-timeout S] [--http-header-timeout S]
//              [--http-body-timeout S] [--http-write-timeout S] [--drain-timeout S] [--stream-interval N]
//              [--disable-prefix-cache] [--disable-mixed-batches] [--disable-cuda-graph]
//              [--cuda-graph-bs 1,2,4,...] [--disable-pdl] [--disable-overlap-schedule] [--seed S]
//              [--sampling-backend auto|cpu] [--is-embedding]
//              [--reasoning-parser auto|qwen3|none] [--tool-call-parser qwen25|none]
//              [--generation-config auto|none]
//              [--grammar-lenient] [--grammar-compile-timeout-ms MS] [--grammar-mask-timeout-ms MS]
//              [--tp N] [--nnodes N --node-rank R --dist-init-addr HOST:PORT]
//              [--speculative-algorithm ngram --speculative-num-draft-tokens N ...] (cli/spec_flags.h)
//              [--max-images-per-request N] [--max-image-bytes N] [--max-image-pixels N]
//              [--image-url-fetch on|off] [--image-fetch-timeout S] [--image-url-allow-private]
//              [--image-decode-timeout S] [--image-max-resized-pixels N]
// --tp N shards the model over N ranks (GPUs cuda:N.., or CPU threads with --device cpu):
// runtime/tp_runner.h. Across nodes every node runs `kiln serve` with the same flags and its own --node-rank;
// node 0 serves HTTP, the others load their ranks and follow node 0's steps until it stops. A rank that fails
// stops the server (exit 1) with the rank's error.
// Images (a Qwen3-VL checkpoint: config.json has a vision_config): at most --max-images-per-request (16)
// images per request, each at most --max-image-bytes encoded (20 MiB) and --max-image-pixels decoded
// (89,478,485, PIL's limit; a JPEG or PNG with too little data for the size it declares is refused before
// decoding), decoded within --image-decode-timeout seconds (10); http(s) image URLs are fetched unless
// --image-url-fetch off, each within
// --image-fetch-timeout seconds (10). A data: URL travels in the body: --max-body-bytes (16 MiB) bounds it
// too.
// --max-prefill-chunk-ms MS: a step computes at most the prefill tokens that the last measured rate fits into
// MS milliseconds (-1, the default: 500 on the CPU backend, off on CUDA), so aborts and shutdown are seen
// between steps.
// Model names (server/model_names.h): --served-model-name takes one or more names (vLLM's form; the flag may
// also repeat); the first is echoed by responses. The --model argument as given and its basename are always
// accepted in a request's "model". --allowed-origins: CORS (server/cors.h), vLLM's default '["*"]'; '[]' off.
// --max-stored-responses (1024): /v1/responses kept in memory for previous_response_id, oldest dropped first.
// --metrics-compat vllm: /metrics also under vLLM's names (server/metrics_compat.h).
// --task rerank (vLLM's --task score is the same): a Qwen3ForCausalLM checkpoint used as a Qwen3-Reranker
// also answers /v1/rerank, /rerank, /score and /v1/score (server/rerank.h); the generation routes stay.
// --max-prompt-logprob-tokens N (32768): prompt positions one request may ask log-probabilities for
// (prompt_logprobs, echo + logprobs, logprob_start_len); past it a 400 names the limit.
// --log-level debug: every POST's top-level fields that kiln does not read (accepted and ignored) are logged
// to stderr (server/request_fields.h); info (the default) logs no per-request lines.
// --is-embedding (SGLang's flag): serve a checkpoint that does not say it is an embedding model (a
// Qwen3ForCausalLM without modules.json) for /v1/embeddings: last-token pooling, L2-normalised.
// SIGINT/SIGTERM: stop accepting (503, /health 503), let in-flight requests finish for up to
// --drain-timeout seconds (default 30), then end the rest as aborted (each stream gets a final chunk with
// finish_reason "abort", then [DONE]) and exit within a second, even while the engine is inside a long step;
// a second signal does that at once. Every accepted request ends (completed, error or aborted) and is
// counted; the totals are printed at exit.
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "cli/client_flags.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/spec_flags.h"
#include "cli/tp_flags.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "ops/attn_prep.h"
#include "runtime/engine.h"
#include "runtime/tp_runner.h"
#include "server/backend_engine.h"
#include "server/generation_config.h"
#include "server/model_names.h"
#include "server/rerank.h"
#include "server/server.h"

namespace {

using namespace std::chrono_literals;

std::set<std::string> serve_flags() {
  std::set<std::string> s = {"model",
                             "host",
                             "port",
                             "api-key",
                             "served-model-name",
                             "reasoning-parser",
                             "tool-call-parser",
                             "generation-config",
                             "device",
                             "load-format",
                             "quantization",
                             "page-size",
                             "kv-layout",
                             "kv-cache-dtype",
                             "max-total-tokens",
                             "mem-fraction",
                             "chunked-prefill-size",
                             "max-prefill-chunk-ms",
                             "max-running-requests",
                             "max-queue",
                             "max-context-len",
                             "max-body-bytes",
                             "http-threads",
                             "http-workers",
                             "max-connections",
                             "http-idle-timeout",
                             "http-header-timeout",
                             "http-body-timeout",
                             "http-write-timeout",
                             "stream-interval",
                             "drain-timeout",
                             "seed",
                             "cuda-graph-bs",
                             "sampling-backend",
                             "max-images-per-request",
                             "max-image-bytes",
                             "max-image-pixels",
                             "image-url-fetch",
                             "image-fetch-timeout",
                             "image-decode-timeout",
                             "image-max-resized-pixels",
                             "allowed-origins",
                             "max-stored-responses",
                             "metrics-compat",
                             "task",
                             "log-level",
                             "max-prompt-logprob-tokens",
                             "grammar-compile-timeout-ms",
                             "grammar-mask-timeout-ms"};
  s.insert(kiln::cli::kTpFlags.begin(), kiln::cli::kTpFlags.end());
  s.insert(kiln::cli::kSpecFlags.begin(), kiln::cli::kSpecFlags.end());
  return s;
}

// --served-model-name takes every word up to the next flag (vLLM's nargs="+") and may repeat: the words are
// taken out of `args` here, before Flags sees them.
std::vector<std::string> take_served_model_names(kiln::cli::Args& args) {
  std::vector<std::string> names;
  kiln::cli::Args rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--served-model-name=", 0) == 0) {
      names.push_back(a.substr(a.find('=') + 1));
    } else if (a == "--served-model-name") {
      KILN_CHECK(i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0,
                 "flag --served-model-name needs a value");
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) names.push_back(args[++i]);
    } else {
      rest.push_back(a);
    }
  }
  args = std::move(rest);
  for (const auto& n : names) KILN_CHECK(!n.empty(), "--served-model-name must not be empty");
  return names;
}

int run_serve(const kiln::cli::Args& given_args) {
  kiln::cli::Args args = given_args;
  const std::vector<std::string> served_names = take_served_model_names(args);
  const kiln::cli::Flags f(
      args, serve_flags(),
      {"disable-prefix-cache", "disable-mixed-batches", "disable-cuda-graph", "disable-pdl",
       "enable-overlap-schedule", "disable-overlap-schedule", "is-embedding", "image-url-allow-private",
       "enable-expert-parallel", "grammar-lenient"});
  KILN_CHECK(f.positional().empty(), "unexpected argument '", f.positional().empty() ? "" : f.positional()[0],
             "'");

  kiln::EngineOptions eo;
  eo.model_dir = f.required("model");
  eo.device = f.str("device", "auto");
  eo.is_embedding = f.flag("is-embedding");
  eo.load_format = f.str("load-format", "auto");
  eo.quantization = f.str("quantization", "none");
  eo.kv_layout = f.str("kv-layout", "nhd");
  eo.kv_cache_dtype = f.str("kv-cache-dtype", "auto");
  eo.page_size = int(f.i64("page-size", 32));
  eo.max_total_tokens = f.i64("max-total-tokens", 0);
  eo.mem_fraction = f.f64("mem-fraction", eo.mem_fraction);
  eo.chunked_prefill_size = int(f.i64("chunked-prefill-size", eo.chunked_prefill_size));
  const int64_t chunk_ms = f.i64("max-prefill-chunk-ms", eo.max_prefill_chunk_ms);
  KILN_CHECK(
      chunk_ms >= -1 && chunk_ms <= 3'600'000,
      "--max-prefill-chunk-ms must be -1 (auto: 500 on the CPU, off on CUDA), 0 (off) or milliseconds up "
      "to 3600000, got ",
      chunk_ms);
  eo.max_prefill_chunk_ms = int(chunk_ms);
  eo.max_running_requests = int(f.i64("max-running-requests", eo.max_running_requests));
  eo.max_queued_requests = int(f.i64("max-queue", eo.max_queued_requests));
  eo.max_context_len = f.i64("max-context-len", 0);
  eo.max_prompt_logprob_tokens = f.i64("max-prompt-logprob-tokens", eo.max_prompt_logprob_tokens);
  KILN_CHECK(eo.max_prompt_logprob_tokens >= 0, "--max-prompt-logprob-tokens must be >= 0, got ",
             eo.max_prompt_logprob_tokens);
  const std::string task = f.str("task", "generate");
  KILN_CHECK(task == "generate" || task == "rerank" || task == "score",
             "--task must be generate, rerank or score (vLLM's name for rerank), got '", task, "'");
  const int64_t mask_ms = f.i64("grammar-mask-timeout-ms", eo.grammar_mask_timeout_ms);
  KILN_CHECK(mask_ms >= 1 && mask_ms <= 600000, "--grammar-mask-timeout-ms must be in [1, 600000], got ",
             mask_ms);
  eo.grammar_mask_timeout_ms = int(mask_ms);
  if (eo.max_context_len > kiln::kMaxContextTokens)  // the rotary table is sized by it (kiln/config.h)
    KILN_FAIL("--max-context-len ", eo.max_context_len, " is past kiln's limit of ", kiln::kMaxContextTokens);
  eo.enable_prefix_cache = !f.flag("disable-prefix-cache");
  eo.enable_mixed_batches = !f.flag("disable-mixed-batches");
  eo.disable_cuda_graph = f.flag("disable-cuda-graph");
  eo.disable_pdl = f.flag("disable-pdl");
  // On by default; --enable-overlap-schedule (its name before it was) is still accepted.
  KILN_CHECK(!(f.flag("enable-overlap-schedule") && f.flag("disable-overlap-schedule")),
             "--enable-overlap-schedule and --disable-overlap-schedule contradict each other");
  eo.overlap_schedule = !f.flag("disable-overlap-schedule");
  if (f.has("cuda-graph-bs"))
    for (int64_t b : kiln::cli::parse_int_list(f.str("cuda-graph-bs"), "cuda-graph-bs")) {
      KILN_CHECK(b <= 4096, "--cuda-graph-bs ", b, " is too large (at most 4096)");
      eo.cuda_graph_buckets.push_back(int(b));
    }
  eo.seed = uint64_t(f.i64("seed", 0));
  eo.sampling_backend = f.str("sampling-backend", eo.sampling_backend);  // auto | cpu
  kiln::cli::read_tp_flags(f, eo);
  kiln::cli::read_spec_flags(f, eo);
  if (eo.node_rank > 0) {  // a follower node: no HTTP, its ranks take node 0's steps until node 0 stops
    kiln::run_tp_follower(eo, kiln::tp_runner_options(eo));
    std::fprintf(stderr, "kiln serve: node %d: node 0 stopped; exiting\n", eo.node_rank);
    return 0;
  }

  kiln::server::ServerOptions so;
  so.host = f.str("host", "127.0.0.1");
  const int64_t port = f.i64("port", 8000);
  KILN_CHECK(port >= 0 && port <= 65535, "--port must be in [0, 65535], got ", port);
  so.port = int(port);
  so.api_key = f.str("api-key", "");
  if (so.api_key.empty())
    if (const char* k = std::getenv("KILN_API_KEY"); k && *k) so.api_key = k;
  const kiln::server::ModelNames names = kiln::server::make_model_names(served_names, eo.model_dir);
  so.served_model_name = names.primary();
  so.more_served_model_names.assign(names.served.begin() + 1, names.served.end());
  so.model_aliases = names.accepted;
  so.cors.allowed_origins = kiln::server::parse_allowed_origins(f.str("allowed-origins", "[\"*\"]"));
  const int64_t stored = f.i64("max-stored-responses", int64_t(so.max_stored_responses));
  KILN_CHECK(stored >= 0 && stored <= 1000000, "--max-stored-responses must be in [0, 1000000], got ",
             stored);
  so.max_stored_responses = size_t(stored);
  so.metrics_compat = f.str("metrics-compat", "");
  const std::string log_level = f.str("log-level", "info");
  KILN_CHECK(log_level == "info" || log_level == "debug", "--log-level must be info or debug, got '",
             log_level, "'");
  so.log_unknown_fields = log_level == "debug";
  KILN_CHECK(so.metrics_compat.empty() || so.metrics_compat == "vllm", "--metrics-compat must be vllm, got '",
             so.metrics_compat, "'");
  const int64_t body = f.i64("max-body-bytes", int64_t(so.max_body_bytes));
  KILN_CHECK(body >= 1024, "--max-body-bytes must be >= 1024, got ", body);
  so.max_body_bytes = size_t(body);
  so.http_threads = int(f.i64("http-threads", so.http_threads));
  KILN_CHECK(so.http_threads >= 1 && so.http_threads <= 256, "--http-threads must be in [1, 256]");
  so.http_workers = int(f.i64("http-workers", so.http_workers));
  KILN_CHECK(so.http_workers >= 1 && so.http_workers <= 256, "--http-workers must be in [1, 256]");
  const int64_t max_conn = f.i64("max-connections", so.max_connections);
  KILN_CHECK(max_conn >= 1 && max_conn <= 1000000, "--max-connections must be in [1, 1000000]");
  so.max_connections = int(max_conn);
  auto seconds_flag = [&](const char* name, std::chrono::milliseconds def) {
    const double s = f.f64(name, double(def.count()) / 1000.0);
    KILN_CHECK(s > 0 && s <= 86400, "--", name, " must be in (0, 86400] seconds, got ", s);
    return std::chrono::milliseconds(int64_t(s * 1000));
  };
  so.idle_timeout = seconds_flag("http-idle-timeout", so.idle_timeout);
  so.header_timeout = seconds_flag("http-header-timeout", so.header_timeout);
  so.body_timeout = seconds_flag("http-body-timeout", so.body_timeout);
  so.write_timeout = seconds_flag("http-write-timeout", so.write_timeout);
  const int64_t interval = f.i64("stream-interval", so.stream_interval);
  KILN_CHECK(interval >= 1 && interval <= 1000000, "--stream-interval must be in [1, 1000000], got ",
             interval);
  so.stream_interval = int(interval);
  so.reasoning_parser = f.str("reasoning-parser", so.reasoning_parser);
  KILN_CHECK(so.reasoning_parser == "auto" || so.reasoning_parser == "qwen3" || so.reasoning_parser == "none",
             "--reasoning-parser must be auto, qwen3 or none, got '", so.reasoning_parser, "'");
  so.grammar_lenient = f.flag("grammar-lenient");
  const int64_t compile_ms = f.i64("grammar-compile-timeout-ms", so.grammar_compile_timeout_ms);
  KILN_CHECK(compile_ms >= 1 && compile_ms <= 600000,
             "--grammar-compile-timeout-ms must be in [1, 600000], got ", compile_ms);
  so.grammar_compile_timeout_ms = int(compile_ms);
  so.tool_call_parser = f.str("tool-call-parser", so.tool_call_parser);
  KILN_CHECK(so.tool_call_parser == "qwen25" || so.tool_call_parser == "none",
             "--tool-call-parser must be qwen25 or none, got '", so.tool_call_parser, "'");
  const std::string gen_config = f.str("generation-config", "auto");
  KILN_CHECK(gen_config == "auto" || gen_config == "none", "--generation-config must be auto or none, got '",
             gen_config, "'");
  kiln::vision::ImageLimits image_limits;
  image_limits.max_images = int(f.i64("max-images-per-request", image_limits.max_images));
  KILN_CHECK(image_limits.max_images >= 0 && image_limits.max_images <= 1024,
             "--max-images-per-request must be in [0, 1024]");
  const int64_t image_bytes = f.i64("max-image-bytes", int64_t(image_limits.max_bytes));
  KILN_CHECK(image_bytes >= 1, "--max-image-bytes must be >= 1");
  image_limits.max_bytes = size_t(image_bytes);
  image_limits.max_pixels = f.i64("max-image-pixels", image_limits.max_pixels);
  KILN_CHECK(image_limits.max_pixels >= 1, "--max-image-pixels must be >= 1");
  image_limits.max_decode_seconds = f.f64("image-decode-timeout", image_limits.max_decode_seconds);
  KILN_CHECK(image_limits.max_decode_seconds > 0 && image_limits.max_decode_seconds <= 3600,
             "--image-decode-timeout must be in (0, 3600] seconds, got ", image_limits.max_decode_seconds);
  image_limits.max_resized_pixels = f.i64("image-max-resized-pixels", 0);
  KILN_CHECK(image_limits.max_resized_pixels >= 0,
             "--image-max-resized-pixels must be >= 0 (0: the checkpoint's)");
  kiln::server::ImageFetchOptions fetch;
  const std::string url_fetch = f.str("image-url-fetch", "on");
  KILN_CHECK(url_fetch == "on" || url_fetch == "off", "--image-url-fetch must be on or off, got '", url_fetch,
             "'");
  fetch.allow_urls = url_fetch == "on";
  fetch.allow_private = f.flag("image-url-allow-private");  // server/address_policy.h
  fetch.timeout = seconds_flag("image-fetch-timeout", fetch.timeout);
  const double drain_s = f.f64("drain-timeout", 30.0);
  KILN_CHECK(drain_s >= 0, "--drain-timeout must be >= 0");

  // Signals are taken by sigtimedwait on this thread only: block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that vanished is a failed write, not a dead server

  const kiln::Tokenizer tok = kiln::Tokenizer::load(eo.model_dir);
  std::unique_ptr<kiln::Engine> engine = kiln::Engine::create(eo);
  kiln::server::EngineAdapter api(*engine);
  kiln::server::TokenizerCodec codec(tok);
  std::fprintf(stderr, "kiln serve: chat template: %s\n", tok.chat_template_info().c_str());
  if (kiln::ops::attn_prep_unfused_forced())
    std::fprintf(stderr, "kiln serve: attention preparation: unfused (KILN_ATTN_PREP=unfused)\n");
  std::string vision_note;
  so.vision = kiln::server::load_vision_setup(eo.model_dir, tok, image_limits, fetch, vision_note);
  if (!vision_note.empty()) std::fprintf(stderr, "kiln serve: %s\n", vision_note.c_str());
  if (so.vision)
    std::fprintf(
        stderr,
        "kiln serve: images: up to %d per request, %zu bytes and %lld pixels each, resized to %lld..%lld "
        "pixels (multiples of %d); http(s) URLs %s\n",
        image_limits.max_images, image_limits.max_bytes, (long long)image_limits.max_pixels,
        (long long)so.vision->processor.min_pixels, (long long)so.vision->processor.max_pixels,
        so.vision->processor.factor(), fetch.allow_urls ? "fetched" : "refused");
  if (gen_config == "auto" && !engine->is_embedding_model()) {
    kiln::server::GenerationDefaults gd =
        kiln::server::load_generation_config(eo.model_dir, engine->model_config().vocab_size);
    for (const auto& w : gd.warnings)
      std::fprintf(stderr, "kiln serve: generation_config.json: %s\n", w.c_str());
    if (!gd.applied.empty()) {
      std::string list;
      for (const auto& a : gd.applied) list += (list.empty() ? "" : ", ") + a;
      std::fprintf(stderr, "kiln serve: request defaults from generation_config.json: %s\n", list.c_str());
    }
    so.sampling_defaults = gd.sampling;
    so.extra_eos_ids = std::move(gd.eos_ids);
  }
  if (task != "generate") {
    KILN_CHECK(!engine->is_embedding_model(), "--task ", task,
               " needs a causal LM checkpoint (a Qwen3-Reranker), not an embedding model");
    so.rerank = std::make_shared<const kiln::server::RerankSetup>(kiln::server::make_rerank_setup(codec));
    std::fprintf(stderr, "kiln serve: reranker: score = sigmoid(logit(\"yes\" = %d) - logit(\"no\" = %d))\n",
                 so.rerank->yes_id, so.rerank->no_id);
  }
  kiln::server::ApiServer server(api, codec, so);
  const int bound = server.bind();
  std::atomic<bool> listen_done{false};
  std::thread http([&] {
    server.listen();
    listen_done = true;
  });
  std::fprintf(stderr, "kiln serve: model '%s' (%s), max context %lld tokens, listening on http://%s:%d%s\n",
               so.served_model_name.c_str(), engine->is_embedding_model() ? "embeddings" : "generation",
               (long long)engine->max_context_len(), so.host.c_str(), bound,
               so.api_key.empty() ? "" : " (API key required)");
  {
    const kiln::EngineStats st = engine->stats();
    std::fprintf(stderr, "kiln serve: KV pool %lld pages of %d = %lld tokens (%s cache, %s layout)\n",
                 (long long)st.kv_pages_total, st.page_size, (long long)st.kv_pages_total * st.page_size,
                 eo.kv_cache_dtype.c_str(), eo.kv_layout.c_str());
  }
  std::fprintf(stdout, "READY http://%s:%d\n", so.host.c_str(), bound);
  std::fflush(stdout);

  auto wait_signal = [&](std::chrono::milliseconds ms) {
    const timespec ts{time_t(ms.count() / 1000), long(ms.count() % 1000) * 1000000L};
    return sigtimedwait(&sigs, nullptr, &ts);
  };
  int sig = -1;
  std::string fatal;
  while (sig <= 0 && !listen_done && fatal.empty()) {
    sig = wait_signal(200ms);
    fatal = engine->fatal_error();
  }
  if (!fatal.empty()) std::fprintf(stderr, "kiln serve: the engine stopped: %s\n", fatal.c_str());
  std::fprintf(
      stderr, "kiln serve: %s: draining %lld in-flight request(s) for up to %.0f s (signal again to abort)\n",
      !fatal.empty()   ? "the engine failed"
      : sig == SIGTERM ? "SIGTERM"
      : sig == SIGINT  ? "SIGINT"
                       : "the listener stopped",
      (long long)server.counters().active.load(), drain_s);
  server.begin_drain();
  // The drain's deadline is hard: every request still open at it is ended by the server (each stream gets a
  // final chunk with finish_reason "abort" and [DONE]), and the process exits within a second of it even
  // when the engine is inside a step that will not end soon. A second signal skips to that at once.
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(int64_t(drain_s * 1000));
  bool forced = false;
  while (!server.wait_idle(50ms)) {
    if (wait_signal(0ms) > 0) {
      forced = true;
      std::fprintf(stderr, "kiln serve: second signal: aborting every request now\n");
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  const auto ended_at = std::chrono::steady_clock::now();
  if (server.counters().active.load() > 0) {
    std::fprintf(
        stderr,
        "kiln serve: aborting %lld request(s): each ends now, a stream with finish_reason abort and [DONE]\n",
        (long long)server.counters().active.load());
    server.end_all();
    server.wait_idle(500ms);  // their last chunks handed to the sockets
  }
  // What is left (closing connections, the engine's current step) gets the rest of one second.
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false;
  std::thread closer([&] {
    // stop() only reaches a server that is listening: wait for listen() to have started (or ended).
    while (!server.running() && !listen_done) std::this_thread::sleep_for(5ms);
    server.stop();
    http.join();
    engine->shutdown(/*drain=*/false);
    std::lock_guard<std::mutex> lk(stop_mu);
    stopped = true;
    stop_cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lk(stop_mu);
    const auto hard = ended_at + (forced ? 500ms : 900ms);
    while (!stopped && std::chrono::steady_clock::now() < hard)
      if (stop_cv.wait_for(lk, 20ms, [&] { return stopped; })) break;
  }
  // The accounting line, the same whichever way the process ends (tests and operators read it).
  const auto print_accounting = [&] {
    const auto& c = server.counters();
    std::fprintf(
        stderr,
        "kiln serve: stopped. accepted %lld: completed %lld, error %lld, aborted %lld; rejected: invalid "
        "%lld, busy %lld, auth %lld\n",
        (long long)c.accepted.load(), (long long)c.completed.load(), (long long)c.errored.load(),
        (long long)c.aborted.load(), (long long)c.rejected_invalid.load(), (long long)c.rejected_busy.load(),
        (long long)c.rejected_auth.load());
  };
  if (!stopped) {
    std::fprintf(
        stderr, "kiln serve: the engine is still inside a step %.1f s after the signal; exiting without it\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    print_accounting();
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(sig > 0 && fatal.empty() ? 0 : 1);  // no destructor may wait for the engine thread
  }
  closer.join();
  print_accounting();
  return sig > 0 && fatal.empty() ? 0 : 1;  // a listener that stopped on its own, or a failed rank: failure
}

}  // namespace

KILN_COMMAND("serve",
             "OpenAI/SGLang-compatible HTTP server (chat, completions, embeddings, /generate, /metrics)",
             run_serve);
