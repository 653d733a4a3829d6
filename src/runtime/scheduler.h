// Scheduler: decides, step by step, which sequences run and how many of their tokens, and owns their
// KV page tables. Four verbs, called only from the engine thread:
//
//   admit(seq)      queue a new sequence (FCFS by arrival)
//   schedule()      plan one step. Named phases, in order:
//                     phase_running: running sequences, oldest first: a decode row (one token) or the
//                       next prefill chunk; pages come from the free list, then prefix-cache eviction,
//                       then preemption of the NEWEST running sequence (free + recompute later)
//                     phase_admit: waiting sequences, oldest first, into what is left of the prefill
//                       budget: prefix-cache match, then pages for the first chunk while keeping a
//                       reserve for what running sequences will still claim (see reserve_init); stops
//                       at the first one that does not fit (strict FCFS) or at max_running
//                     phase_build: the BatchDesc (+ which rows are decode rows)
//   plan_continuation(prev)   the overlap schedule: the decode step that follows `prev` for the same
//                       rows before prev is finalized (each row one token further; its input token is prev's
//                       draw, not known here: 0 in the batch), or false when pages would need eviction
//                       beyond the free list and the cache, or a preemption
//   finalize(plan, sampled)   after the model ran: advance each row, append sampled tokens, offer
//                       newly full pages to the prefix cache
//   release(id)     the engine ended a sequence (finished, aborted, failed): its computed full pages go
//                       to the prefix cache, its references are dropped, it is forgotten
//
// Guarantees: a sequence is never failed for lack of memory. max_len <= the pool's capacity is checked
// by admit(), so the oldest running sequence can always proceed once every newer one is preempted and the
// cache is evicted. Preempted sequences keep their tokens (prompt + generated) and are re-prefilled.
#pragma once

#include <climits>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/batch.h"
#include "runtime/kv_pool.h"
#include "runtime/radix_cache.h"

namespace kiln {

struct SchedulerOptions {
  int chunked_prefill_size = 8192;  // prefill tokens per step; <= 0: whole prompts in one step
  int max_running_requests = 256;
  bool enable_prefix_cache = true;
  bool enable_mixed_batches = true;  // false: a step is all prefill rows or all decode rows
  // Admission keeps free (or evictable) this fraction of the pages the running sequences could still
  // claim (each up to its max_len). It starts at reserve_init, falls by reserve_decay per step to
  // reserve_min, and jumps to 1 after a preemption. reserve_init <= 0: only one page per running sequence.
  double reserve_init = 0.7;
  double reserve_min = 0.1;
  double reserve_decay = 0.002;
};

struct Sequence {
  uint64_t id = 0;
  uint64_t arrival = 0;         // FCFS order, assigned by admit()
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  // The prefix cache's key for tokens, when it differs from them (Qwen3-VL: image tokens keyed by the image's
  // content hash, model/qwen3_vl_prompt.h); empty: the tokens themselves. Grows with tokens.
  std::vector<int32_t> cache_key;
  const int32_t* key() const { return cache_key.empty() ? tokens.data() : cache_key.data(); }
  int32_t prompt_len = 0;
  int32_t max_len = 0;        // tokens.size() never exceeds it (the engine ends the request there)
  int32_t num_computed = 0;   // KV exists for tokens [0, num_computed)
  int32_t num_offered = 0;    // tokens [0, num_offered) were offered to the prefix cache
  int32_t cached_tokens = 0;  // prompt tokens matched in the prefix cache at the last admission
  int32_t preemptions = 0;
  int32_t cache_limit = INT32_MAX;  // at most this many tokens may come from the prefix cache
  int32_t max_chunk = 0;            // > 0: at most this many tokens computed per step
  std::vector<int32_t> pages;       // page i holds tokens [i * page_size, (i + 1) * page_size)
  bool running = false;
};

struct StepRow {
  Sequence* seq = nullptr;
  int32_t begin = 0;  // first token computed this step (== seq->num_computed at planning)
  int32_t q_len = 0;
  bool samples = false;  // computes through the last token: its last row produces logits
};

struct StepPlan {
  BatchDesc batch;
  std::vector<StepRow> rows;         // one per batch sequence, same order
  std::vector<uint8_t> decode_rows;  // [B] 1 where q_len == 1 (the decode attention kernel's rows)
  std::vector<int32_t> sample_rows;  // index into rows for each batch.logit_rows entry
  std::vector<uint64_t> preempted;   // sequences preempted while planning this step
  int32_t prefill_tokens = 0;
  int32_t decode_tokens = 0;
  bool empty() const { return rows.empty(); }
};

class Scheduler {
 public:
  Scheduler(KvPool& pool, const SchedulerOptions& opts);
  ~Scheduler();

  // Verb 1. Throws kiln::Error when the sequence can never fit (max_len over the pool's capacity).
  void admit(std::unique_ptr<Sequence> seq);
  // Verb 2. prefill_limit > 0: this step computes at most that many prefill tokens (below
  // chunked_prefill_size: the engine's time bound on a step, EngineOptions::max_prefill_chunk_ms).
  StepPlan schedule(int64_t prefill_limit = 0);
  // Verb 2b. prev: a plan of decode rows only, every row sampling, not finalized yet. Builds in *next the
  // step of the same rows one token on (pages allocated, with eviction from the prefix cache but never a
  // preemption); false (nothing planned, pages already taken stay with their sequences) when it cannot.
  bool plan_continuation(const StepPlan& prev, StepPlan* next);
  // Verb 3. sampled[k] is the token drawn from the logits of plan.batch.logit_rows[k], or -1 for none.
  void finalize(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // Verb 4. Unknown ids are ignored.
  void release(uint64_t id);

  Sequence* find(uint64_t id);
  int num_running() const { return int(running_.size()); }
  int num_waiting() const { return int(waiting_.size()); }
  int64_t capacity_tokens() const { return int64_t(pool_.num_usable()) * pool_.page_size(); }
  RadixCache* cache() { return cache_.get(); }
  int64_t flush_cache();  // evicts every unreferenced cached page; returns pages freed
  int64_t total_preemptions() const { return total_preemptions_; }
  double reserve_ratio() const { return reserve_ratio_; }

  // Pool integrity plus exact reference accounting: each page's refcount equals the number of running
  // page tables listing it plus the tree's reference. Throws kiln::Error on any mismatch.
  void check_integrity() const;

 private:
  void phase_running(StepPlan& plan, int64_t& budget, bool decode, bool prefill);
  void phase_admit(StepPlan& plan, int64_t& budget);
  void phase_build(StepPlan& plan) const;

  int64_t future_pages(const Sequence& s) const;
  int64_t growth_limit(const Sequence& s) const;  // tokens the sequence is expected to reach
  int64_t make_free(int64_t pages);  // evicts cache leaves until `pages` are free (if it can); returns freed
  bool ensure_pages(Sequence& seq, int32_t tokens_after, StepPlan& plan);
  void preempt(Sequence& seq, StepPlan& plan);
  void offer_to_cache(Sequence& seq);
  void drop_pages(Sequence& seq);
  void insert_running(Sequence* seq);
  void insert_waiting(Sequence* seq);

  KvPool& pool_;
  SchedulerOptions opts_;
  std::unique_ptr<RadixCache> cache_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_;  // sorted by arrival
  std::deque<Sequence*> waiting_;   // sorted by arrival
  uint64_t next_arrival_ = 0;
  int64_t total_preemptions_ = 0;
  double reserve_ratio_ = 0.0;
};

}  // namespace kiln
