// Speculative decoding in the engine (src/spec/README.md has the contract). A decode-only step whose rows
// carry n-gram drafts runs as one verify step instead: each sequence computes its last token and its k drafts
// (k + 1 rows, logits at every one), the request's own sampler judges the drafts (spec/verify.h), the kept
// tokens are committed to the scheduler and the rejected positions' pages given back (spec/kv_extent.h).
// The model sees an ordinary step of multi-row sequences over their cached prefix.
#include <algorithm>
#include <optional>

#include "ops/cpu/parallel.h"
#include "runtime/engine_impl.h"
#include "runtime/token_draw.h"
#include "spec/kv_extent.h"
#include "spec/verify.h"

namespace kiln {
namespace {

// Requests a verify step serves (the rest make the whole step a plain one): generation without hidden states.
bool verifiable(const Live& L) {
  return !L.req.embedding && !L.req.return_hidden;
}

// One sequence's page-table row: its first `used` pages, then the null page up to the stride.
void append_page_row(BatchDesc& b, const Sequence& s, int32_t used) {
  for (int32_t p = 0; p < b.pages_stride; ++p)
    b.page_table.push_back(p < used ? s.pages[size_t(p)] : KvPool::kNullPage);
}

// The verify step's batch: the plan's rows as planned, each decode row with drafts extended by them
// (positions begin .. begin + k) and given logits at every row; other rows keep the plan's logit row (their
// last, when they sample). logit_base[i]: the first logit row of plan row i.
BatchDesc verify_batch(const StepPlan& plan, const std::vector<std::vector<int32_t>>& drafts,
                       const KvPool& pool, std::vector<int32_t>* logit_base) {
  BatchDesc b;
  const int32_t ps = pool.page_size();
  b.page_size = ps;
  b.cu_q.assign(1, 0);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    b.pages_stride = std::max(b.pages_stride, pool.pages_for(r.begin + r.q_len + int32_t(drafts[i].size())));
  }
  logit_base->assign(plan.rows.size(), -1);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    const Sequence& s = *r.seq;
    const int32_t q = r.q_len + int32_t(drafts[i].size());
    if (r.samples) (*logit_base)[i] = int32_t(b.logit_rows.size());
    for (int32_t j = 0; j < q; ++j) {
      const int32_t pos = r.begin + j;
      b.tokens.push_back(j < r.q_len ? s.tokens[size_t(pos)] : drafts[i][size_t(j - r.q_len)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(int64_t(s.pages[size_t(pos / ps)]) * ps + pos % ps);
      if (r.samples && (j + 1 == q || !drafts[i].empty())) b.logit_rows.push_back(b.cu_q.back() + j);
    }
    b.cu_q.push_back(b.cu_q.back() + q);
    b.kv_lens.push_back(r.begin + q);
    b.seq_ids.push_back(s.id);
    append_page_row(b, s, pool.pages_for(r.begin + q));
  }
  return b;
}

// The verify step as a verify graph runs it (ModelRunner::verify_graph_bucket): every row computes q = k + 1
// positions, a row with fewer drafts filled to q with rows of token 0 and slot -1 (no KV written; their
// logits are never read, and the causal mask keeps them out of the real rows' attention), logits at every
// row, then padding sequences up to `bucket`. Only for decode-only plans whose rows all sample.
BatchDesc uniform_verify_batch(const StepPlan& plan, const std::vector<std::vector<int32_t>>& drafts,
                               const KvPool& pool, int32_t q, int32_t bucket,
                               std::vector<int32_t>* logit_base) {
  BatchDesc b;
  const int32_t ps = pool.page_size();
  b.page_size = ps;
  b.cu_q.assign(1, 0);
  for (const StepRow& r : plan.rows) b.pages_stride = std::max(b.pages_stride, pool.pages_for(r.begin + q));
  logit_base->assign(plan.rows.size(), -1);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    const Sequence& s = *r.seq;
    const int32_t real = 1 + int32_t(drafts[i].size());
    (*logit_base)[i] = b.cu_q.back();
    for (int32_t j = 0; j < q; ++j) {
      const int32_t pos = r.begin + j;
      b.tokens.push_back(j == 0 ? s.tokens[size_t(pos)] : j < real ? drafts[i][size_t(j - 1)] : 0);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(j < real ? int64_t(s.pages[size_t(pos / ps)]) * ps + pos % ps : -1);
      b.logit_rows.push_back(b.cu_q.back() + j);
    }
    b.cu_q.push_back(b.cu_q.back() + q);
    b.kv_lens.push_back(r.begin + q);
    b.seq_ids.push_back(s.id);
    append_page_row(b, s, pool.pages_for(r.begin + real));
  }
  pad_batch(b, bucket, q);
  return b;
}

// The verify graph's batch size for this plan, or 0 (then verify_batch): every row a sampling decode row
// whose q positions stay within its sequence's limit.
int32_t uniform_verify_bucket(const StepPlan& plan, const ModelRunner& runner, const KvPool& pool,
                              int32_t q) {
  int32_t stride = 0;
  for (const StepRow& r : plan.rows) {
    if (r.q_len != 1 || !r.samples || int64_t(r.begin) + q > int64_t(r.seq->max_len)) return 0;
    stride = std::max(stride, pool.pages_for(r.begin + q));
  }
  return runner.verify_graph_bucket(int32_t(plan.rows.size()), q, stride, false);
}

}  // namespace

