#include "runtime/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "kiln/error.h"

namespace kiln {

Scheduler::Scheduler(KvPool& pool, const SchedulerOptions& opts)
    : pool_(pool), opts_(opts), reserve_ratio_(std::clamp(opts.reserve_init, 0.0, 1.0)) {
  KILN_CHECK(opts.max_running_requests >= 1, "max_running_requests must be >= 1, got ",
             opts.max_running_requests);
  if (opts.enable_prefix_cache) cache_ = std::make_unique<RadixCache>(pool);
}

Scheduler::~Scheduler() {
  for (Sequence* s : running_) drop_pages(*s);
  cache_.reset();
}

Sequence* Scheduler::find(uint64_t id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Scheduler::admit(std::unique_ptr<Sequence> seq) {
  KILN_CHECK(seq != nullptr);
  KILN_CHECK(!seq->tokens.empty(), "a sequence needs at least one token");
  KILN_CHECK(!seqs_.count(seq->id), "sequence id ", seq->id, " admitted twice");
  KILN_CHECK(seq->cache_key.empty() || seq->cache_key.size() == seq->tokens.size(),
             "a sequence's cache key must match its tokens in length");
  KILN_CHECK(int64_t(seq->tokens.size()) <= seq->max_len, "sequence longer than its max_len");
  KILN_CHECK(seq->max_len <= capacity_tokens(), "the request needs ", seq->max_len,
             " tokens of KV but the pool holds only ", capacity_tokens());
  seq->arrival = next_arrival_++;
  seq->num_computed = 0;
  seq->num_offered = 0;
  seq->pages.clear();
  seq->running = false;
  waiting_.push_back(seq.get());
  seqs_.emplace(seq->id, std::move(seq));
}

StepPlan Scheduler::schedule(int64_t prefill_limit) {
  StepPlan plan;
  int64_t budget = opts_.chunked_prefill_size > 0 ? opts_.chunked_prefill_size : INT64_MAX;
  if (prefill_limit > 0) budget = std::min(budget, prefill_limit);
  if (opts_.enable_mixed_batches) {
    phase_running(plan, budget, /*decode=*/true, /*prefill=*/true);
    if (plan.preempted.empty()) phase_admit(plan, budget);
  } else {
    // Prefill first; decode rows run in steps of their own when there is no prefill work to do.
    phase_running(plan, budget, /*decode=*/false, /*prefill=*/true);
    if (plan.preempted.empty()) phase_admit(plan, budget);
    if (plan.rows.empty()) phase_running(plan, budget, /*decode=*/true, /*prefill=*/false);
  }
  // A preemption means the reservation was too optimistic: go back to the worst case, then relax.
  reserve_ratio_ =
      plan.preempted.empty() ? std::max(opts_.reserve_min, reserve_ratio_ - opts_.reserve_decay) : 1.0;
  if (opts_.reserve_init <= 0.0) reserve_ratio_ = 0.0;
  phase_build(plan);
  return plan;
}

void Scheduler::phase_running(StepPlan& plan, int64_t& budget, bool decode, bool prefill) {
  // While requests wait for a place, running prefills get only half of the step's prefill budget: the rest
  // goes to admission, so a long prompt being prefilled chunk by chunk does not hold a short one back until
  // it is done (vLLM's long_prefill_token_threshold has the same purpose). Not in unmixed mode, whose steps
  // must not mix a prompt's last 1-token chunk (a decode-shaped row) with other prefill rows.
  bool admitting =
      opts_.enable_mixed_batches && !waiting_.empty() && int(running_.size()) < opts_.max_running_requests;
  if (admitting && cache_) {
    // A waiting request that starts as a running prompt does (a shared system prompt) is better off waiting
    // for that prompt's pages to reach the prefix cache than computing them again beside it.
    const Sequence& w = *waiting_.front();
    const int32_t n = std::min<int32_t>(pool_.page_size(), int32_t(w.tokens.size()));
    for (const Sequence* r : running_)
      if (int32_t(r->tokens.size()) - r->num_computed > 1 && int32_t(r->tokens.size()) >= n &&
          std::equal(w.key(), w.key() + n, r->key()))
        admitting = false;
  }
  const int64_t reserved = admitting && budget >= 2 ? budget / 2 : 0;
  budget -= reserved;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    const int32_t remaining = int32_t(s.tokens.size()) - s.num_computed;
    if (remaining <= 0) continue;
    int32_t q = 1;
    if (remaining == 1) {
      if (!decode) continue;
    } else {
      if (!prefill || budget <= 0) continue;
      q = int32_t(std::min<int64_t>(remaining, budget));
      if (s.max_chunk > 0) q = std::min(q, s.max_chunk);
    }
    // Preemption removes the newest running sequences (index > i) or `s` itself, which is then last.
    if (!ensure_pages(s, s.num_computed + q, plan)) break;
    if (remaining > 1) budget -= q;
    plan.rows.push_back({&s, s.num_computed, q, s.num_computed + q == int32_t(s.tokens.size())});
  }
  budget += reserved;
}

int64_t Scheduler::future_pages(const Sequence& s) const {
  return std::max<int64_t>(0, pool_.pages_for(growth_limit(s)) - int64_t(s.pages.size()));
}

int64_t Scheduler::growth_limit(const Sequence& s) const {
  // Estimate at most kGrowthClip more tokens: requests with huge max_new_tokens (clients that leave
  // max_tokens unset) would otherwise each reserve the whole context (SGLang clips at 4096 too).
  constexpr int64_t kGrowthClip = 4096;
  return std::min<int64_t>(s.max_len, int64_t(s.tokens.size()) + kGrowthClip);
}

void Scheduler::phase_admit(StepPlan& plan, int64_t& budget) {
  // Pages the running sequences may still claim before they finish (each to max_len, clipped).
  int64_t future = 0;
  for (const Sequence* r : running_) future += future_pages(*r);
  while (!waiting_.empty() && int(running_.size()) < opts_.max_running_requests && budget > 0) {
    Sequence& s = *waiting_.front();
    if (cache_) {
      // Leave at least the last token to compute: its logits start the generation.
      RadixCache::Match m =
          cache_->match(s.key(), std::min<int64_t>(int64_t(s.tokens.size()) - 1, s.cache_limit));
      s.pages = std::move(m.pages);
      s.num_computed = int32_t(m.tokens);
      s.num_offered = s.num_computed;
    }
    s.cached_tokens = std::min(s.num_computed, s.prompt_len);
    const int32_t remaining = int32_t(s.tokens.size()) - s.num_computed;
    int32_t q = int32_t(std::min<int64_t>(remaining, budget));
    if (s.max_chunk > 0) q = std::min(q, s.max_chunk);
    const int32_t need = pool_.pages_for(s.num_computed + q) - int32_t(s.pages.size());
    // Keep free (or evictable) what the running sequences and this one are expected to claim later:
    // reserve_ratio_ of their worst case, and at least one page per running sequence. Without this,
    // long generations fill the pool, the newest is preempted, re-admitted at once and preempted again.
    const int64_t later =
        future + std::max<int64_t>(0, pool_.pages_for(growth_limit(s)) - pool_.pages_for(s.num_computed + q));
    const int64_t reserve =
        std::max<int64_t>(int64_t(running_.size()), int64_t(std::ceil(reserve_ratio_ * double(later))));
    const int64_t target = std::min<int64_t>(need + reserve, pool_.num_usable());
    // Cached pages count as available for the reserve, but only the pages needed now are evicted.
    const bool fits =
        pool_.num_free() >= target || (cache_ && pool_.num_free() + cache_->num_evictable_pages() >= target);
    if (fits) make_free(need);
    if (!fits || pool_.num_free() < need) {
      drop_pages(s);  // return the matched prefix; strict FCFS: nobody behind it goes first
      break;
    }
    KILN_CHECK(pool_.alloc(need, s.pages), "allocation failed after the free-page check");
    waiting_.pop_front();
    s.running = true;
    insert_running(&s);
    future += future_pages(s);
    budget -= q;
    plan.rows.push_back({&s, s.num_computed, q, s.num_computed + q == int32_t(s.tokens.size())});
  }
}

void Scheduler::phase_build(StepPlan& plan) const {
  BatchDesc& b = plan.batch;
  const int32_t ps = pool_.page_size();
  b.page_size = ps;
  b.cu_q.assign(1, 0);
  int32_t stride = 0;
  for (const StepRow& r : plan.rows) stride = std::max(stride, pool_.pages_for(r.begin + r.q_len));
  b.pages_stride = stride;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    const Sequence& s = *r.seq;
    for (int32_t t = r.begin; t < r.begin + r.q_len; ++t) {
      // A continuation's row (plan_continuation) is one token past the sequence: its token is drawn by the
      // step before it, on the device; 0 stands in.
      b.tokens.push_back(size_t(t) < s.tokens.size() ? s.tokens[size_t(t)] : 0);
      b.positions.push_back(t);
      b.slot_mapping.push_back(int64_t(s.pages[size_t(t / ps)]) * ps + t % ps);
    }
    b.cu_q.push_back(b.cu_q.back() + r.q_len);
    b.kv_lens.push_back(r.begin + r.q_len);
    b.seq_ids.push_back(s.id);
    const int32_t used = pool_.pages_for(r.begin + r.q_len);
    for (int32_t p = 0; p < stride; ++p)
      b.page_table.push_back(p < used ? s.pages[size_t(p)] : KvPool::kNullPage);
    if (r.samples) {
      b.logit_rows.push_back(b.cu_q.back() - 1);
      plan.sample_rows.push_back(int32_t(i));
    }
    plan.decode_rows.push_back(r.q_len == 1 ? 1 : 0);
    (r.q_len == 1 ? plan.decode_tokens : plan.prefill_tokens) += r.q_len;
  }
}

