// RadixCache: a radix tree over token ids whose edges are whole KV pages. It remembers which pages hold
// the KV of which token prefixes so a new request can start from the longest cached prefix.
//
// Ownership: every page a node lists carries one KvPool reference owned by the tree. match() gives the
// caller one extra reference per returned page (the request's page table then owns it). A node is
// evictable when it is a leaf and every one of its pages has refcount 1 (only the tree holds it);
// eviction takes least-recently-used leaves first and may make their parents evictable in turn.
//
// Granularity: only FULL pages are stored; keys are always a multiple of page_size long, and a node is
// split at a page boundary when a match or an insert diverges inside it. KV depends on position, so
// a page is reusable only as part of the exact prefix it was computed under: that is what the tree
// path encodes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "runtime/kv_pool.h"

namespace kiln {

class RadixCache {
 public:
  explicit RadixCache(KvPool& pool);
  ~RadixCache();  // returns every page the tree holds to the pool (the pool must outlive the cache)
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  struct Match {
    std::vector<int32_t> pages;  // one reference each now belongs to the caller
    int64_t tokens = 0;          // pages.size() * page_size
  };
  // Longest cached prefix of tokens[0, max_tokens), in whole pages. Marks the path recently used.
  Match match(const int32_t* tokens, int64_t max_tokens);

  // Offers the KV of tokens[0, n) (n a multiple of page_size), held in pages[0, n / page_size). The tree
  // adopts (takes a reference on) the pages past its existing prefix; pages for tokens it already holds
  // stay solely with the caller. Returns the number of tokens adopted.
  int64_t insert(const int32_t* tokens, int64_t n, const std::vector<int32_t>& pages);

  // Frees at least `num_pages` pages if it can, least recently used leaves first; returns pages freed.
  int64_t evict(int64_t num_pages);
  int64_t flush() { return evict(INT64_MAX); }  // every evictable page

  int64_t num_pages() const { return num_pages_; }  // pages the tree references
  int64_t num_evictable_pages() const;              // pages eviction could free now (walks the tree)
  void for_each_page(const std::function<void(int32_t)>& fn) const;
  void check_integrity() const;  // key/page sizes, child keys, page counts, pages referenced

 private:
  struct Node {
    std::vector<int32_t> key;    // tokens, key.size() == pages.size() * page_size
    std::vector<int32_t> pages;  // the tree's reference on each
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;  // keyed by the child's first page
    uint64_t last_access = 0;
  };

  std::vector<int32_t> first_page(const int32_t* tokens) const;
  // Whole pages in common between node->key and tokens[0, n).
  int64_t common_pages(const Node* node, const int32_t* tokens, int64_t n) const;
  Node* split(Node* node, int64_t pages);  // node keeps its first `pages`, a new child holds the rest
  bool evictable(const Node* node) const;
  void release_subtree(Node* node);

  KvPool& pool_;
  int32_t page_size_;
  std::unique_ptr<Node> root_;
  int64_t num_pages_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace kiln
