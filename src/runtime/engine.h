// Engine: the serving runtime's one public face. One engine thread owns the model, the KV cache and the
// scheduler; every other thread (HTTP workers, the CLI) talks to it only through submit / abort /
// flush_cache / stats / shutdown, which are thread-safe.
//
// Contract for callers (the server):
//   * submit() validates the request synchronously and throws before anything is queued:
//       - kiln::Error             bad input (empty or over-long prompt, token id out of range, non-finite
//                                  or out-of-range sampling parameters, generation on an embedding model...)
//                                  -> HTTP 400 with e.what()
//       - kiln::EngineBusyError   the waiting queue is full, or the engine is shutting down
//                                  -> HTTP 503 with Retry-After
//   * Once submit() returns an id, the request WILL end exactly once with an event whose finished == true
//     and finish_reason in {"stop", "length", "abort", "error"}; it is counted in EngineStats.
//   * on_event runs on the engine thread. It must not block or call back into the engine except abort()
//     and stats() (safe there); never flush_cache() or shutdown() from it. The server copies the event
//     into its own queue.
//   * Stop STRINGS are the server's job (it detokenizes) -> it calls abort() and reports "stop" itself;
//     the engine counts such a request as finished_abort. Stop token ids, EOS, max_new_tokens, and the
//     context limit are handled here.
//   * stats(): counters are updated before a final event is delivered; page counts are exact whenever
//     the engine is idle (refreshed every 16 steps while it runs; kv_pages_free is always exact).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/config.h"
#include "kiln/error.h"
#include "spec/spec_options.h"
#include "spec/spec_stats.h"
#include "vision/image_input.h"

namespace kiln::grammar {
class CompiledGrammar;  // kiln/grammar.h
}

namespace kiln {

// Thrown by submit() when the request cannot be queued now (queue full, shutting down): HTTP 503.
class EngineBusyError : public Error {
 public:
  explicit EngineBusyError(const std::string& what) : Error(what) {}
};

using RequestId = uint64_t;

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy; must be finite and >= 0
  float top_p = 1.0f;        // (0, 1]
  int top_k = -1;            // -1 or 0 = disabled; else >= 1
  float min_p = 0.0f;        // [0, 1]
  int64_t seed = -1;         // -1 = engine-chosen; else a per-request deterministic stream
  int max_new_tokens = 16;   // >= 0 (0: only prefill; useful with return_hidden / logprobs)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  // if false, the model's eos_token_ids end the request with "stop"
  // Logit processing before the draw (runtime/logit_processor.h has the exact order and arithmetic).
  float presence_penalty = 0.0f;    // [-2, 2]: subtracted once from each id generated so far
  float frequency_penalty = 0.0f;   // [-2, 2]: times the id's count among the generated tokens
  float repetition_penalty = 1.0f;  // (0, 2]: ids in the prompt or generated: logit > 0 divided, else times
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id in [0, vocab), bias in [-100, 100]) added
  int min_new_tokens = 0;  // [0, max_new_tokens]: stop ids and EOS are masked until this many are generated
  bool return_logprob = false;
  int top_logprobs = 0;  // 0..20: alternatives per generated token (needs return_logprob)
};