bool Scheduler::plan_continuation(const StepPlan& prev, StepPlan* next) {
  *next = StepPlan{};
  for (const StepRow& r : prev.rows) {
    Sequence& s = *r.seq;
    KILN_CHECK(r.q_len == 1 && r.samples && s.running && s.num_computed == r.begin &&
                   int32_t(s.tokens.size()) == r.begin + 1,
               "plan_continuation: row of sequence ", s.id, " is not an unfinalized decode row");
    // Pages for one token more than prev computes: the free list, then the prefix cache; no preemption.
    const int32_t need = pool_.pages_for(r.begin + 2) - int32_t(s.pages.size());
    if (need > 0) {
      make_free(need);
      if (!pool_.alloc(need, s.pages)) return false;
    }
    next->rows.push_back({&s, r.begin + 1, 1, true});
  }
  phase_build(*next);
  return true;
}

bool Scheduler::ensure_pages(Sequence& seq, int32_t tokens_after, StepPlan& plan) {
  const int32_t need = pool_.pages_for(tokens_after) - int32_t(seq.pages.size());
  if (need <= 0) return true;
  for (;;) {
    if (pool_.alloc(need, seq.pages)) return true;
    if (make_free(need) > 0) continue;
    KILN_CHECK(!running_.empty(), "internal: no running sequence to preempt");
    Sequence* victim = running_.back();
    preempt(*victim, plan);
    if (victim == &seq) return false;
  }
}