bool Engine::Impl::verify_on_device(const StepPlan& plan, const std::vector<uint8_t>& wants) const {
  if (!device_sampling) return false;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (!wants[i]) continue;
    const Live& L = live.at(plan.rows[i].seq->id);
    const SamplingParams& sp = L.sampler->params();
    if (sp.min_p > 0.0f || sp.return_logprob || sp.top_logprobs > 0 || L.sampler->processor().active() ||
        L.grammar)
      return false;
  }
  return true;
}

ModelRunner::RowSampling Engine::Impl::verify_draw(const StepRow& row, uint64_t ahead) const {
  const RequestId id = row.seq->id;
  const Live& L = live.at(id);
  ModelRunner::RowSampling r = draw_params(id, L, uint64_t(L.completion) + ahead);
  r.proc = nullptr;  // inactive (verify_on_device): no processing
  return r;
}

std::vector<ModelRunner::RowSampling> Engine::Impl::verify_row_sampling(
    const StepPlan& plan, const std::vector<uint8_t>& wants, const std::vector<std::vector<int32_t>>& drafts,
    const std::vector<int32_t>& logit_base, size_t logit_rows) const {
  std::vector<ModelRunner::RowSampling> rs(logit_rows);  // fill and padding rows: greedy, never read
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (!wants[i]) continue;
    for (size_t j = 0; j <= drafts[i].size(); ++j)
      rs[size_t(logit_base[i]) + j] = verify_draw(plan.rows[i], j);
  }
  return rs;
}

int64_t Engine::Impl::token_room(const Live& L, const Sequence& s) {
  return std::min<int64_t>(int64_t(L.req.sampling.max_new_tokens) - L.completion,
                           int64_t(s.max_len) - int64_t(s.tokens.size()));
}

bool Engine::Impl::decode_only(const StepPlan& plan) {
  if (plan.rows.empty()) return false;
  for (const StepRow& r : plan.rows)
    if (r.q_len != 1 || !r.samples) return false;
  return true;
}

void Engine::Impl::observe_decode_step(bool verify, int32_t seqs, Clock::time_point t0, double tokens_per_seq,
                                       double forward_seconds) {
  const double wall = seconds(t0, Clock::now());
  // A verify step is weighed against a plain step as it runs where the switch is off: under the overlap
  // schedule, its larger part (SpecOffSwitch::overlapped_step_cost), not the sum measured here, which favours
  // speculation by the host's part. EAGLE-3 never overlaps: there the sum is the cost.
  const double plain_cost = forward_seconds >= 0.0 && overlap && !eagle
                                ? spec::SpecOffSwitch::overlapped_step_cost(wall, forward_seconds)
                                : wall;
  if (verify) {
    counters.spec.verify_step_seconds += wall;
    ++counters.spec.timed_verify_steps;
  } else {
    counters.spec.plain_step_seconds += wall;
    ++counters.spec.timed_plain_steps;
  }
  if (!opts.speculative.off_switch) return;
  const double cost = opts.spec_step_cost ? opts.spec_step_cost(verify, seqs) : verify ? wall : plain_cost;
  const int64_t before = off_switch.times_switched_off();
  if (verify) {
    off_switch.observe_verify(seqs, cost, tokens_per_seq);
  } else {
    off_switch.observe_plain(seqs, cost, opts.spec_step_cost ? -1.0 : wall);
  }
  counters.spec.switched_off += off_switch.times_switched_off() - before;
}