struct Request {
  std::vector<int32_t> prompt;  // token ids, non-empty, each in [0, vocab)
  SamplingParams sampling;
  bool embedding = false;      // run forward_hidden over the prompt, reply once with `embedding`
  bool return_hidden = false;  // also report the last position's final hidden state
  // Parallel samples of one prompt (OpenAI's n): when non-zero, this request is held back until request
  // `after_prefill_of` has computed its whole prompt (or ended), so that it finds that prompt's full
  // pages in the prefix cache and computes only the tail (under one page, plus the last token). The
  // prompt is then prefilled once for all n samples. No effect with the prefix cache off or when that
  // request is not running any more.
  RequestId after_prefill_of = 0;
  // Qwen3-VL: the request's images in prompt order. `prompt` already holds, for image i, the vision-start
  // token, images[i].merged_tokens(merge) image-pad tokens, and the vision-end token (as transformers'
  // processor expands them); the engine encodes the images and puts their embeddings at those pads.
  // Must be empty for a text-only model.
  std::vector<vision::ImagePatches> images;
  // Prompt log-probabilities (vLLM's prompt_logprobs, SGLang's input_token_logprobs), computed in the
  // prefill that runs anyway (runtime/prompt_logprobs.h): for each prompt position p in
  // [max(1, prompt_logprobs_from), prompt length) the log-probability of prompt[p] after prompt[0, p), its
  // rank and the prompt_top_logprobs (0..20) most likely tokens there. -1: none. The prefix cache serves
  // such a request at most prompt_logprobs_from - 1 tokens (the rows whose logits are asked are computed),
  // and its prompt is prefilled at most kPromptLogprobChunk tokens per step. At most
  // EngineOptions::max_prompt_logprob_tokens positions.
  int32_t prompt_logprobs_from = -1;
  int32_t prompt_top_logprobs = 0;
  // Scoring (the Qwen3-Reranker's yes/no logits): the log-probabilities of these ids (at most 16, each in
  // the vocabulary) at the prompt's last position, in the final event's score_logprobs. Only what is asked
  // leaves the device. Use with max_new_tokens = 0.
  std::vector<int32_t> score_ids;

