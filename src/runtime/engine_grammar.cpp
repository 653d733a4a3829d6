// Structured output in the engine's step (runtime/grammar_masks.h; README.md "Structured output"): the masks
// of a step's constrained rows started on the mask workers, waited for under the time limit and handed to the
// rows' logit processors; a verify step's per-position masks (speculative decoding).
#include <algorithm>

#include "runtime/engine_impl.h"

namespace kiln {

std::vector<size_t> Engine::Impl::start_masks(const StepPlan& plan,
                                              const std::function<bool(size_t)>& wants_token) {
  std::vector<size_t> rows;
  std::vector<std::shared_ptr<GrammarState>> states;
  for (size_t k = 0; k < plan.sample_rows.size(); ++k) {
    auto it = live.find(plan.rows[size_t(plan.sample_rows[k])].seq->id);
    if (it == live.end()) continue;  // ended while a step launched ahead holds its row
    const Live& L = it->second;
    if (!L.grammar || !L.grammar->active || !wants_token(k)) continue;
    rows.push_back(k);
    states.push_back(L.grammar);
  }
  if (!states.empty()) mask_pool->start(std::move(states));
  return rows;
}

void Engine::Impl::finish_masks(const StepPlan& plan, const std::vector<size_t>& rows,
                                Clock::time_point t_start) {
  const int limit_ms = opts.grammar_mask_timeout_ms;
  const std::vector<bool> done = mask_pool->wait(t_start + std::chrono::milliseconds(limit_ms));
  for (size_t i = 0; i < rows.size(); ++i) {
    const RequestId id = plan.rows[size_t(plan.sample_rows[rows[i]])].seq->id;
    Live& L = live.at(id);
    GrammarState& g = *L.grammar;
    if (i >= done.size() || !done[i]) {
      // The worker still holds the state: the request lets go of it and ends when the step completes.
      L.grammar.reset();
      grammar_failed[id] = "structured output: the grammar's token mask took longer than the limit of " +
                           std::to_string(limit_ms) +
                           " ms (grammar_mask_timeout_ms, --grammar-mask-timeout-ms)";
      continue;
    }
    ++counters.grammar_masks;
    counters.grammar_mask.observe(g.mask_seconds);
    counters.grammar_mask_max = std::max(counters.grammar_mask_max, g.mask_seconds);
    if (!g.error.empty()) {
      grammar_failed[id] = "structured output: " + g.error;
      continue;
    }
    L.sampler->processor().token_mask().assign(g.mask.begin(), g.mask.end());
  }
}

bool Engine::Impl::draft_masks(GrammarState& g, std::vector<int32_t>& draft,
                               std::vector<std::vector<uint32_t>>* masks) {
  const size_t W = g.matcher.mask_words();
  size_t kept = 0;
  masks->clear();
  try {
    for (;;) {
      const Clock::time_point t0 = Clock::now();
      masks->emplace_back(W, 0u);
      g.matcher.fill_next_token_bitmask(masks->back().data(), W);
      const double sec = seconds(t0, Clock::now());
      ++counters.grammar_masks;
      counters.grammar_mask.observe(sec);
      counters.grammar_mask_max = std::max(counters.grammar_mask_max, sec);
      if (kept == draft.size() || !g.matcher.accept_token(draft[kept])) break;
      if (g.matcher.is_terminated()) {  // EOS ends the drafts: no position after it to verify
        g.matcher.rollback(1);
        break;
      }
      ++kept;
    }
  } catch (const std::exception&) {
    g.matcher.rollback(kept);
    masks->clear();
    return false;
  }
  g.matcher.rollback(kept);
  draft.resize(kept);
  return true;
}

void Engine::Impl::clear_masks(const StepPlan& plan) {
  for (const StepRow& r : plan.rows)
    if (auto it = live.find(r.seq->id); it != live.end())
      it->second.sampler->processor().token_mask().clear();
}

}  // namespace kiln
