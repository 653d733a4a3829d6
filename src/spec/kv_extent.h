// The page-table half of a verify step, for any pool with KvPool's alloc / unref (runtime/kv_pool.h): the
// runtime calls these on the scheduler's sequences (runtime/engine_spec.cpp); only page lists and lengths
// change, never KV bytes.
//
//   before the step: reserve_draft_pages grows a sequence's page list so that the verify row's positions
//     [0, want_tokens) have pages, from the pool's free list only (no eviction, no preemption: a draft is
//     never worth either); returns the positions covered, possibly fewer than asked (the caller drafts less).
//   after the step: rollback_pages drops the pages past the first keep_tokens positions. The rejected
//     drafts' KV stays in the kept pages past the sequence's computed length: never read (attention reads
//     [0, kv_len)) and overwritten when those positions are computed for real.
// Invariant kept: each page in the list holds one reference of the list (Scheduler::check_integrity).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::spec {

template <typename Pool>
int32_t reserve_draft_pages(Pool& pool, std::vector<int32_t>& pages, int32_t want_tokens) {
  const int32_t ps = pool.page_size();
  const int32_t need = pool.pages_for(want_tokens) - int32_t(pages.size());
  if (need > 0) {
    const int32_t take = need <= pool.num_free() ? need : pool.num_free();
    pool.alloc(take, pages);  // take <= num_free: cannot fail
  }
  const int64_t covered = int64_t(pages.size()) * ps;
  return covered < want_tokens ? int32_t(covered) : want_tokens;
}

template <typename Pool>
void rollback_pages(Pool& pool, std::vector<int32_t>& pages, int32_t keep_tokens) {
  const size_t keep = size_t(pool.pages_for(keep_tokens));
  while (pages.size() > keep) {
    pool.unref(pages.back());
    pages.pop_back();
  }
}

}  // namespace kiln::spec
