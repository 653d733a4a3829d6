// The overlap schedule: a decode step launched before the previous one's tokens are back (its rows' inputs
// staged on the device), the deferred sampling of the step in flight, and when a plan may launch ahead.
#include <algorithm>

#include "runtime/engine_impl.h"

namespace kiln {

bool Engine::Impl::launchable(const StepPlan& plan, bool ahead, bool* constrained) const {
  if (plan.rows.empty() || plan.prefill_tokens > 0 || !is_graphable_decode(plan.batch)) return false;
  if (!spec_allows_overlap(int32_t(plan.rows.size()))) return false;
  // A step launched ahead draws each row's token after the one the step in flight draws: both must be
  // wanted (the length limits), and nothing that the next step could admit may be waiting for it.
  const int64_t more = ahead ? 2 : 1;
  bool grammar = false;
  for (size_t k = 0; k < plan.sample_rows.size(); ++k) {
    const Sequence& s = *plan.rows[size_t(plan.sample_rows[k])].seq;
    auto it = live.find(s.id);
    if (it == live.end()) return false;
    const Live& L = it->second;
    if (L.req.embedding || L.req.return_hidden || L.req.sampling.min_p > 0.0f ||
        L.sampler->processor().active() || L.completion + more > L.req.sampling.max_new_tokens ||
        int64_t(s.tokens.size()) + more - 1 >= int64_t(s.max_len))
      return false;
    grammar |= L.grammar != nullptr;
  }
  *constrained = grammar;
  if (!ahead) return true;
  // With every running place taken, a waiting request cannot be admitted before one of these ends; one that
  // ends in the step in flight is seen when that step is collected, and its place goes to the oldest waiting
  // request a step later than it would one step at a time (as in SGLang's overlap schedule).
  if (num_held > 0) return false;
  if (sched->num_waiting() > 0 && sched->num_running() < opts.max_running_requests) return false;
  std::lock_guard<std::mutex> lk(mu);
  return incoming.empty() && aborts.empty() && !stopping && flush_requested <= flush_done;
}

bool Engine::Impl::in_flight(RequestId id) const {
  if (!inflight) return false;
  for (const StepRow& r : inflight->plan.rows)
    if (r.seq->id == id) return true;
  return false;
}

void Engine::Impl::release_deferred() {
  std::vector<RequestId> keep;
  for (RequestId id : deferred_release) {
    if (in_flight(id)) {
      keep.push_back(id);
    } else {
      sched->release(id);
    }
  }
  deferred_release.swap(keep);
}

std::optional<Engine::Impl::InFlight> Engine::Impl::launch_continuation(const InFlight& cur) {
  bool constrained = false;
  if (!launchable(cur.plan, true, &constrained)) return std::nullopt;
  // Speculation off here: a due probe of the off switch ends the chain, so the next step may verify.
  const int32_t seqs = int32_t(cur.plan.rows.size());
  if (opts.speculative.enabled() && off_switch.probe_due(seqs)) return std::nullopt;
  StepPlan next;
  if (!sched->plan_continuation(cur.plan, &next)) return std::nullopt;
  BatchDesc& batch = next.batch;
  const int32_t bucket = runner->graph_bucket(batch);
  if (bucket > batch.num_seqs()) pad_batch(batch, bucket);
  runner->place_positions(batch);
  batch.validate(runner->config().vocab_size, pool->num_pages());
  // Constrained rows: only the forward now; its masks need cur's tokens (sample_deferred, once cur is done).
  if (constrained ? !runner->launch_forward(batch, cur.top_n, true)
                  : !runner->launch_sampled(batch, row_sampling(cur.plan, 1), cur.top_n, true)) {
    counters.grammar_steps_not_overlapped += constrained ? 1 : 0;
    return std::nullopt;
  }
  if (opts.speculative.enabled()) off_switch.count_step(seqs);  // toward the next probe
  ++counters.steps;
  return InFlight{std::move(next), cur.top_n, !constrained, true};
}

void Engine::Impl::sample_deferred() {
  InFlight& f = *inflight;
  const StepPlan& plan = f.plan;
  const Clock::time_point t0 = Clock::now();
  auto wants_token = [&](size_t k) {
    const Sequence& s = *plan.rows[size_t(plan.sample_rows[k])].seq;
    auto it = live.find(s.id);
    return it != live.end() && it->second.completion < it->second.req.sampling.max_new_tokens &&
           int32_t(s.tokens.size()) < s.max_len;
  };
  try {
    const std::vector<size_t> rows = start_masks(plan, wants_token);
    finish_masks(plan, rows, t0);
    runner->sample_launched(row_sampling(plan, 0));  // each row's completion already counts cur's token
    clear_masks(plan);
    f.sampled = true;
  } catch (const RunnerFatalError&) {
    throw;
  } catch (const std::exception& e) {
    clear_masks(plan);
    runner->abandon_launched();
    std::vector<RequestId> ids;
    for (const StepRow& r : plan.rows) ids.push_back(r.seq->id);
    inflight.reset();
    for (RequestId id : ids) finish(id, "error", std::string("model forward failed: ") + e.what());
  }
}

void Engine::Impl::step_in_flight() {
  InFlight cur = std::move(*inflight);
  inflight.reset();
  const size_t K = cur.plan.sample_rows.size();
  const int64_t V = runner->config().vocab_size;
  std::vector<int32_t> sampled(K, -1);
  std::vector<Draw> draws(K);
  try {
    inflight = launch_continuation(cur);  // before cur's tokens are known: its rows' next step
    index_during_forward(cur.plan);       // while cur runs: a probe then finds the indexes current
    std::vector<ModelRunner::SampledRow> out;
    runner->collect_sampled(&out);
    // A chained step costs, launched ahead, the time from its predecessor's collection to its own: the
    // off switch's plain cost where speculation is off, as that state runs (the steps it times one at a
    // time are rare there).
    const Clock::time_point collected = Clock::now();
    if (cur.chained && opts.speculative.enabled() && opts.speculative.off_switch && decode_only(cur.plan)) {
      const int32_t seqs = int32_t(cur.plan.rows.size());
      const double cost =
          opts.spec_step_cost ? opts.spec_step_cost(false, seqs) : seconds(last_collect, collected);
      const int64_t before = off_switch.times_switched_off();
      off_switch.observe_plain(seqs, cost);
      counters.spec.switched_off += off_switch.times_switched_off() - before;
    }
    last_collect = collected;
    KILN_CHECK_EQ(out.size(), K, "the runner returned the wrong number of sampled rows");
    for (size_t k = 0; k < K; ++k) {
      auto it = live.find(cur.plan.rows[size_t(cur.plan.sample_rows[k])].seq->id);
      if (it == live.end()) continue;  // ended while in flight: its draw is dropped
      KILN_CHECK(out[k].token >= 0 && out[k].token < V, "device sampling returned token ", out[k].token);
      sampled[k] = draws[k].token = out[k].token;
      draws[k].logprob = out[k].logprob;
      const int n = it->second.req.sampling.top_logprobs;
      draws[k].top.assign(out[k].top.begin(),
                          out[k].top.begin() + std::min<ptrdiff_t>(n, ptrdiff_t(out[k].top.size())));
    }
  } catch (const RunnerFatalError&) {
    throw;
  } catch (const std::exception& e) {
    // The rows of both steps end in error (the same requests); everyone else goes on.
    runner->abandon_launched();
    inflight.reset();
    std::vector<RequestId> ids;
    for (const StepRow& r : cur.plan.rows) ids.push_back(r.seq->id);
    for (RequestId id : ids) finish(id, "error", std::string("model forward failed: ") + e.what());
    release_deferred();
    return;
  }
  complete_step(cur.plan, sampled, draws, false);
  if (inflight && !inflight->sampled) sample_deferred();
  release_deferred();
}

}  // namespace kiln
