#include <gtest/gtest.h>

#include <numeric>

#include "kiln/error.h"
#include "runtime/radix_cache.h"

namespace kiln {
namespace {

std::vector<int32_t> seq(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Allocates pages for n tokens, offers the full ones to the cache, then drops the caller's references.
std::vector<int32_t> insert_and_release(KvPool& pool, RadixCache& cache, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> pages;
  EXPECT_TRUE(pool.alloc(pool.pages_for(int64_t(tokens.size())), pages));
  const int64_t full = int64_t(tokens.size()) / pool.page_size() * pool.page_size();
  cache.insert(tokens.data(), full, pages);
  pool.unref_all(pages);
  return pages;
}

TEST(RadixCache, MatchesLongestFullPagePrefix) {
  KvPool pool(32, 4);
  RadixCache cache(pool);
  const auto a = seq(10);  // 2 full pages + 2 tokens
  const auto pages = insert_and_release(pool, cache, a);
  EXPECT_EQ(cache.num_pages(), 2);
  EXPECT_EQ(pool.num_free(), 31 - 2);  // the partial third page went back to the pool

  auto q = seq(12);
  auto m = cache.match(q.data(), 12);
  EXPECT_EQ(m.tokens, 8);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{pages[0], pages[1]}));
  EXPECT_EQ(pool.refcount(pages[0]), 2);  // the tree's and the caller's
  pool.unref_all(m.pages);

  auto limited = cache.match(q.data(), 7);  // only one full page fits in 7 tokens
  EXPECT_EQ(limited.tokens, 4);
  pool.unref_all(limited.pages);

  auto other = seq(8, 100);
  EXPECT_EQ(cache.match(other.data(), 8).tokens, 0);
  cache.check_integrity();
  pool.check_integrity();
}

TEST(RadixCache, DivergenceInsideANodeSplitsAtAPageBoundary) {
  KvPool pool(32, 4);
  RadixCache cache(pool);
  auto a = seq(16);
  insert_and_release(pool, cache, a);
  auto b = a;
  b[9] = 999;  // diverges in page 2
  auto m = cache.match(b.data(), 16);
  EXPECT_EQ(m.tokens, 8);
  pool.unref_all(m.pages);
  // Insert b: it shares 2 pages, adopts its own last 2.
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.alloc(4, pages));
  EXPECT_EQ(cache.insert(b.data(), 16, pages), 8);
  pool.unref_all(pages);
  EXPECT_EQ(cache.num_pages(), 6);
  auto ma = cache.match(a.data(), 16), mb = cache.match(b.data(), 16);
  EXPECT_EQ(ma.tokens, 16);
  EXPECT_EQ(mb.tokens, 16);
  EXPECT_EQ(std::vector<int32_t>(ma.pages.begin(), ma.pages.begin() + 2),
            std::vector<int32_t>(mb.pages.begin(), mb.pages.begin() + 2));
  EXPECT_NE(ma.pages[2], mb.pages[2]);
  pool.unref_all(ma.pages);
  pool.unref_all(mb.pages);
  cache.check_integrity();
  pool.check_integrity();
}

TEST(RadixCache, InsertingAKnownPrefixAdoptsNothing) {
  KvPool pool(32, 4);
  RadixCache cache(pool);
  auto a = seq(8);
  insert_and_release(pool, cache, a);
  std::vector<int32_t> dup;
  ASSERT_TRUE(pool.alloc(2, dup));
  EXPECT_EQ(cache.insert(a.data(), 8, dup), 0);
  EXPECT_EQ(pool.refcount(dup[0]), 1);  // still only the caller's
  pool.unref_all(dup);
  EXPECT_EQ(cache.num_pages(), 2);
  EXPECT_THROW(cache.insert(a.data(), 6, dup), Error);  // not whole pages
  cache.check_integrity();
  pool.check_integrity();
}

TEST(RadixCache, EvictsLeastRecentlyUsedUnreferencedLeavesFirst) {
  KvPool pool(32, 4);
  RadixCache cache(pool);
  auto a = seq(8, 0), b = seq(8, 100), c = seq(8, 200);
  const auto pa = insert_and_release(pool, cache, a);
  const auto pb = insert_and_release(pool, cache, b);
  const auto pc = insert_and_release(pool, cache, c);
  // Touch a so b is the oldest; hold c so it cannot go.
  auto ma = cache.match(a.data(), 8);
  pool.unref_all(ma.pages);
  auto mc = cache.match(c.data(), 8);
  EXPECT_EQ(cache.num_evictable_pages(), 4);
  EXPECT_EQ(cache.evict(1), 2);  // whole leaf b
  EXPECT_EQ(pool.refcount(pb[0]), 0);
  EXPECT_EQ(pool.refcount(pa[0]), 1);
  EXPECT_EQ(cache.match(b.data(), 8).tokens, 0);
  EXPECT_EQ(cache.flush(), 2);  // a; c is referenced
  EXPECT_EQ(cache.num_pages(), 2);
  EXPECT_EQ(pool.refcount(pc[0]), 2);
  pool.unref_all(mc.pages);
  EXPECT_EQ(cache.flush(), 2);
  EXPECT_EQ(cache.num_pages(), 0);
  EXPECT_EQ(pool.num_free(), pool.num_usable());
  cache.check_integrity();
  pool.check_integrity();
}

TEST(RadixCache, ParentsBecomeEvictableAfterTheirChildren) {
  KvPool pool(32, 4);
  RadixCache cache(pool);
  auto a = seq(12), b = seq(12);
  b[10] = 77;
  insert_and_release(pool, cache, a);
  insert_and_release(pool, cache, b);  // shares 2 pages, its own third
  EXPECT_EQ(cache.num_pages(), 4);
  EXPECT_EQ(cache.flush(), 4);
  EXPECT_EQ(pool.num_free(), pool.num_usable());
  cache.check_integrity();
}

TEST(RadixCache, DestructorReturnsEveryPage) {
  KvPool pool(16, 4);
  {
    RadixCache cache(pool);
    insert_and_release(pool, cache, seq(20));
    EXPECT_EQ(pool.num_free(), pool.num_usable() - 5);
  }
  EXPECT_EQ(pool.num_free(), pool.num_usable());
  pool.check_integrity();
}

}  // namespace
}  // namespace kiln
