// The engine thread: take requests and aborts, plan a step, run the model, sample, emit events.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ops/cpu/parallel.h"
#include "runtime/engine_impl.h"

namespace kiln {

void Engine::Impl::loop() {
  uint64_t flushed = 0;
  for (;;) {
    std::deque<Incoming> in;
    std::vector<RequestId> ab;
    uint64_t flush = 0;
    bool stop = false, dr = true;
    const bool idle = sched->num_running() + sched->num_waiting() == 0;
    if (idle) publish(true);  // exact page accounting whenever the engine rests
    {
      std::unique_lock<std::mutex> lk(mu);
      if (idle)
        cv.wait(lk, [&] {
          return !incoming.empty() || !aborts.empty() || flush_requested > flushed || stopping;
        });
      in.swap(incoming);
      // These wait in the scheduler until the next step plans; count them now, so submit()'s queue
      // limit never sees an emptied `incoming` next to a stale `waiting`.
      snapshot.waiting += int(in.size());
      ab.swap(aborts);
      flush = flush_requested;
      stop = stopping;
      dr = drain;
    }
    for (Incoming& x : in) accept(std::move(x));
    if (!fatal.empty()) {  // the runner died in the last step: end everything with its error, stop
      std::vector<RequestId> ids;
      for (const auto& [id, L] : live) ids.push_back(id);
      std::sort(ids.begin(), ids.end());
      for (RequestId id : ids) finish(id, "error", fatal);
      publish(true);
      break;
    }
    for (RequestId id : ab) finish(id, "abort");
    if (stop && !dr) {
      std::vector<RequestId> ids;
      for (const auto& [id, L] : live) ids.push_back(id);
      std::sort(ids.begin(), ids.end());
      for (RequestId id : ids) finish(id, "abort");
    }
    if (flush > flushed) {
      sched->flush_cache();
      flushed = flush;
      publish(true);
      std::lock_guard<std::mutex> lk(mu);
      flush_done = flush;
      flush_cv.notify_all();
    }
    if (sched->num_running() + sched->num_waiting() == 0) {
      publish(true);
      if (stop) break;
      continue;
    }
    try {
      step();
    } catch (const RunnerFatalError& e) {
      std::fprintf(stderr, "kiln engine: the model runner failed for good: %s\n", e.what());
      std::lock_guard<std::mutex> lk(mu);
      fatal = e.what();
      stopping = true;  // submit() refuses from now on; the next turn ends every request
      continue;
    } catch (const std::exception& e) {
      // An internal failure outside the model call: end every request rather than lose any.
      std::fprintf(stderr, "kiln engine: step failed: %s\n", e.what());
      std::vector<RequestId> ids;
      for (const auto& [id, L] : live) ids.push_back(id);
      for (RequestId id : ids) finish(id, "error", std::string("engine step failed: ") + e.what());
    }
    publish(counters.steps % 16 == 0);
  }
  std::lock_guard<std::mutex> lk(mu);
  thread_done = true;
  flush_cv.notify_all();
}

void Engine::Impl::accept(Incoming x) {
  Live L;
  L.req = std::move(x.req);
  L.on_event = std::move(x.on_event);
  L.t_submit = x.t_submit;
  L.prompt_tokens = int(L.req.prompt.size());
  L.seed =
      L.req.sampling.seed >= 0 ? uint64_t(L.req.sampling.seed) : opts.seed ^ (x.id * 0x9E3779B97F4A7C15ull);
  // min_new_tokens holds back what would end the request: its stop ids and, unless ignore_eos, EOS.
  std::vector<int32_t> masked = L.req.sampling.stop_token_ids;
  if (!L.req.sampling.ignore_eos)
    masked.insert(masked.end(), runner->config().eos_token_ids.begin(), runner->config().eos_token_ids.end());
  L.sampler = std::make_unique<Sampler>(L.req.sampling, L.seed, /*always_logprob=*/false, L.req.prompt,
                                        std::move(masked));
  if (L.req.grammar) {
    L.grammar = std::make_shared<GrammarState>(L.req.grammar, L.req.grammar_after_token);
    L.req.grammar.reset();  // the state holds it
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = x.id;
  seq->tokens = L.req.prompt;
  seq->prompt_len = int32_t(L.req.prompt.size());
  if (L.req.prompt_logprobs_from >= 0) {  // the asked rows are computed, a bounded chunk per step
    seq->cache_limit = std::max(1, L.req.prompt_logprobs_from) - 1;
    seq->max_chunk = kPromptLogprobChunk;
  }
  if (!L.req.images.empty()) {  // checked by submit(): the pads key the cache by the images' content
    VlPromptLayout layout = layout_vl_prompt(runner->config(), L.req.prompt, L.req.images);
    seq->cache_key = vl_cache_key(layout, L.req.prompt, L.req.images);
    runner->attach_images(x.id, std::move(layout), std::move(L.req.images));
    L.req.images.clear();
  }
  const int64_t want = L.req.embedding ? 0 : L.req.sampling.max_new_tokens;
  seq->max_len = int32_t(std::min<int64_t>(int64_t(seq->prompt_len) + want, context_limit));
  counters.prompt_tokens_total += L.prompt_tokens;
  const RequestId leader = L.req.after_prefill_of;
  Live& me = live.emplace(x.id, std::move(L)).first->second;
  if (auto it = live.find(leader); leader != 0 && sched->cache() && it != live.end() &&
                                   it->second.completion == 0 && !it->second.req.embedding) {
    me.held = std::move(seq);  // admitted once the leader's prompt pages are in the cache
    it->second.followers.push_back(x.id);
    ++num_held;
    return;
  }
  admit(x.id, std::move(seq));
}

void Engine::Impl::admit(RequestId id, std::unique_ptr<Sequence> seq) {
  try {
    sched->admit(std::move(seq));
  } catch (const std::exception& e) {
    finish(id, "error", e.what());
  }
}

void Engine::Impl::release_followers(Live& leader) {
  std::vector<RequestId> ids;
  ids.swap(leader.followers);
  for (RequestId f : ids) {
    auto it = live.find(f);
    if (it == live.end() || !it->second.held) continue;  // ended while held
    --num_held;
    admit(f, std::move(it->second.held));
  }
}

void Engine::Impl::observe_prefill(int64_t tokens, Clock::time_point t0) {
  // A step with only a small tail of prefill says little about the rate: keep the cap it ran under.
  if (prefill_ms <= 0 || tokens < kPrefillMin) return;
  const double ms = std::max(1e-3, seconds(t0, Clock::now()) * 1e3);
  const double fit = double(tokens) / ms * double(prefill_ms);
  prefill_cap = std::clamp<int64_t>(int64_t(fit), kPrefillMin, std::max<int64_t>(kPrefillMin, 2 * tokens));
}

void Engine::Impl::step() {
  if (inflight) return step_in_flight();
  const Clock::time_point t0 = Clock::now();
  StepPlan plan = sched->schedule(prefill_ms > 0 ? prefill_cap : 0);
  struct Observe {  // the step's prefill rate, however the step ends
    Impl& I;
    int64_t tokens;
    Clock::time_point t0;
    ~Observe() { I.observe_prefill(tokens, t0); }
  } observe{*this, plan.prefill_tokens, t0};
  {
    std::lock_guard<std::mutex> lk(mu);
    snapshot.waiting = sched->num_waiting() + num_held;  // exact for submit()'s queue limit during the step
  }
  counters.preemptions += int64_t(plan.preempted.size());
  KILN_CHECK(!plan.empty(), "internal: ", sched->num_waiting(), " waiting and ", sched->num_running(),
             " running requests but nothing could be scheduled");
  ++counters.steps;
  const ModelConfig& cfg = runner->config();
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  for (const StepRow& r : plan.rows) {
    Live& L = live.at(r.seq->id);
    if (L.cached_tokens < 0) {
      L.cached_tokens = r.seq->cached_tokens;
      counters.cached_tokens_total += L.cached_tokens;
    }
  }
  // Prompt logprobs and scores (prompt_logprobs.cpp): rows reduced by the runner, the step sampled on the
  // host.
  StepQueries queries = step_queries(plan);
  if (queries.queries.empty() && spec_step(plan, t0)) return;  // a verify step instead (engine_spec.cpp)
  const bool spec_plain = opts.speculative.enabled() && decode_only(plan);
  const int32_t spec_seqs = int32_t(plan.rows.size());
  // EAGLE-3 where the off switch has turned speculation off at this batch size: no draft pass after the step
  // until a probe is due (spec_step counted this step toward it), so the off state costs what a plain step
  // costs.
  const bool skip_pass = eagle && spec_plain && opts.speculative.off_switch && off_switch.is_off(spec_seqs) &&
                         !off_switch.probe_due(spec_seqs);
  bool need_logits = false, need_hidden = false, device_ok = device_sampling && queries.queries.empty();
  int top_n = 0;
  for (int32_t r : plan.sample_rows) {
    const Sequence& s = *plan.rows[size_t(r)].seq;
    const Live& L = live.at(s.id);
    // Only a row that draws a token needs its logits on the host (a scored prompt's do not).
    need_logits |= !L.req.embedding && L.completion < L.req.sampling.max_new_tokens &&
                   int32_t(s.tokens.size()) < s.max_len;
    need_hidden |= L.req.embedding || L.req.return_hidden;
    device_ok &= L.req.sampling.min_p <= 0.0f;
    top_n = std::max(top_n, L.req.sampling.top_logprobs);
  }
  device_ok &= need_logits && !need_hidden;
  BatchDesc& batch = plan.batch;
  const int32_t bucket = runner->graph_bucket(batch);
  if (bucket > batch.num_seqs()) pad_batch(batch, bucket);
  runner->place_positions(batch);  // Qwen3-VL: M-RoPE rows where a row is an image pad
  // Mean / CLS pooling: the hidden state of every real token row (below, hidden is [rows, H], not [K, H]).
  const int32_t real_rows = batch.cu_q[plan.rows.size()];
  if (pool_all_rows) {
    need_hidden = true;
    need_logits = false;
    device_ok = false;
    batch.logit_rows.resize(size_t(real_rows));
    for (int32_t t = 0; t < real_rows; ++t) batch.logit_rows[size_t(t)] = t;
  }
  const size_t K = plan.sample_rows.size();
  // Whether row k draws a token this step (not for embeddings, nor past max_new_tokens / max_len).
  auto wants_token = [&](size_t k) {
    const Sequence& s = *plan.rows[size_t(plan.sample_rows[k])].seq;
    const Live& L = live.at(s.id);
    return !L.req.embedding && L.completion < L.req.sampling.max_new_tokens &&
           int32_t(s.tokens.size()) < s.max_len;
  };
  std::vector<float>& logits = logits_host;  // kept across steps: no reallocation, no page faults
  std::vector<float>& hidden = hidden_host;
  std::vector<int32_t> sampled(K, -1);
  std::vector<Draw> draws(K);
  bool sampled_on_device = false;
  // Structured output: the masks are computed on the mask workers during the forward pass. A device draw
  // takes them once its forward is queued (forward_sampled's before_sample), the host draw after forward().
  const Clock::time_point t_masks = Clock::now();
  const std::vector<size_t> mask_rows = start_masks(plan, wants_token);
  bool masks_done = mask_rows.empty();
  const auto take_masks = [&] {
    if (masks_done) return;
    masks_done = true;
    finish_masks(plan, mask_rows, t_masks);
  };
  const Clock::time_point t_forward = Clock::now();
  double forward_seconds = -1.0;  // the forward's part of a step that ran here (the off switch's plain cost)
  try {
    batch.validate(V, pool->num_pages());
    if (device_ok) {
      const std::vector<ModelRunner::RowSampling> rs = row_sampling(plan, 0);
      bool constrained = false;
      if (overlap && launchable(plan, false, &constrained)) {
        // Collected by the next step, after its successor launched. Constrained rows: the forward first, the
        // masks while it runs, then the sampling.
        if (constrained && runner->launch_forward(batch, top_n, false)) {
          take_masks();
          runner->sample_launched(rs);
          clear_masks(plan);
          inflight = InFlight{std::move(plan), top_n};
          return;
        }
        if (!constrained && runner->launch_sampled(batch, rs, top_n, false)) {
          inflight = InFlight{std::move(plan), top_n};
          return;
        }
      }
      std::vector<ModelRunner::SampledRow> out;
      // While the forward runs: the masks, and the n-gram indexes of the tokens this step computes.
      sampled_on_device = runner->forward_sampled(batch, rs, top_n, &out, [&] {
        take_masks();
        index_during_forward(plan);
      });
      counters.grammar_steps_not_overlapped += sampled_on_device && constrained ? 1 : 0;
      if (sampled_on_device) {
        KILN_CHECK_EQ(out.size(), K, "device sampling returned the wrong number of rows");
        for (size_t k = 0; k < K; ++k) {
          if (!wants_token(k)) continue;
          KILN_CHECK(out[k].token >= 0 && out[k].token < V, "device sampling returned token ", out[k].token);
          sampled[k] = out[k].token;
          draws[k].token = out[k].token;
          draws[k].logprob = out[k].logprob;
          const int n = live.at(plan.rows[size_t(plan.sample_rows[k])].seq->id).req.sampling.top_logprobs;
          draws[k].top.assign(out[k].top.begin(),
                              out[k].top.begin() + std::min<ptrdiff_t>(n, ptrdiff_t(out[k].top.size())));
        }
      }
    }
    if (!sampled_on_device && queries.queries.empty())
      runner->forward(batch, need_logits ? &logits : nullptr, need_hidden ? &hidden : nullptr);
    if (!queries.queries.empty()) {
      std::vector<RowLogprobs> answers;
      runner->forward_logprobs(batch, need_logits ? &logits : nullptr, need_hidden ? &hidden : nullptr,
                               queries.queries, &answers);
      keep_answers(queries, answers);
    }
    take_masks();
    forward_seconds = seconds(t_forward, Clock::now());
  } catch (const RunnerFatalError&) {
    throw;  // no step can run any more: loop() ends every request
  } catch (const StepCancelled&) {
    // The masks are waited for as in a step that completes: a state a worker still fills is never handed to
    // the next step's workers (a late one ends its request, as always).
    take_masks();
    clear_masks(plan);
    // Every request the step's long work served was abandoned: nothing ran, nothing is finalized. The next
    // turn ends the abandoned requests (their pages freed, none offered to the cache) and plans the rest.
    runner->abandon_launched();
    ++counters.steps_cancelled;
    return;
  } catch (const std::exception& e) {
    // The rows of this step end in error; everyone else goes on.
    take_masks();
    clear_masks(plan);
    runner->abandon_launched();
    std::vector<RequestId> ids;
    for (const StepRow& r : plan.rows) ids.push_back(r.seq->id);
    for (RequestId id : ids) finish(id, "error", std::string("model forward failed: ") + e.what());
    return;
  }
  if (!sampled_on_device) {
    // Each row draws with its own request's generator, so rows can go in parallel without changing results.
    ops::cpu::parallel_for(int64_t(K), K >= 8 ? 4 : int64_t(K) + 1, [&](int64_t k0, int64_t k1) {
      for (size_t k = size_t(k0); k < size_t(k1); ++k) {
        if (!wants_token(k)) continue;
        Live& L = live.at(plan.rows[size_t(plan.sample_rows[k])].seq->id);
        if (!grammar_failed.empty() && grammar_failed.count(plan.rows[size_t(plan.sample_rows[k])].seq->id))
          continue;  // ends in error when the step completes
        draws[k] = L.sampler->sample(std::span<const float>(logits.data() + k * size_t(V), size_t(V)));
        sampled[k] = draws[k].token;
      }
    });
  }
  if (pool_all_rows) {
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      const StepRow& r = plan.rows[i];
      Live& L = live.at(r.seq->id);
      if (r.begin == 0) {  // the prompt's first chunk, or its recomputation after a preemption
        L.pool_sum.assign(size_t(H), 0.0);
        L.pooled = 0;
      }
      for (int32_t t = batch.cu_q[i]; t < batch.cu_q[i + 1]; ++t) {
        const int32_t pos = r.begin + (t - batch.cu_q[i]);
        if (pos >= r.seq->prompt_len || (cfg.pooling == EmbeddingPooling::cls && pos != 0)) continue;
        const float* h = hidden.data() + size_t(t) * size_t(H);
        for (int64_t j = 0; j < H; ++j) L.pool_sum[size_t(j)] += double(h[j]);
        ++L.pooled;
      }
    }
  }
  eagle_skip_pass = skip_pass;  // read (and cleared) by complete_step's eagle_extend
  complete_step(plan, sampled, draws, need_hidden);
  if (spec_plain) observe_decode_step(false, spec_seqs, t0, 1.0, forward_seconds);
}

ModelRunner::RowSampling Engine::Impl::draw_params(RequestId id, const Live& L, uint64_t token) {
  return {L.req.sampling.temperature,
          L.req.sampling.top_k,
          L.req.sampling.top_p,
          L.seed,
          token,
          &L.sampler->processor(),
          id};
}

std::vector<ModelRunner::RowSampling> Engine::Impl::row_sampling(const StepPlan& plan, uint64_t ahead) const {
  std::vector<ModelRunner::RowSampling> rs(plan.sample_rows.size());
  for (size_t k = 0; k < rs.size(); ++k) {
    const RequestId id = plan.rows[size_t(plan.sample_rows[k])].seq->id;
    auto it = live.find(id);
    if (it == live.end()) continue;
    rs[k] = draw_params(id, it->second, uint64_t(it->second.completion) + ahead);
  }
  return rs;
}

void Engine::Impl::complete_step(const StepPlan& plan, const std::vector<int32_t>& sampled,
                                 std::vector<Draw>& draws, bool need_hidden) {
  sched->finalize(plan, sampled);
  eagle_extend(plan, plan.batch);  // EAGLE-3: the draft's KV of the computed positions, the next chains
  const ModelConfig& cfg = runner->config();
  const int64_t H = cfg.hidden_size;
  const size_t K = plan.sample_rows.size();
  const std::vector<float>& hidden = hidden_host;

  const Clock::time_point now = Clock::now();
  for (size_t k = 0; k < K; ++k) {
    const Sequence& s = *plan.rows[size_t(plan.sample_rows[k])].seq;
    const RequestId id = s.id;
    auto live_it = live.find(id);
    if (live_it == live.end()) continue;  // ended while this step was in flight (overlap schedule)
    Live& L = live_it->second;
    TokenEvent ev;
    attach_prompt_answers(L, ev);
    if (auto f = grammar_failed.find(id); f != grammar_failed.end()) {
      const std::string why = std::move(f->second);
      grammar_failed.erase(f);
      L.sampler->processor().token_mask().clear();
      finish(id, "error", why, &ev);
      continue;
    }
    if (need_hidden && (L.req.embedding || L.req.return_hidden)) {
      std::vector<double> v(static_cast<size_t>(H));
      if (pool_all_rows) {  // mean of the prompt rows (CLS: the one first row)
        KILN_CHECK(L.pooled > 0 && L.pool_sum.size() == size_t(H), "internal: nothing pooled for request ",
                   id);
        for (int64_t i = 0; i < H; ++i) v[size_t(i)] = L.pool_sum[size_t(i)] / double(L.pooled);
      } else {  // last token: the sample row
        const float* h = hidden.data() + k * size_t(H);
        if (L.req.return_hidden) ev.hidden.assign(h, h + H);
        for (int64_t i = 0; i < H; ++i) v[size_t(i)] = double(h[i]);
      }
      if (L.req.embedding) {
        double ss = 0.0;
        for (double x : v) ss += x * x;
        const double inv = !cfg.normalize_embeddings ? 1.0 : ss > 0.0 ? 1.0 / std::sqrt(ss) : 0.0;
        ev.embedding.resize(size_t(H));
        for (int64_t i = 0; i < H; ++i) ev.embedding[size_t(i)] = float(v[size_t(i)] * inv);
      }
    }
    if (L.req.embedding) {
      finish(id, "stop", {}, &ev);
      continue;
    }
    if (sampled[k] < 0) {
      finish(id, "length", {}, &ev);
      continue;
    }
    const int32_t tok = sampled[k];
    L.sampler->observe(tok);
    if (L.grammar) {
      L.sampler->processor().token_mask().clear();
      if (std::string why = L.grammar->advance(tok); !why.empty()) {
        finish(id, "error", "structured output: " + why, &ev);
        continue;
      }
    }
    ++L.completion;
    ++counters.generation_tokens_total;
    if (L.completion == 1) {
      release_followers(L);  // its prompt is computed: its full pages are in the cache now
      L.t_first = now;
      counters.ttft.observe(seconds(L.t_submit, now));
    }
    L.t_last = now;
    ev.ids = {tok};
    if (L.req.sampling.return_logprob) ev.logprobs = {draws[k].logprob};
    if (L.req.sampling.top_logprobs > 0) ev.top_logprobs = {std::move(draws[k].top)};
    const auto& stops = L.req.sampling.stop_token_ids;
    const bool is_stop =
        (L.grammar && L.grammar->terminated()) || std::find(stops.begin(), stops.end(), tok) != stops.end() ||
        (!L.req.sampling.ignore_eos &&
         std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), tok) != cfg.eos_token_ids.end());
    if (is_stop) {
      ev.matched_stop = tok;
      finish(id, "stop", {}, &ev);
    } else if (L.completion >= L.req.sampling.max_new_tokens || int32_t(s.tokens.size()) >= s.max_len) {
      finish(id, "length", {}, &ev);
    } else {
      emit(id, L, ev);
    }
  }
  shadow_drafts(plan);
}