int64_t Scheduler::make_free(int64_t pages) {
  if (!cache_ || pool_.num_free() >= pages) return 0;
  // Each eviction walks the whole tree, so free a batch (1/64 of the pool) at a time: once the cache has
  // filled the pool, every allocation would otherwise pay for a walk.
  const int64_t batch = std::max<int64_t>(1, pool_.num_usable() / 64);
  return cache_->evict(std::max<int64_t>(pages - pool_.num_free(), batch));
}

void Scheduler::preempt(Sequence& seq, StepPlan& plan) {
  offer_to_cache(seq);  // its prefix may still be there when it comes back
  drop_pages(seq);
  seq.running = false;
  ++seq.preemptions;
  ++total_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), &seq));
  insert_waiting(&seq);
  plan.preempted.push_back(seq.id);
}

void Scheduler::offer_to_cache(Sequence& seq) {
  if (!cache_) return;
  const int32_t full = seq.num_computed / pool_.page_size() * pool_.page_size();
  if (full <= seq.num_offered) return;
  cache_->insert(seq.key(), full, seq.pages);
  seq.num_offered = full;
}

void Scheduler::drop_pages(Sequence& seq) {
  pool_.unref_all(seq.pages);
  seq.pages.clear();
  seq.num_computed = 0;
  seq.num_offered = 0;
}

