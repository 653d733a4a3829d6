#include "runtime/radix_cache.h"

#include <algorithm>
#include <queue>

#include "kiln/error.h"

namespace kiln {

RadixCache::RadixCache(KvPool& pool)
    : pool_(pool), page_size_(pool.page_size()), root_(std::make_unique<Node>()) {}

RadixCache::~RadixCache() {
  release_subtree(root_.get());
}

void RadixCache::release_subtree(Node* node) {
  for (auto& [k, child] : node->children) release_subtree(child.get());
  pool_.unref_all(node->pages);
  num_pages_ -= int64_t(node->pages.size());
  node->pages.clear();
  node->key.clear();
  node->children.clear();
}

std::vector<int32_t> RadixCache::first_page(const int32_t* tokens) const {
  return std::vector<int32_t>(tokens, tokens + page_size_);
}

int64_t RadixCache::common_pages(const Node* node, const int32_t* tokens, int64_t n) const {
  const int64_t max_pages = std::min<int64_t>(int64_t(node->pages.size()), n / page_size_);
  int64_t p = 0;
  for (; p < max_pages; ++p) {
    const int32_t* a = node->key.data() + p * page_size_;
    if (!std::equal(a, a + page_size_, tokens + p * page_size_)) break;
  }
  return p;
}

RadixCache::Node* RadixCache::split(Node* node, int64_t pages) {
  KILN_CHECK(pages > 0 && pages < int64_t(node->pages.size()), "bad split");
  auto tail = std::make_unique<Node>();
  tail->key.assign(node->key.begin() + pages * page_size_, node->key.end());
  tail->pages.assign(node->pages.begin() + pages, node->pages.end());
  tail->children = std::move(node->children);
  for (auto& [k, c] : tail->children) c->parent = tail.get();
  tail->parent = node;
  tail->last_access = node->last_access;
  node->key.resize(size_t(pages * page_size_));
  node->pages.resize(size_t(pages));
  node->children.clear();
  auto key = first_page(tail->key.data());
  node->children.emplace(std::move(key), std::move(tail));
  return node;
}

RadixCache::Match RadixCache::match(const int32_t* tokens, int64_t max_tokens) {
  Match m;
  const int64_t limit = max_tokens / page_size_ * page_size_;
  const uint64_t now = ++clock_;
  Node* node = root_.get();
  int64_t pos = 0;
  while (pos + page_size_ <= limit) {
    auto it = node->children.find(first_page(tokens + pos));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    const int64_t common = common_pages(child, tokens + pos, limit - pos);
    if (common < int64_t(child->pages.size())) split(child, common);
    child->last_access = now;
    m.pages.insert(m.pages.end(), child->pages.begin(), child->pages.end());
    pos += common * page_size_;
    node = child;
  }
  for (Node* n = node; n; n = n->parent) n->last_access = now;
  for (int32_t p : m.pages) pool_.ref(p);
  m.tokens = int64_t(m.pages.size()) * page_size_;
  return m;
}

int64_t RadixCache::insert(const int32_t* tokens, int64_t n, const std::vector<int32_t>& pages) {
  KILN_CHECK(n % page_size_ == 0, "radix insert of ", n, " tokens: not whole pages of ", page_size_);
  KILN_CHECK(int64_t(pages.size()) >= n / page_size_, "radix insert: ", pages.size(), " pages for ", n,
             " tokens");
  const uint64_t now = ++clock_;
  Node* node = root_.get();
  int64_t pos = 0;
  while (pos < n) {
    auto it = node->children.find(first_page(tokens + pos));
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->key.assign(tokens + pos, tokens + n);
      leaf->pages.assign(pages.begin() + pos / page_size_, pages.begin() + n / page_size_);
      for (int32_t p : leaf->pages) pool_.ref(p);
      num_pages_ += int64_t(leaf->pages.size());
      leaf->parent = node;
      leaf->last_access = now;
      node->children.emplace(first_page(tokens + pos), std::move(leaf));
      const int64_t adopted = n - pos;
      for (Node* a = node; a; a = a->parent) a->last_access = now;
      return adopted;
    }
    Node* child = it->second.get();
    const int64_t common = common_pages(child, tokens + pos, n - pos);  // >= 1: the first page matched
    if (common < int64_t(child->pages.size())) split(child, common);
    pos += common * page_size_;
    node = child;
  }
  for (Node* a = node; a; a = a->parent) a->last_access = now;
  return 0;
}

bool RadixCache::evictable(const Node* node) const {
  if (node == root_.get() || !node->children.empty()) return false;
  for (int32_t p : node->pages)
    if (pool_.refcount(p) != 1) return false;
  return true;
}

int64_t RadixCache::evict(int64_t num_pages) {
  if (num_pages <= 0) return 0;
  using Item = std::pair<uint64_t, Node*>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;  // oldest first
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [k, c] : n->children) stack.push_back(c.get());
    if (evictable(n)) heap.emplace(n->last_access, n);
  }
  int64_t freed = 0;
  while (freed < num_pages && !heap.empty()) {
    Node* n = heap.top().second;
    heap.pop();
    Node* parent = n->parent;
    freed += int64_t(n->pages.size());
    pool_.unref_all(n->pages);
    num_pages_ -= int64_t(n->pages.size());
    parent->children.erase(first_page(n->key.data()));  // destroys n
    if (evictable(parent)) heap.emplace(parent->last_access, parent);
  }
  return freed;
}

int64_t RadixCache::num_evictable_pages() const {
  // A subtree is fully evictable when every page in it has refcount 1; count pages of such subtrees.
  std::function<bool(const Node*, int64_t&)> walk = [&](const Node* n, int64_t& total) -> bool {
    bool all = true;
    for (const auto& [k, c] : n->children) all = walk(c.get(), total) && all;
    if (!all || n == root_.get()) return false;
    for (int32_t p : n->pages)
      if (pool_.refcount(p) != 1) return false;
    total += int64_t(n->pages.size());
    return true;
  };
  int64_t total = 0;
  walk(root_.get(), total);
  return total;
}

void RadixCache::for_each_page(const std::function<void(int32_t)>& fn) const {
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (int32_t p : n->pages) fn(p);
    for (const auto& [k, c] : n->children) stack.push_back(c.get());
  }
}

void RadixCache::check_integrity() const {
  KILN_CHECK(root_->key.empty() && root_->pages.empty(), "radix root must be empty");
  int64_t pages = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    pages += int64_t(n->pages.size());
    if (n != root_.get()) {
      KILN_CHECK(!n->pages.empty(), "radix node without pages");
      KILN_CHECK_EQ(n->key.size(), n->pages.size() * size_t(page_size_), "radix node key/page mismatch");
    }
    for (int32_t p : n->pages) KILN_CHECK(pool_.refcount(p) >= 1, "radix page ", p, " is not referenced");
    for (const auto& [k, c] : n->children) {
      KILN_CHECK(c->parent == n, "radix child with a wrong parent");
      KILN_CHECK(k == first_page(c->key.data()), "radix child filed under the wrong key");
      stack.push_back(c.get());
    }
  }
  KILN_CHECK_EQ(pages, num_pages_, "radix page count drifted");
}

}  // namespace kiln