void Engine::Impl::emit(RequestId id, Live& L, TokenEvent& ev) {
  ev.id = id;
  ev.prompt_tokens = L.prompt_tokens;
  ev.completion_tokens = L.completion;
  ev.cached_tokens = std::max(0, L.cached_tokens);
  ev.spec = L.spec;
  if (!L.on_event) return;
  try {
    L.on_event(ev);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln engine: event callback for request %llu threw: %s\n", (unsigned long long)id,
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "kiln engine: event callback for request %llu threw\n", (unsigned long long)id);
  }
}

void Engine::Impl::finish(RequestId id, const std::string& reason, const std::string& error, TokenEvent* ev) {
  auto it = live.find(id);
  if (it == live.end()) return;  // already ended (an abort racing the last token, or an unknown id)
  Live& L = it->second;
  grammar_failed.erase(id);  // a late mask of a request that ends otherwise
  TokenEvent local;
  TokenEvent& e = ev ? *ev : local;
  e.finished = true;
  e.finish_reason = reason;
  e.error = error;
  const Clock::time_point now = Clock::now();
  if (reason == "stop" || reason == "length") {
    counters.e2e.observe(seconds(L.t_submit, now));
    if (L.completion > 1) counters.tpot.observe(seconds(L.t_first, L.t_last) / double(L.completion - 1));
    ++(reason == "stop" ? counters.finished_stop : counters.finished_length);
  } else {
    ++(reason == "abort" ? counters.finished_abort : counters.finished_error);
  }
  if (L.held) {
    --num_held;
  } else if (in_flight(id)) {
    deferred_release.push_back(id);  // the step in flight still writes its KV: released once it is collected
  } else {
    sched->release(id);
  }
  runner->release_request(id);
  release_followers(L);
  publish(false);  // whoever sees the final event also sees it counted
  emit(id, L, e);
  live.erase(it);
}

void Engine::Impl::publish(bool full) {
  int64_t cached = -1;
  if (full) {
    cached = 0;
    if (RadixCache* c = sched->cache())
      c->for_each_page([&](int32_t p) { cached += pool->refcount(p) == 1 ? 1 : 0; });
  }
  std::lock_guard<std::mutex> lk(mu);
  EngineStats s = counters;
  s.requests_submitted = snapshot.requests_submitted;
  s.requests_rejected = snapshot.requests_rejected;
  s.running = sched->num_running();
  s.waiting = sched->num_waiting() + num_held;
  s.page_size = pool->page_size();
  s.kv_pages_total = pool->num_usable();
  s.kv_pages_free = pool->num_free();
  s.kv_pages_cached =
      cached >= 0 ? cached : std::min(snapshot.kv_pages_cached, s.kv_pages_total - s.kv_pages_free);
  s.kv_pages_used = s.kv_pages_total - s.kv_pages_free - s.kv_pages_cached;
  snapshot = std::move(s);
}

}  // namespace kiln