void Scheduler::insert_running(Sequence* seq) {
  auto it = std::upper_bound(running_.begin(), running_.end(), seq,
                             [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  running_.insert(it, seq);
}

void Scheduler::insert_waiting(Sequence* seq) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                             [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  waiting_.insert(it, seq);
}

void Scheduler::finalize(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  KILN_CHECK_EQ(sampled.size(), plan.sample_rows.size(), "one sampled token per logit row");
  for (const StepRow& r : plan.rows) {
    KILN_CHECK(r.seq->running && r.seq->num_computed == r.begin, "sequence ", r.seq->id, " changed mid-step");
    r.seq->num_computed = r.begin + r.q_len;
  }
  for (size_t k = 0; k < sampled.size(); ++k) {
    Sequence& s = *plan.rows[size_t(plan.sample_rows[k])].seq;
    if (sampled[k] >= 0) {
      s.tokens.push_back(sampled[k]);
      if (!s.cache_key.empty()) s.cache_key.push_back(sampled[k]);
    }
  }
  for (const StepRow& r : plan.rows) offer_to_cache(*r.seq);
}

void Scheduler::release(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Sequence* s = it->second.get();
  if (s->running) {
    offer_to_cache(*s);
    drop_pages(*s);
    running_.erase(std::find(running_.begin(), running_.end(), s));
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), s);
    if (w != waiting_.end()) waiting_.erase(w);
  }
  seqs_.erase(it);
}

int64_t Scheduler::flush_cache() {
  return cache_ ? cache_->flush() : 0;
}

void Scheduler::check_integrity() const {
  pool_.check_integrity();
  if (cache_) cache_->check_integrity();
  std::vector<int32_t> expect(size_t(pool_.num_pages()), 0);
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence* s = running_[i];
    KILN_CHECK(s->running, "sequence ", s->id, " in the running list but not marked running");
    KILN_CHECK(i == 0 || running_[i - 1]->arrival < s->arrival, "running list out of arrival order");
    KILN_CHECK(int64_t(s->pages.size()) * pool_.page_size() >= s->num_computed, "sequence ", s->id,
               ": computed tokens without pages");
    for (int32_t p : s->pages) ++expect[size_t(p)];
  }
  for (size_t i = 0; i < waiting_.size(); ++i) {
    const Sequence* s = waiting_[i];
    KILN_CHECK(!s->running && s->pages.empty(), "waiting sequence ", s->id, " holds pages");
    KILN_CHECK(i == 0 || waiting_[i - 1]->arrival < s->arrival, "waiting queue out of arrival order");
  }
  KILN_CHECK_EQ(running_.size() + waiting_.size(), seqs_.size(), "sequences lost between the queues");
  if (cache_) cache_->for_each_page([&](int32_t p) { ++expect[size_t(p)]; });
  for (int32_t p = 0; p < pool_.num_pages(); ++p)
    KILN_CHECK_EQ(pool_.refcount(p), expect[size_t(p)], "page ", p, " refcount vs holders");
}

}  // namespace kiln
