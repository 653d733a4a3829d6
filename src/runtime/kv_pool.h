// KvPool: bookkeeping for the paged KV cache. It hands out page ids and counts references; the bytes
// live in the model's KvCache (src/model/kv_cache.h), which the pool never touches.
//
// Invariants (check_integrity() verifies them; tests call it after every step):
//   * page 0 is the null page: never allocated, refcount 0, never on the free list. Padded batch rows
//     (slot -1, CUDA graph buckets) point their page table at it so attention reads finite memory.
//   * every other page is either on the free list with refcount 0, or off it with refcount >= 1.
//   * the free list holds no duplicates; num_free() == its size.
//   * a reference is held by each request page table that lists the page and by the radix cache node
//     that owns it. Whoever drops the last reference returns the page to the free list.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

class KvPool {
 public:
  static constexpr int32_t kNullPage = 0;

  // num_pages includes the null page, so num_pages - 1 are usable. page_size in tokens.
  KvPool(int32_t num_pages, int32_t page_size);

  int32_t page_size() const { return page_size_; }
  int32_t num_pages() const { return int32_t(refs_.size()); }
  int32_t num_usable() const { return num_pages() - 1; }
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t refcount(int32_t page) const;

  // All-or-nothing: appends n fresh pages (refcount 1) to out and returns true, or changes nothing.
  bool alloc(int32_t n, std::vector<int32_t>& out);
  void ref(int32_t page);    // page must be allocated
  void unref(int32_t page);  // page must be allocated; frees it when the count reaches 0
  void unref_all(const std::vector<int32_t>& pages);

  // Throws kiln::Error describing the first broken invariant.
  void check_integrity() const;

  // Pages needed to hold `tokens` tokens.
  int32_t pages_for(int64_t tokens) const { return int32_t((tokens + page_size_ - 1) / page_size_); }

 private:
  int32_t page_size_;
  std::vector<int32_t> refs_;  // [num_pages]
  std::vector<int32_t> free_;  // stack; lowest ids popped first at start for readable tests
};

}  // namespace kiln
