// The end of every verify step, chains' (engine_spec.cpp) and token trees' (engine_tree.cpp): a row's drafts
// judged from host logits by its request's sampler (verify_row, the processed rows of its positions), the
// emitted tokens' log-probs, and the commit (the kept tokens to the sequence and the request, the rejected
// positions' pages given back, the draft's pass after the step, the off switch's costs).
#include <algorithm>
#include <optional>

#include "runtime/engine_impl.h"
#include "runtime/token_draw.h"
#include "spec/kv_extent.h"
#include "spec/verify.h"

namespace kiln {
namespace {

// The processed logits of a verify row's positions in order: position j's processing counts tokens 0 .. j-1
// of `drafted` as generated (penalties, the min-token mask), by a copy of the request's processor advanced
// token by token, then masks[j] (structured output: the grammar after drafts 0 .. j-1) as the processor's
// step 6. Inactive processing stays inactive as tokens are observed, so then the raw rows serve.
class ProcessedRows {
 public:
  ProcessedRows(const LogitProcessor& proc, const float* logits, int64_t vocab,
                std::span<const int32_t> drafted, const std::vector<std::vector<uint32_t>>& masks)
      : logits_(logits), vocab_(vocab), drafted_(drafted), masks_(masks) {
    if (proc.active()) proc_.emplace(proc);
  }
  // Call with j = 0, 1, ... in order.
  const float* at(size_t j) {
    const float* x = logits_ + j * size_t(vocab_);
    if (!proc_ && masks_.empty()) return x;
    row_.assign(x, x + vocab_);
    if (proc_) {
      if (j > 0) proc_->observe(drafted_[j - 1]);
      proc_->apply(row_.data(), vocab_);
    }
    if (!masks_.empty()) apply_token_bitmask(row_.data(), vocab_, masks_[j].data(), masks_[j].size());
    return row_.data();
  }

 private:
  const float* logits_;
  int64_t vocab_;
  std::span<const int32_t> drafted_;
  const std::vector<std::vector<uint32_t>>& masks_;
  std::optional<LogitProcessor> proc_;
  std::vector<float> row_;
};

bool ends_request(const Live& L, const ModelConfig& cfg, int32_t tok) {
  const auto& stops = L.req.sampling.stop_token_ids;
  return std::find(stops.begin(), stops.end(), tok) != stops.end() ||
         (!L.req.sampling.ignore_eos &&
          std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), tok) != cfg.eos_token_ids.end());
}

}  // namespace

void Engine::Impl::commit_verify(StepPlan& plan, std::vector<std::vector<int32_t>>& emitted,
                                 const std::vector<int32_t>& drafted, std::vector<std::vector<Draw>>& draws,
                                 const BatchDesc& batch, const std::vector<std::vector<int32_t>>* extend_rows,
                                 const std::function<void()>& give_back_pages, bool timed,
                                 Clock::time_point t0) {
  const size_t B = plan.rows.size();
  // Commit: the kept drafts join the sequence before finalize appends the last emitted token, so the row
  // computed 1 + (emitted - 1) positions for real; the pages past the sequence go back.
  std::vector<int32_t> by_row(B, -1);
  ++counters.spec.verify_steps;
  for (size_t i = 0; i < B; ++i) {
    std::vector<int32_t>& e = emitted[i];
    if (e.empty()) continue;
    Sequence& s = *plan.rows[i].seq;
    Live& L = live.at(s.id);
    const int32_t accepted = int32_t(e.size()) - 1;
    counters.spec.observe_row(drafted[i], accepted);
    if (drafted[i] > 0) {
      ++L.spec.verify_rows;
      L.spec.draft_tokens += drafted[i];
      L.spec.accepted_tokens += accepted;
    }
    truncate_at_stop(L, e);
    s.tokens.insert(s.tokens.end(), e.begin(), e.end() - 1);
    if (!s.cache_key.empty()) s.cache_key.insert(s.cache_key.end(), e.begin(), e.end() - 1);
    plan.rows[i].q_len += int32_t(e.size()) - 1;
    by_row[i] = e.back();
  }
  std::vector<int32_t> sampled(plan.sample_rows.size());
  for (size_t k = 0; k < sampled.size(); ++k) sampled[k] = by_row[size_t(plan.sample_rows[k])];
  sched->finalize(plan, sampled);
  give_back_pages();                       // before any request ends and frees its sequence
  eagle_extend(plan, batch, extend_rows);  // the draft's KV of the kept positions, and the next chains
  for (size_t i = 0; i < B; ++i) {
    if (!plan.rows[i].samples) continue;
    const RequestId id = plan.rows[i].seq->id;
    if (by_row[i] < 0) {
      finish(id, "length");
    } else {
      if (!draws[i].empty()) draws[i].resize(emitted[i].size());  // cut after a stop, as the tokens were
      deliver_verified(id, emitted[i], draws[i]);
    }
  }
  if (timed) {  // after the events, as a plain step's cost is measured
    int64_t tokens = 0, rows = 0;
    for (size_t i = 0; i < B; ++i) {
      tokens += int64_t(emitted[i].size());
      rows += emitted[i].empty() ? 0 : 1;
    }
    if (rows > 0) observe_decode_step(true, int32_t(B), t0, double(tokens) / double(rows));
  }
}

