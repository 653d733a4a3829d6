// Engine: the thread, the request table and the step loop. See README.md for the invariants.
#include "runtime/engine.h"

#include <pthread.h>

#include <algorithm>
#include <cmath>

#include "runtime/engine_impl.h"

namespace kiln {

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) ++counts[i];
  ++count;
  sum += v;
}

Histogram Histogram::with_bounds(std::vector<double> b) {
  Histogram h;
  h.bounds = std::move(b);
  h.counts.assign(h.bounds.size(), 0);
  return h;
}

void Engine::Impl::validate(const Request& r) const {
  const SamplingParams& s = r.sampling;
  const int64_t V = runner->config().vocab_size;
  KILN_CHECK(!r.prompt.empty(), "the prompt is empty");
  KILN_CHECK(r.embedding || runner->config().arch != ModelArch::qwen3_embedding,
             "this is an embedding model: it serves embeddings only, not generation");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    KILN_CHECK(r.prompt[i] >= 0 && r.prompt[i] < V, "prompt token ", i, " has id ", r.prompt[i],
               ", outside the vocabulary [0, ", V, ")");
  validate_sampling_params(s);
  KILN_CHECK(s.max_new_tokens >= 0, "max_new_tokens must be >= 0, got ", s.max_new_tokens);
  for (int32_t t : s.stop_token_ids)
    KILN_CHECK(t >= 0 && t < V, "stop token id ", t, " is outside the vocabulary [0, ", V, ")");
  for (const auto& [t, b] : s.logit_bias)
    KILN_CHECK(t >= 0 && t < V, "logit_bias token id ", t, " is outside the vocabulary [0, ", V, ")");
  // Qwen3-VL: images only for a model with a vision tower, each matching its pad tokens in the prompt (and
  // no pad tokens without an image): layout_vl_prompt's checks.
  const ModelConfig& mc = runner->config();
  KILN_CHECK(r.images.empty() || mc.has_vision, "this model (", mc.architecture,
             ") is text-only: it takes no images");
  if (mc.has_vision) (void)layout_vl_prompt(mc, r.prompt, r.images);
  KILN_CHECK(r.grammar_after_token < V, "grammar_after_token ", r.grammar_after_token,
             " is outside the vocabulary [0, ", V, ")");
  KILN_CHECK(!r.grammar || !r.embedding, "an embedding request takes no grammar");
  const int64_t n = int64_t(r.prompt.size());
  validate_prompt_queries(r, V, opts.max_prompt_logprob_tokens);
  KILN_CHECK(n <= context_limit, "the prompt has ", n, " tokens; the limit is ", context_limit,
             n > max_context ? " (the model's context length)" : " (the KV pool's capacity)");
  KILN_CHECK(r.embedding || s.max_new_tokens == 0 || n < context_limit, "the prompt has ", n,
             " tokens, which leaves no room to generate within the limit of ", context_limit);
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, const EngineOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  KILN_CHECK(runner != nullptr, "Engine needs a model runner");
  KILN_CHECK(opts.page_size >= 1 && opts.page_size <= 4096, "page size must be in [1, 4096], got ",
             opts.page_size);
  KILN_CHECK(opts.max_queued_requests >= 1, "max_queued_requests must be >= 1");
  I.opts = opts;
  KILN_CHECK(opts.sampling_backend == "auto" || opts.sampling_backend == "cpu", "bad sampling backend '",
             opts.sampling_backend, "': expected auto or cpu");
  I.device_sampling = opts.sampling_backend == "auto";
  spec::validate_spec_options(opts.speculative);
  I.eagle = opts.speculative.algorithm == spec::SpecAlgorithm::eagle3;
  spec::OffSwitchOptions switch_options;
  switch_options.start_off_from_seqs = opts.speculative.start_off_from_seqs;
  // Shadow drafts cost no target step only where drafting does not (n-gram); EAGLE-3 learns from probes.
  I.shadow = opts.speculative.algorithm == spec::SpecAlgorithm::ngram && opts.speculative.off_switch &&
             opts.speculative.shadow_drafts;
  switch_options.shadow = I.shadow;
  I.off_switch = spec::SpecOffSwitch(switch_options);
  KILN_CHECK(!I.eagle || (runner && runner->has_draft()),
             "--speculative-algorithm EAGLE3 needs the draft loaded beside the model "
             "(--speculative-draft-model-path; at --tp 1: tensor-parallel ranks run no draft)");
  // Steps launched ahead never verify: with speculative decoding on, decode steps launch ahead only at batch
  // sizes where the off switch turned speculation off (Impl::spec_allows_overlap).
  I.overlap = opts.overlap_schedule;
  I.runner = std::move(runner);
  // Tree drafting: the draft's passes also give each row's K best tokens (refused by a runner that cannot).
  if (opts.speculative.tree()) I.runner->set_draft_topk(opts.speculative.eagle_topk);
  // A request counts as abandoned once aborted (queued for the next turn) or at an abortive shutdown.
  I.runner->set_abandoned_check([&I](uint64_t id) {
    std::lock_guard<std::mutex> lk(I.mu);
    return (I.stopping && !I.drain) || std::find(I.aborts.begin(), I.aborts.end(), id) != I.aborts.end();
  });
  KILN_CHECK(
      opts.max_prefill_chunk_ms >= -1 && opts.max_prefill_chunk_ms <= 3'600'000,
      "max_prefill_chunk_ms must be -1 (auto), 0 (off) or a number of milliseconds up to an hour, got ",
      opts.max_prefill_chunk_ms);
  I.prefill_ms = std::max(0, opts.max_prefill_chunk_ms);  // auto (-1) is resolved by Engine::create
  int64_t tokens = opts.max_total_tokens;
  if (tokens <= 0) {
    KILN_CHECK(opts.mem_fraction > 0.0 && opts.mem_fraction <= 1.0, "mem_fraction must be in (0, 1], got ",
               opts.mem_fraction);
    tokens =
        I.runner->kv_memory_budget(opts.mem_fraction) / std::max<int64_t>(1, I.runner->kv_bytes_per_token());
  }
  const int64_t pages = tokens / opts.page_size + 1;  // + the null page
  KILN_CHECK(pages >= 2 && pages < (int64_t(1) << 31), "the KV pool would hold ", tokens,
             " tokens: too few (or too many) for pages of ", opts.page_size);
  I.runner->allocate_kv(int32_t(pages), opts.page_size);
  I.pool = std::make_unique<KvPool>(int32_t(pages), opts.page_size);
  SchedulerOptions so;
  so.chunked_prefill_size = opts.chunked_prefill_size;
  so.max_running_requests = opts.max_running_requests;
  so.enable_prefix_cache = opts.enable_prefix_cache;
  // Mean and CLS pooling read the hidden state of every prompt token: none may come from the prefix cache,
  // and the decode-bucket graphs (one output row per sequence) do not apply.
  const ModelConfig& mc = I.runner->config();
  I.pool_all_rows = mc.arch == ModelArch::qwen3_embedding && mc.pooling != EmbeddingPooling::last_token;
  if (I.pool_all_rows) so.enable_prefix_cache = false;
  so.enable_mixed_batches = opts.enable_mixed_batches;
  KILN_CHECK(opts.admission_reserve >= 0.0 && opts.admission_reserve <= 1.0,
             "admission_reserve must be in [0, 1], got ", opts.admission_reserve);
  so.reserve_init = opts.admission_reserve;
  so.reserve_min = std::min(so.reserve_min, opts.admission_reserve);
  I.sched = std::make_unique<Scheduler>(*I.pool, so);
  const int64_t model_max = I.runner->config().max_context();
  I.max_context = opts.max_context_len > 0 ? opts.max_context_len : (model_max > 0 ? model_max : INT32_MAX);
  I.context_limit = std::min(I.max_context, I.sched->capacity_tokens());
  if (!opts.disable_cuda_graph && !I.pool_all_rows) {
    ModelRunner::GraphPlan gp;
    const std::vector<int32_t> want =
        opts.cuda_graph_buckets.empty()
            ? default_graph_buckets()
            : std::vector<int32_t>(opts.cuda_graph_buckets.begin(), opts.cuda_graph_buckets.end());
    for (size_t i = 0; i < want.size(); ++i) {
      KILN_CHECK(want[i] >= 1 && want[i] <= 4096 && (i == 0 || want[i] > want[i - 1]),
                 "CUDA graph batch sizes must be ascending, in [1, 4096]");
      if (want[i] <= opts.max_running_requests) gp.buckets.push_back(want[i]);
    }
    gp.max_pages_per_seq = I.pool->pages_for(I.context_limit);
    gp.max_seqs = opts.max_running_requests;
    gp.max_step_tokens = int64_t(std::max(opts.chunked_prefill_size, 0)) + opts.max_running_requests;
    gp.pdl = !opts.disable_pdl;
    if (opts.speculative.enabled()) gp.verify_rows_per_seq = opts.speculative.num_draft_tokens + 1;
    gp.verify_trees = opts.speculative.tree();
    if (!gp.buckets.empty()) I.runner->prepare_graphs(gp);
  }
  const std::vector<double> lat{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                0.5,   1,      2.5,   5,    10,    25,   50,  100};
  I.counters.ttft = Histogram::with_bounds(lat);
  I.counters.e2e = Histogram::with_bounds(lat);
  I.counters.tpot =
      Histogram::with_bounds({0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5});
  I.counters.grammar_mask = Histogram::with_bounds(
      {2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1, 1});
  KILN_CHECK(opts.grammar_mask_timeout_ms >= 1 && opts.grammar_mask_timeout_ms <= 600'000,
             "grammar_mask_timeout_ms must be in [1, 600000], got ", opts.grammar_mask_timeout_ms);
  I.mask_pool = std::make_unique<GrammarMaskPool>(opts.grammar_mask_threads, opts.grammar_mask_hook);
  I.publish(true);
  I.thread = std::thread([this] {
    // Named so that per-thread CPU accounting (/proc/PID/task/*/comm, top -H) tells the engine from the
    // HTTP layer's threads (`bench/device.sh http`).
    pthread_setname_np(pthread_self(), "kiln-engine");
    impl_->loop();
  });
}

