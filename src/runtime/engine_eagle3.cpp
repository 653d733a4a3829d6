// EAGLE-3 drafting in the engine (src/spec/README.md, "EAGLE-3"). After every step, the draft pass over the
// positions the step computed: position p takes the target's features at p and the token at p + 1 (the next
// prompt token, a kept draft, or the token just drawn) and writes the draft's KV entry p, in the slot of the
// target's position p (the draft's one-layer cache shares the target's pages). The last such row of a
// sequence that decodes next gives its first draft token and the hidden state its chain continues from; the
// verify step that follows runs the chain's remaining passes (one row per sequence each) before the target
// verifies the chain like any other draft (engine_spec.cpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "kiln/env.h"
#include "runtime/draft_batch.h"
#include "runtime/engine_impl.h"

namespace kiln {
namespace {

// q >= 2 where `step` was a uniform verify step (every one of the plan's sequences q rows, in order) and the
// runner wants the pass after it uniform (ModelRunner::uniform_draft_extend); else 0.
int32_t uniform_extend_rows(const ModelRunner& runner, const StepPlan& plan, const BatchDesc& step) {
  if (!runner.uniform_draft_extend() || plan.rows.empty() || step.num_seqs() < int32_t(plan.rows.size()) ||
      step.has_tree())
    return 0;
  const int32_t q = step.q_len(0);
  for (size_t i = 0; i < plan.rows.size(); ++i)
    if (step.q_len(int32_t(i)) != q || step.positions[size_t(step.cu_q[i])] != plan.rows[i].begin) return 0;
  return q >= 2 ? q : 0;
}

}  // namespace

void Engine::Impl::eagle_extend(const StepPlan& plan, const BatchDesc& step_batch,
                                const std::vector<std::vector<int32_t>>* extend_rows) {
  if (!eagle) return;
  if (std::exchange(eagle_skip_pass, false)) {
    for (const StepRow& r : plan.rows)
      if (auto it = live.find(r.seq->id); it != live.end()) it->second.eagle.pos = -1;
    return;
  }
  BatchDesc b = empty_draft_batch(pool->page_size());
  std::vector<int32_t> step_rows;
  std::vector<const Sequence*> seqs;
  std::vector<RequestId> chained;  // the sequences given a logit row, in order
  std::vector<size_t> out_row;     // chained[k]'s logit row among the pass's
  // After a uniform verify step (q > 0) every sequence takes the step's q rows, those past its kept positions
  // filled, and a logit row, so the pass has the same shape at every step (a graph replays it:
  // Eagle3Model::prepare_draft_graphs).
  const int32_t q = uniform_extend_rows(*runner, plan, step_batch);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    const Sequence& s = *r.seq;
    auto it = live.find(s.id);
    if (it != live.end()) it->second.eagle.pos = -1;  // until this pass gives it a chain
    // Positions begin .. begin + q_len - 1 were computed; those whose next token is known get their entry.
    const int32_t n = std::max(0, std::min(r.q_len, int32_t(s.tokens.size()) - 1 - r.begin));
    if (n == 0 && q == 0) continue;
    const std::vector<int32_t> next(s.tokens.begin() + r.begin + 1, s.tokens.begin() + r.begin + 1 + n);
    // Decodes next: its last computed position is the one before its last token.
    const bool chain = n > 0 && it != live.end() && r.begin + n + 1 == int32_t(s.tokens.size());
    const int32_t rows = std::max(n, q);
    add_draft_seq(b, s, r.begin, next, chain || q > 0, rows);
    for (int32_t j = 0; j < rows; ++j)
      step_rows.push_back(extend_rows && j < n ? (*extend_rows)[i][size_t(j)] : step_batch.cu_q[i] + j);
    seqs.push_back(&s);
    if (chain) {
      out_row.push_back(b.logit_rows.size() - 1);
      chained.push_back(s.id);
    }
  }
  if (seqs.empty()) return;
  fill_page_table(b, seqs);
  ModelRunner::DraftOut out;
  try {
    ++counters.spec.draft_passes;
    if (q > 0) ++counters.spec.uniform_draft_passes;
    const Clock::time_point d0 = Clock::now();
    runner->draft_from_step(b, step_rows, &out);
    counters.spec.draft_seconds += seconds(d0, Clock::now());
  } catch (const RunnerFatalError&) {
    throw;
  } catch (const std::exception& e) {
    eagle_pass_failed(e.what());
    return;
  }
  const int64_t H = out.tokens.empty() ? 0 : int64_t(out.hidden.size() / out.tokens.size());
  for (size_t k = 0; k < chained.size(); ++k) {
    Live& L = live.at(chained[k]);
    const Sequence& s = *sched->find(chained[k]);
    const int64_t o = int64_t(out_row[k]);
    L.eagle.pos = int32_t(s.tokens.size()) - 2;
    L.eagle.next = out.tokens[size_t(o)];
    L.eagle.hidden.assign(out.hidden.begin() + o * H, out.hidden.begin() + (o + 1) * H);
    const int64_t K = out.topk_tokens.size() / std::max<size_t>(1, out.tokens.size());
    L.eagle.topk.assign(out.topk_tokens.begin() + o * K, out.topk_tokens.begin() + (o + 1) * K);
    L.eagle.topk_logp.assign(out.topk_logprobs.begin() + o * K, out.topk_logprobs.begin() + (o + 1) * K);
  }
}