  // Structured output (runtime/grammar_masks.h): every token is drawn from the ids this grammar allows
  // (compiled against this model's vocabulary; EOS only where the grammar is complete), from the first
  // token or from the one after `grammar_after_token` (Qwen3's </think>). The request ends with "stop"
  // when the grammar has ended (its EOS accepted). Speculative drafts are cut where the grammar refuses them
  // and each verified position is drawn under its own mask (engine_spec.cpp).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  int32_t grammar_after_token = -1;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// One prompt position's log-probability (Request::prompt_logprobs_from).
struct PromptTokenLogprob {
  int32_t position = 0;           // p >= 1
  int32_t id = 0;                 // prompt[p]
  float logprob = 0.0f;           // log-softmax (f32) of the logits after prompt[0, p), at id
  int32_t rank = 0;               // 1 + the number of ids with a larger logit
  std::vector<TokenLogprob> top;  // the most likely ids there, descending, ties by lowest id
};

// One callback per engine step in which the request produced something (usually one token), plus the
// final one (finished == true; it may also carry the last tokens).
struct TokenEvent {
  RequestId id = 0;
  std::vector<int32_t> ids;                             // new tokens since the previous event
  std::vector<float> logprobs;                          // per id, when return_logprob
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // per id, top_logprobs entries, when asked
  bool finished = false;
  std::string finish_reason;  // on finish: "stop" | "length" | "abort" | "error"
  int32_t matched_stop = -1;  // the stop/eos token id that ended it ("stop"), else -1
  std::string error;          // on "error": what went wrong
  int prompt_tokens = 0;
  int completion_tokens = 0;     // total so far
  int cached_tokens = 0;         // prompt tokens served from the prefix cache (at the last (re)admission)
  std::vector<float> embedding;  // embedding requests: the pooled hidden state [hidden], L2-normalised
                                 // when the model says so (ModelConfig::pooling, normalize_embeddings)
  std::vector<float> hidden;     // return_hidden: last position's final hidden state (unnormalised)
  spec::SpecRequestStats spec;   // speculative decoding's counts for this request so far
  // Request::prompt_logprobs_from: every asked position in order, once, on the first event after the
  // prompt is computed (the first token's, or the final one).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  std::vector<float> score_logprobs;  // Request::score_ids: per id, on the final event
};

// Prometheus-style histogram: counts[i] = observations <= bounds[i] (cumulative), plus +Inf via count.
struct Histogram {
  std::vector<double> bounds;    // seconds, ascending
  std::vector<uint64_t> counts;  // cumulative, same size as bounds
  uint64_t count = 0;
  double sum = 0.0;
  void observe(double v);
  static Histogram with_bounds(std::vector<double> b);
};

struct EngineStats {
  int running = 0;  // requests holding KV pages (decoding or mid-prefill)
  int waiting = 0;  // queued or preempted, not yet (re)admitted
  int64_t kv_pages_total = 0;
  int64_t kv_pages_used = 0;    // referenced by at least one live request
  int64_t kv_pages_cached = 0;  // held only by the prefix cache (evictable; reusable on demand)
  int64_t kv_pages_free = 0;    // on the free list; total == used + cached + free
  int page_size = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t cached_tokens_total = 0;
  int64_t requests_submitted = 0;
  int64_t requests_rejected = 0;  // refused by submit() (bad input or busy); never given an id
  int64_t finished_stop = 0;
  int64_t finished_length = 0;
  int64_t finished_abort = 0;
  int64_t finished_error = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t steps_cancelled = 0;  // steps stopped inside (StepCancelled: all they served was abandoned)
  Histogram ttft;               // submit -> first token (seconds)
  Histogram tpot;               // per output token after the first, per request mean
  Histogram e2e;                // submit -> finish
  spec::SpecStats spec;         // speculative decoding (EngineOptions::speculative): drafts and acceptance
  int64_t grammar_masks = 0;    // structured output: token masks computed (one per constrained draw)
  Histogram grammar_mask;       // seconds per mask, on a mask worker (runtime/grammar_masks.h)
  double grammar_mask_max = 0;  // the longest mask so far (seconds)
  // Overlap schedule on: decode steps run one at a time (sampling included) only because a row was
  // constrained.
  int64_t grammar_steps_not_overlapped = 0;
};

struct EngineOptions {
  std::string model_dir;
  std::string device = "auto";  // "cpu" | "cuda" | "cuda:N" | "auto" (cuda when available)
  bool is_embedding = false;  // SGLang's --is-embedding: a Qwen3ForCausalLM checkpoint served for embeddings
  std::string load_format = "auto";  // "auto" (safetensors) | "random" (config.json shapes, random weights)
  // vLLM's --quantization: "none" | "fp8" (block-FP8 linears at load; model/qwen3.h LoadOptions).
  std::string quantization = "none";
  std::string kv_layout = "nhd";        // "nhd" | "hnd"
  std::string kv_cache_dtype = "auto";  // "auto" (model dtype) | "bf16" | "fp8_e4m3"
  int page_size = 32;
  int64_t max_total_tokens = 0;     // KV pool size in tokens; 0 = from mem_fraction
  double mem_fraction = 0.85;       // of device memory (total) for weights + KV; cpu: of a 4 GiB default
  int chunked_prefill_size = 8192;  // max prefill tokens per step (<= 0: no chunking, whole prompts)
  // A time bound on a step's prefill: the next step computes at most as many prefill tokens as the last
  // measured prefill rate fits into this many milliseconds (never more than twice the tokens measured, at
  // least 16), so that aborts, arrivals and shutdown are seen between steps that last about this long.
  // 0: off (steps bounded by chunked_prefill_size alone); -1: auto, which Engine::create resolves to 500 ms
  // on the CPU backend and off on CUDA (whose chunks of chunked_prefill_size tokens take well under a
  // second); the constructor taking a runner reads -1 as off.
  int max_prefill_chunk_ms = -1;
  int max_running_requests = 256;
  int max_queued_requests = 4096;  // beyond this submit() throws EngineBusyError
  int64_t max_context_len = 0;     // prompt + output tokens; 0 = model's max_position_embeddings
  // Prompt positions one request may ask log-probabilities for (Request::prompt_logprobs_from); submit()
  // refuses more, naming this limit. Bounds what a request keeps (1 + top entries per position).
  int64_t max_prompt_logprob_tokens = 32768;
  bool enable_prefix_cache = true;
  bool enable_mixed_batches = true;  // decode rows ride along with prefill chunks
  // Admission keeps this fraction of the running requests' possible remaining growth free (it adapts:
  // 1 after a preemption, decaying to 0.1). 0 = admit greedily, preempt when the pool runs out.
  double admission_reserve = 0.7;
  // Decode-only steps padded to these batch sizes replay CUDA graphs captured at start (ascending; empty =
  // 1, 2, 4, 8, 12, 16, 24, ..., 128; sizes above max_running_requests are dropped); larger ones run eagerly.
  std::vector<int> cuda_graph_buckets;
  bool disable_cuda_graph = false;
  bool disable_pdl = false;  // no programmatic dependent launch inside the decode graphs
  // "auto": sample on the model's device when its runner can (CUDA: only the tokens come back; min_p
  // and hidden-state requests fall back to the host); "cpu": always copy logits and sample on the host.
  // The two draw from different random streams: seeded outputs are reproducible within one choice.
  std::string sampling_backend = "auto";
  // Overlap schedule: while a decode step runs on the device, the engine plans and launches the next one
  // for the same requests (its input tokens taken on the device from the running step's draws), then
  // emits the running step's tokens; a request that stops meanwhile wastes one row of the step launched
  // ahead. Only for decode-only graph steps with device sampling and no logit processing but grammar masks
  // (a step with constrained rows launches its forward ahead and queues its sampling once its masks are
  // known), while nothing waits for admission; everything else runs one step at a time as without it. On by
  // default (as in SGLang): measured faster on the H200 at C = 1 and 32 (2026-12-03, `6d43051`; docs/PERF.md
  // "Serving").
  bool overlap_schedule = true;
  uint64_t seed = 0;  // base for requests without a seed
  // Structured output: worker threads computing grammar masks during the forward pass, and how long a step
  // waits for a request's mask before it ends that request with an error naming this limit.
  int grammar_mask_threads = 2;
  int grammar_mask_timeout_ms = 1000;
  // Tests: runs on a mask worker before each mask it computes (an injected slow worker); null in serving.
  std::function<void()> grammar_mask_hook;
  // Speculative decoding (src/spec/README.md): decode steps whose rows have drafts run as verify steps.
  spec::SpecOptions speculative;
  // The off switch's step costs (spec/off_switch.h): null, the engine measures decode steps by the clock;
  // tests give fixed seconds per step (verify: a verify step; seqs: its sequences) so none depends on timing.
  std::function<double(bool verify, int32_t seqs)> spec_step_cost;
  // Tensor parallelism (runtime/tp_runner.h): tp ranks over all nodes, tp / nnodes GPUs (or CPU ranks) on
  // this node; SGLang's --tp, --nnodes, --node-rank and --dist-init-addr host:port (node 0's rendezvous).
  int tp = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string dist_init_addr;
  // MoE models under tensor parallelism: whole experts per rank (vLLM's --enable-expert-parallel) instead of
  // each expert's intermediate split (dist/shard_plan.h).
  bool expert_parallel = false;
};

class ModelRunner;  // runtime/model_runner.h: forward + KV storage behind one interface (real or fake)

class Engine {
 public:
  // Loads the model named by opts.model_dir on opts.device and starts the engine thread.
  static std::unique_ptr<Engine> create(const EngineOptions& opts);
  // For tests and custom backends: runs `runner` (ownership taken); starts the engine thread.
  Engine(std::unique_ptr<ModelRunner> runner, const EngineOptions& opts);
  ~Engine();  // shutdown(false) if still running
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  RequestId submit(Request req, std::function<void(const TokenEvent&)> on_event);
  void abort(RequestId id);  // unknown or finished ids are ignored; ends as "abort", frees its pages
  void flush_cache();        // drops every unreferenced prefix-cache page (blocks until done)
  EngineStats stats() const;
  // drain = true: stop accepting, finish everything queued/running, then stop.
  // drain = false: stop accepting, abort everything, then stop. Idempotent; joins the engine thread.
  void shutdown(bool drain);

  // Non-empty once the model runner failed for good (a tensor-parallel rank died): the engine has ended
  // every request with this error and stopped; submit() refuses with it. `kiln serve` then exits.
  std::string fatal_error() const;

  const ModelConfig& model_config() const;
  int64_t max_context_len() const;
  bool is_embedding_model() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