void Engine::Impl::shadow_drafts(const StepPlan& plan) {
  if (!shadow || plan.rows.empty()) return;
  const spec::SpecOptions& so = opts.speculative;
  const size_t n = plan.rows.size();
  const int32_t B = int32_t(n);
  const bool off = off_switch.is_off(B);
  const Clock::time_point t0 = Clock::now();
  int32_t proposed = 0;
  for (size_t j = 0; j < n; ++j) {
    const StepRow& r = plan.rows[(shadow_row + j) % n];
    if (!r.samples) continue;
    const Sequence& s = *r.seq;
    const auto it = live.find(s.id);
    if (it == live.end()) continue;  // ended in this step
    Live& L = it->second;
    ShadowDraft& d = L.shadow;
    if (d.at >= 0) {
      // A verify step's walk: drafts kept while each equals the decoded token; the first mismatch ends it.
      size_t kept = 0;
      while (kept < d.tokens.size() && size_t(d.at) + kept < s.tokens.size() &&
             s.tokens[size_t(d.at) + kept] == d.tokens[kept])
        ++kept;
      const bool judged = kept == d.tokens.size() || size_t(d.at) + kept < s.tokens.size();
      if (!judged) continue;
      off_switch.observe_shadow(d.seqs, int32_t(kept), true);
      ++counters.spec.shadow_drafts;
      counters.spec.shadow_accepted_tokens += int64_t(kept);
      d.at = -1;
      d.tokens.clear();
      continue;  // its next one at a later step, as a verify step's next draft follows its tokens
    }
    if (!off || proposed >= kShadowRowsPerStep || !verifiable(L)) continue;
    // The draft the next step would verify (spec_step's rule): a decode row past the prompt, k within room.
    const int64_t room = token_room(L, s);
    if (room <= 1 || int64_t(s.tokens.size()) - 1 < int64_t(s.prompt_len)) continue;
    spec::NgramIndex& idx = ngram_index(s);
    idx.append(std::span<const int32_t>(s.tokens).subspan(idx.size()));
    std::vector<int32_t> t = idx.propose(int32_t(std::min<int64_t>(room - 1, so.num_draft_tokens)));
    ++proposed;
    if (t.empty()) {
      off_switch.observe_shadow(B, 0, false);
      continue;
    }
    d.at = int64_t(s.tokens.size());
    d.seqs = B;
    d.tokens = std::move(t);
  }
  shadow_row = (shadow_row + size_t(proposed)) % n;
  counters.spec.draft_seconds += seconds(t0, Clock::now());
}

spec::NgramIndex& Engine::Impl::ngram_index(const Sequence& s) {
  const spec::SpecOptions& so = opts.speculative;
  spec::NgramIndex& idx = ngram.try_emplace(s.id, so.ngram_min, so.ngram_max).first->second;
  if (idx.size() > s.tokens.size()) idx = spec::NgramIndex(so.ngram_min, so.ngram_max);
  return idx;
}

void Engine::Impl::index_during_forward(const StepPlan& plan) {
  const spec::SpecOptions& so = opts.speculative;
  if (so.algorithm != spec::SpecAlgorithm::ngram || !so.index_during_forward) return;
  const Clock::time_point t0 = Clock::now();
  int64_t tokens = 0;
  for (const StepRow& r : plan.rows) {
    const Sequence& s = *r.seq;
    const auto L = live.find(s.id);
    if (L == live.end() || !verifiable(L->second)) continue;
    // The tokens up to the end of this step's positions (known before they are computed). A prompt's chunks
    // that draw no token run without this hook (ModelRunner::forward), so its last chunk brings the rest.
    const size_t end = std::min(s.tokens.size(), size_t(r.begin) + size_t(r.q_len));
    spec::NgramIndex& idx = ngram_index(s);
    if (idx.size() >= end) continue;
    tokens += int64_t(end - idx.size());
    idx.append(std::span<const int32_t>(s.tokens).subspan(idx.size(), end - idx.size()));
  }
  counters.spec.indexed_during_forward += tokens;
  counters.spec.index_during_forward_seconds += seconds(t0, Clock::now());
}