void Engine::Impl::eagle_pass_failed(const char* why) {
  ++counters.spec.draft_failures;
  std::fprintf(stderr, "kiln engine: an EAGLE-3 draft pass failed (its requests draft nothing): %s\n", why);
}

std::vector<std::vector<int32_t>> Engine::Impl::eagle_chain(const StepPlan& plan,
                                                            const std::vector<int32_t>& count) {
  const size_t B = plan.rows.size();
  std::vector<std::vector<int32_t>> drafts(B);
  std::vector<std::vector<float>> hidden(B);
  int32_t longest = 0;
  for (size_t i = 0; i < B; ++i) {
    if (count[i] <= 0) continue;
    const Live& L = live.at(plan.rows[i].seq->id);
    drafts[i].push_back(L.eagle.next);
    hidden[i] = L.eagle.hidden;
    longest = std::max(longest, count[i]);
  }
  if (longest <= 1) return drafts;
  if (eagle_device_chain()) {
    eagle_chain_on_device(plan, count, longest, hidden, drafts);
    return drafts;
  }
  // Pass j drafts token j + 1 of every chain that long: the row at position begin + j - 1 takes draft j and
  // the hidden state of the pass before. Each pass's tokens and hidden states come back to the host.
  for (int32_t j = 1;; ++j) {
    BatchDesc b = empty_draft_batch(pool->page_size());
    std::vector<const Sequence*> seqs;
    std::vector<size_t> who;
    std::vector<float> in;
    for (size_t i = 0; i < B; ++i) {
      if (count[i] <= j) continue;
      const StepRow& r = plan.rows[i];
      add_draft_seq(b, *r.seq, r.begin + j - 1, {drafts[i].back()}, true, 1);
      seqs.push_back(r.seq);
      who.push_back(i);
      in.insert(in.end(), hidden[i].begin(), hidden[i].end());
    }
    if (who.empty()) break;
    fill_page_table(b, seqs);
    ModelRunner::DraftOut out;
    ++counters.spec.draft_passes;
    runner->draft_from_hidden(b, in, &out);
    const size_t H = out.hidden.size() / who.size();
    for (size_t k = 0; k < who.size(); ++k) {
      drafts[who[k]].push_back(out.tokens[k]);
      hidden[who[k]].assign(out.hidden.begin() + int64_t(k * H), out.hidden.begin() + int64_t((k + 1) * H));
    }
  }
  return drafts;
}

// The same passes with their tokens and hidden states kept on the device (ModelRunner::draft_chain): every
// pass holds a row for each sequence of the first pass, in its order; a chain that ended sits in the later
// passes as padding (its last row again: token 0, slot -1, so no K/V is written) whose tokens are dropped.
// One copy back for the whole chain instead of one synchronisation a pass.
void Engine::Impl::eagle_chain_on_device(const StepPlan& plan, const std::vector<int32_t>& count,
                                         int32_t longest, const std::vector<std::vector<float>>& hidden,
                                         std::vector<std::vector<int32_t>>& drafts) {
  std::vector<size_t> who;
  std::vector<const Sequence*> seqs;
  std::vector<float> in;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (count[i] <= 1) continue;
    who.push_back(i);
    seqs.push_back(plan.rows[i].seq);
    in.insert(in.end(), hidden[i].begin(), hidden[i].end());
  }
  std::vector<BatchDesc> passes;
  for (int32_t j = 1; j < longest; ++j) {
    BatchDesc b = empty_draft_batch(pool->page_size());
    for (size_t k = 0; k < who.size(); ++k) {
      const StepRow& r = plan.rows[who[k]];
      const int32_t last = std::min(j, count[who[k]] - 1);  // the chain's last pass
      add_draft_seq(b, *r.seq, r.begin + last - 1, {j == 1 ? drafts[who[k]].back() : 0}, true, 1);
      if (last < j) b.slot_mapping.back() = -1;
    }
    fill_page_table(b, seqs);
    passes.push_back(std::move(b));
  }
  std::vector<std::vector<int32_t>> tokens;
  counters.spec.draft_passes += passes.size();
  runner->draft_chain(passes, in, &tokens);
  for (size_t j = 0; j < passes.size(); ++j)
    for (size_t k = 0; k < who.size(); ++k)
      if (int32_t(j) + 1 < count[who[k]]) drafts[who[k]].push_back(tokens[j][k]);
}

bool Engine::Impl::eagle_device_chain() {
  // KILN_EAGLE3_DEVICE_CHAIN=0: each chain pass reads its tokens back. Read at every chain (a getenv), so
  // tests switch it.
  return env_switch("KILN_EAGLE3_DEVICE_CHAIN", true);
}

}  // namespace kiln