void Engine::Impl::truncate_at_stop(const Live& L, std::vector<int32_t>& emitted) const {
  for (size_t j = 0; j < emitted.size(); ++j)
    if (ends_request(L, runner->config(), emitted[j])) {
      emitted.resize(j + 1);  // what follows a stop is never emitted
      return;
    }
}

std::vector<int32_t> Engine::Impl::verify_row(Live& L, const float* logits, std::span<const int32_t> draft,
                                              const PositionMasks& masks) const {
  const int64_t V = runner->config().vocab_size;
  const SamplingParams& sp = L.sampler->params();
  ProcessedRows rows(L.sampler->processor(), logits, V, draft, masks);
  spec::Categorical dist;
  auto target = [&](size_t j) {
    const float* x = rows.at(j);
    if (sp.temperature <= 0.0f) return spec::TargetPosition{greedy_token(x, V), nullptr};
    token_distribution(x, V, sp, &dist);
    return spec::TargetPosition{-1, &dist};
  };
  return spec::verify_chain(draft, target, L.sampler->generator());
}

std::vector<Draw> Engine::Impl::emitted_logprobs(const Live& L, const float* logits,
                                                 const std::vector<int32_t>& tokens,
                                                 const PositionMasks& masks) const {
  const SamplingParams& sp = L.sampler->params();
  if (!sp.return_logprob && sp.top_logprobs == 0) return {};
  // The emitted tokens but the last are the kept drafts: each position's processing is the verifier's.
  const int64_t V = runner->config().vocab_size;
  ProcessedRows rows(L.sampler->processor(), logits, V, tokens, masks);
  std::vector<Draw> out(tokens.size());
  for (size_t j = 0; j < tokens.size(); ++j) {
    out[j].token = tokens[j];
    token_logprobs(rows.at(j), V, sp, &out[j]);
  }
  return out;
}

void Engine::Impl::deliver_verified(RequestId id, const std::vector<int32_t>& tokens,
                                    std::vector<Draw>& draws) {
  Live& L = live.at(id);
  const Sequence& s = *sched->find(id);
  const Clock::time_point now = Clock::now();
  const bool first = L.completion == 0;  // a prompt whose last token alone was left to compute
  for (int32_t tok : tokens) {
    L.sampler->observe(tok);
    ++L.completion;
    if (!L.grammar) continue;
    if (std::string why = L.grammar->advance(tok); !why.empty()) {  // the masks make this unreachable
      finish(id, "error", "structured output: " + why);
      return;
    }
  }
  counters.generation_tokens_total += int64_t(tokens.size());
  if (first) {
    release_followers(L);  // its prompt is computed: its full pages are in the cache now
    L.t_first = now;
    counters.ttft.observe(seconds(L.t_submit, now));
  }
  L.t_last = now;
  TokenEvent ev;
  ev.ids = tokens;
  if (L.req.sampling.return_logprob)
    for (const Draw& d : draws) ev.logprobs.push_back(d.logprob);
  if (L.req.sampling.top_logprobs > 0)
    for (Draw& d : draws) ev.top_logprobs.push_back(std::move(d.top));
  const int32_t last = tokens.back();
  if (ends_request(L, runner->config(), last) || (L.grammar && L.grammar->terminated())) {
    ev.matched_stop = last;
    finish(id, "stop", {}, &ev);
  } else if (L.completion >= L.req.sampling.max_new_tokens || int32_t(s.tokens.size()) >= s.max_len) {
    finish(id, "length", {}, &ev);
  } else {
    emit(id, L, ev);
  }
}

}  // namespace kiln