Engine::~Engine() {
  shutdown(false);
}

std::string Engine::fatal_error() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->fatal;
}

const ModelConfig& Engine::model_config() const {
  return impl_->runner->config();
}
int64_t Engine::max_context_len() const {
  return impl_->context_limit;
}
bool Engine::is_embedding_model() const {
  return impl_->runner->config().arch == ModelArch::qwen3_embedding;
}

RequestId Engine::submit(Request req, std::function<void(const TokenEvent&)> on_event) {
  Impl& I = *impl_;
  try {
    I.validate(req);
  } catch (...) {
    std::lock_guard<std::mutex> lk(I.mu);
    ++I.snapshot.requests_rejected;
    throw;
  }
  std::lock_guard<std::mutex> lk(I.mu);
  if (I.stopping) {
    ++I.snapshot.requests_rejected;
    throw EngineBusyError(I.fatal.empty() ? "the engine is shutting down" : "the engine stopped: " + I.fatal);
  }
  if (int64_t(I.incoming.size()) + I.snapshot.waiting >= I.opts.max_queued_requests) {
    ++I.snapshot.requests_rejected;
    throw EngineBusyError("the request queue is full (" + std::to_string(I.opts.max_queued_requests) +
                          " waiting)");
  }
  const RequestId id = I.next_id++;
  I.incoming.push_back({id, std::move(req), std::move(on_event), Clock::now()});
  ++I.snapshot.requests_submitted;
  I.cv.notify_one();
  return id;
}

void Engine::abort(RequestId id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->aborts.push_back(id);
  impl_->cv.notify_one();
}

void Engine::flush_cache() {
  Impl& I = *impl_;
  std::unique_lock<std::mutex> lk(I.mu);
  if (I.thread_done) return;
  const uint64_t ticket = ++I.flush_requested;
  I.cv.notify_one();
  I.flush_cv.wait(lk, [&] { return I.flush_done >= ticket || I.thread_done; });
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  EngineStats s = impl_->snapshot;
  s.waiting += int(impl_->incoming.size());
  return s;
}

void Engine::shutdown(bool drain) {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    if (!I.stopping) I.drain = drain;
    if (!drain) I.drain = false;
    I.stopping = true;
    I.cv.notify_one();
  }
  if (I.thread.joinable() && I.thread.get_id() != std::this_thread::get_id()) I.thread.join();
}

}  // namespace kiln
