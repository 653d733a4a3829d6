#include "runtime/kv_pool.h"

#include "kiln/error.h"

namespace kiln {

KvPool::KvPool(int32_t num_pages, int32_t page_size) : page_size_(page_size) {
  KILN_CHECK(page_size > 0, "page size must be positive, got ", page_size);
  KILN_CHECK(num_pages >= 2, "the KV pool needs at least 2 pages (one is the null page), got ", num_pages);
  refs_.assign(size_t(num_pages), 0);
  free_.reserve(size_t(num_pages));
  for (int32_t p = num_pages - 1; p >= 1; --p) free_.push_back(p);
}

int32_t KvPool::refcount(int32_t page) const {
  KILN_CHECK(page >= 0 && page < num_pages(), "page ", page, " out of range");
  return refs_[size_t(page)];
}

bool KvPool::alloc(int32_t n, std::vector<int32_t>& out) {
  KILN_CHECK(n >= 0);
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    out.push_back(p);
  }
  return true;
}

void KvPool::ref(int32_t page) {
  KILN_CHECK(page > 0 && page < num_pages(), "ref of invalid page ", page);
  KILN_CHECK(refs_[size_t(page)] > 0, "ref of free page ", page);
  ++refs_[size_t(page)];
}

void KvPool::unref(int32_t page) {
  KILN_CHECK(page > 0 && page < num_pages(), "unref of invalid page ", page);
  KILN_CHECK(refs_[size_t(page)] > 0, "unref of free page ", page, " (double free)");
  if (--refs_[size_t(page)] == 0) free_.push_back(page);
}

void KvPool::unref_all(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) unref(p);
}

void KvPool::check_integrity() const {
  KILN_CHECK_EQ(refs_[size_t(kNullPage)], 0, "the null page must never be referenced");
  std::vector<char> on_free(refs_.size(), 0);
  for (int32_t p : free_) {
    KILN_CHECK(p > 0 && p < num_pages(), "free list holds invalid page ", p);
    KILN_CHECK(!on_free[size_t(p)], "page ", p, " is on the free list twice");
    on_free[size_t(p)] = 1;
    KILN_CHECK_EQ(refs_[size_t(p)], 0, "free page ", p, " has references");
  }
  for (int32_t p = 1; p < num_pages(); ++p) {
    KILN_CHECK(refs_[size_t(p)] >= 0, "page ", p, " has a negative refcount");
    KILN_CHECK(on_free[size_t(p)] || refs_[size_t(p)] > 0, "page ", p,
               " leaked: refcount 0, not on the free list");
  }
}

}  // namespace kiln