bool Engine::Impl::spec_step(StepPlan& plan, Clock::time_point t0) {
  const spec::SpecOptions& so = opts.speculative;
  if (!so.enabled() || plan.empty() || pool_all_rows || !runner->config().mrope_section.empty()) return false;
  for (auto it = ngram.begin(); it != ngram.end();)
    it = live.count(it->first) ? std::next(it) : ngram.erase(it);
  const size_t B = plan.rows.size();
  for (const StepRow& r : plan.rows)
    if (!verifiable(live.at(r.seq->id))) return false;
  // The off switch, before any draft is made: a decode-only step verifies only where verification measured
  // faster at its batch size (or a probe is due); a step with prefill rows never probes, and where the switch
  // is off it drafts nothing either. Declined steps make no drafts (the n-gram indexes catch up at the next
  // draft, EAGLE-3 runs no chain): at C = 32 the drafting alone was a fifth of a run's time (H100,
  // 2026-12-07, docs/PERF.md SP4).
  const bool timed = decode_only(plan);  // its time goes to SpecStats, and to the off switch where it is on
  if (so.off_switch && (timed ? !off_switch.should_verify(int32_t(B)) : off_switch.is_off(int32_t(B))))
    return false;
  std::vector<std::vector<int32_t>> drafts(B);
  std::vector<uint8_t> wants(B, 0);
  std::vector<int32_t> asked(B, 0);  // drafts each row would verify, before the pages are reserved
  bool any = false;
  for (size_t i = 0; i < B; ++i) {
    const StepRow& r = plan.rows[i];
    const Sequence& s = *r.seq;
    const Live& L = live.at(s.id);
    if (!r.samples) continue;
    const int64_t room = token_room(L, s);
    wants[i] = room > 0;
    // Drafts ride on decode rows only: not on a prompt's last token computed alone, which happens or not with
    // how the prompt was chunked (the batch), so a seeded request's draws would depend on its batch.
    if (room <= 1 || r.q_len != 1 || r.begin < s.prompt_len) continue;
    const int32_t k = int32_t(std::min<int64_t>(room - 1, so.num_draft_tokens));
    if (eagle) {  // a chain from the draft pass over its last position (engine_eagle3.cpp), run below
      asked[i] = L.eagle.pos == r.begin - 1 ? k : 0;
      any = any || asked[i] > 0;
      continue;
    }
    const Clock::time_point d0 = Clock::now();
    spec::NgramIndex& idx = ngram_index(s);
    idx.append(std::span<const int32_t>(s.tokens).subspan(idx.size()));
    drafts[i] = idx.propose(k);
    counters.spec.draft_seconds += seconds(d0, Clock::now());
    asked[i] = int32_t(drafts[i].size());
    any = any || !drafts[i].empty();
  }
  if (eagle && so.tree()) return any && eagle_tree_step(plan, t0, timed, wants, asked);
  std::vector<uint8_t> reserved(B, 0);
  // Pages for row i's positions up to begin + asked[i] from the free list only; it drafts what they cover.
  const auto reserve = [&](size_t i) {
    const StepRow& r = plan.rows[i];
    reserved[i] = 1;
    const int32_t covered = spec::reserve_draft_pages(*pool, r.seq->pages, r.begin + 1 + asked[i]);
    asked[i] = std::min(asked[i], std::max(0, covered - r.begin - 1));
  };
  // The reserved pages go back (KV bytes untouched) when no verify step follows.
  const auto give_back_pages = [&] {
    for (size_t i = 0; i < B; ++i)
      if (reserved[i])
        spec::rollback_pages(*pool, plan.rows[i].seq->pages, int32_t(plan.rows[i].seq->tokens.size()));
  };
  // A failed forward: the step's requests end in error, their reserved pages given back.
  const auto fail_step = [&](const std::string& why) {
    give_back_pages();
    fail_plan(plan, why);
    return true;
  };
  // EAGLE-3: the chains now (engine_eagle3.cpp), so that from here on a row's drafts are in drafts[i] as an
  // n-gram row's are (the off switch decided above, so a declined step ran no chain). A chain pass that
  // fails leaves the step a plain one (as a failed pass after a step leaves its rows without chains): the
  // draft only proposes, so its failure costs speed, never a request.
  if (eagle && any) {
    for (size_t i = 0; i < B; ++i)
      if (asked[i] > 0) reserve(i);
    if (!eagle_draft([&] { drafts = eagle_chain(plan, asked); })) {
      give_back_pages();
      return false;
    }
    any = false;
    for (const auto& d : drafts) any = any || !d.empty();
  }
  if (!any) {
    give_back_pages();
    return false;
  }
  // Structured output: a constrained row's drafts are cut before the first token its grammar refuses, and
  // every position it verifies gets the grammar's mask after the drafts before it. A grammar not active yet
  // (waiting for its trigger token) takes no drafts: they could cross the trigger.
  std::vector<PositionMasks> masks(B);
  any = false;
  for (size_t i = 0; i < B; ++i) {
    const std::shared_ptr<GrammarState>& g = live.at(plan.rows[i].seq->id).grammar;
    if (g && wants[i] && g->active) {
      if (!draft_masks(*g, drafts[i], &masks[i])) {  // a plain step's mask worker says why
        give_back_pages();
        return false;
      }
    } else if (g) {
      drafts[i].clear();
    }
    any = any || !drafts[i].empty();
  }
  if (!any) {
    give_back_pages();
    return false;
  }
  // Pages for the n-gram rows' drafts (EAGLE-3 rows reserved theirs before the chain).
  for (size_t i = 0; i < B; ++i) {
    if (drafts[i].empty()) continue;
    asked[i] = std::min(asked[i], int32_t(drafts[i].size()));
    if (!reserved[i]) reserve(i);
    drafts[i].resize(size_t(asked[i]));
  }
  const int64_t V = runner->config().vocab_size;
  std::vector<int32_t> logit_base;
  const int32_t q = so.num_draft_tokens + 1;
  int32_t bucket = uniform_verify_bucket(plan, *runner, *pool, q);
  int64_t drafted = 0;
  for (const auto& d : drafts) drafted += int64_t(d.size());
  if (bucket > 0 && spec::ragged_verify_rows(so, int32_t(B), drafted, bucket, q)) {
    bucket = 0;  // few sequences drafted: the graph's rows would mostly be fill
    ++counters.spec.ragged_verify_steps;
  }
  BatchDesc batch = bucket > 0 ? uniform_verify_batch(plan, drafts, *pool, q, bucket, &logit_base)
                               : verify_batch(plan, drafts, *pool, &logit_base);
  runner->place_positions(batch);
  std::vector<float>& logits = logits_host;
  // Rows without logit processing or logprobs need only each position's token as the plain step would draw
  // it: drawn on the device (CUDA), so only tokens come back, not [rows, vocab] logits. Position j draws with
  // the plain step's stream at the request's token completion + j, and a draft is kept where it equals that
  // draw: a point draft x is then kept with probability p(x), and the tokens emitted are those plain decoding
  // draws (greedy: its greedy tokens), whichever steps verified.
  std::vector<ModelRunner::SampledRow> device_tokens;
  bool on_device = false;
  try {
    batch.validate(V, pool->num_pages());
    if (verify_on_device(plan, wants))
      on_device = runner->forward_sampled(
          batch, verify_row_sampling(plan, wants, drafts, logit_base, batch.logit_rows.size()), 0,
          &device_tokens,
          [&] { index_during_forward(plan); });  // the prompt chunks' tokens, while the forward runs
    if (!on_device) runner->forward(batch, &logits, nullptr);
  } catch (const RunnerFatalError&) {
    throw;  // no step can run any more: loop() ends every request
  } catch (const std::exception& e) {
    return fail_step(std::string("model forward failed: ") + e.what());
  }
  // Each row judges its drafts with its own request's generator: rows go in parallel without changing
  // results. A row without drafts draws its token as a plain step would (one uniform, the same distribution).
  std::vector<std::vector<int32_t>> emitted(B);
  std::vector<std::vector<Draw>> draws(B);
  ops::cpu::parallel_for(int64_t(B), B >= 8 ? 4 : int64_t(B) + 1, [&](int64_t i0, int64_t i1) {
    for (size_t i = size_t(i0); i < size_t(i1); ++i) {
      if (!wants[i]) continue;
      Live& L = live.at(plan.rows[i].seq->id);
      if (on_device) {
        const auto target = [&](size_t j) {
          return spec::TargetPosition{device_tokens[size_t(logit_base[i]) + j].token, nullptr};
        };
        emitted[i] = spec::verify_chain(drafts[i], target, L.sampler->generator());
        continue;
      }
      const float* rows = logits.data() + size_t(logit_base[i]) * size_t(V);
      emitted[i] = verify_row(L, rows, drafts[i], masks[i]);
      draws[i] = emitted_logprobs(L, rows, emitted[i], masks[i]);
    }
  });
  std::vector<int32_t> row_drafts(B);
  for (size_t i = 0; i < B; ++i) row_drafts[i] = int32_t(drafts[i].size());
  commit_verify(plan, emitted, row_drafts, draws, batch, nullptr, give_back_pages, timed, t0);
  return true;
}

bool Engine::Impl::eagle_draft(const std::function<void()>& draft) {
  try {
    const Clock::time_point d0 = Clock::now();
    draft();
    const double s = seconds(d0, Clock::now());
    counters.spec.draft_seconds += s;
    counters.spec.draft_chain_seconds += s;
    return true;
  } catch (const RunnerFatalError&) {
    throw;
  } catch (const std::exception& e) {
    eagle_pass_failed(e.what());
    return false;
  }
}

void Engine::Impl::fail_plan(const StepPlan& plan, const std::string& why) {
  std::vector<RequestId> ids;
  for (const StepRow& r : plan.rows) ids.push_back(r.seq->id);
  for (RequestId id : ids) finish(id, "error", why);
}

}  // namespace kiln
