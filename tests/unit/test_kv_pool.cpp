#include <gtest/gtest.h>

#include "kiln/error.h"
#include "runtime/kv_pool.h"

namespace kiln {
namespace {

TEST(KvPool, AllocatesEveryUsablePageOnceAndNeverTheNullPage) {
  KvPool pool(9, 16);
  EXPECT_EQ(pool.num_usable(), 8);
  EXPECT_EQ(pool.num_free(), 8);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.alloc(8, pages));
  std::vector<int32_t> sorted = pages;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(pool.num_free(), 0);
  for (int32_t p : pages) EXPECT_EQ(pool.refcount(p), 1);
  EXPECT_EQ(pool.refcount(KvPool::kNullPage), 0);
  pool.check_integrity();
}

TEST(KvPool, AllocIsAllOrNothing) {
  KvPool pool(5, 4);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.alloc(3, a));
  std::vector<int32_t> b{42};
  EXPECT_FALSE(pool.alloc(2, b));
  EXPECT_EQ(b, std::vector<int32_t>{42});  // untouched
  EXPECT_EQ(pool.num_free(), 1);
  pool.check_integrity();
}

TEST(KvPool, RefcountsReturnPagesOnLastUnref) {
  KvPool pool(4, 8);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.alloc(1, a));
  pool.ref(a[0]);
  EXPECT_EQ(pool.refcount(a[0]), 2);
  pool.unref(a[0]);
  EXPECT_EQ(pool.num_free(), 2);
  pool.unref(a[0]);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.refcount(a[0]), 0);
  pool.check_integrity();
}

TEST(KvPool, MisuseIsAClearError) {
  KvPool pool(4, 8);
  EXPECT_THROW(pool.unref(1), Error);  // free page
  EXPECT_THROW(pool.ref(2), Error);    // free page
  EXPECT_THROW(pool.unref(0), Error);  // null page
  EXPECT_THROW(pool.ref(99), Error);   // out of range
  EXPECT_THROW(KvPool(1, 8), Error);   // only the null page
  EXPECT_THROW(KvPool(4, 0), Error);   // bad page size
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.alloc(1, a));
  pool.unref(a[0]);
  EXPECT_THROW(pool.unref(a[0]), Error);  // double free
  pool.check_integrity();
}

TEST(KvPool, PagesFor) {
  KvPool pool(4, 32);
  EXPECT_EQ(pool.pages_for(0), 0);
  EXPECT_EQ(pool.pages_for(1), 1);
  EXPECT_EQ(pool.pages_for(32), 1);
  EXPECT_EQ(pool.pages_for(33), 2);
}

}  // namespace
}  // namespace kiln
