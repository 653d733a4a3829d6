// The environment-switch readers (kiln/env.h): each value they take, the fallback when unset or empty, and
// the error naming the variable for anything else.
#include "kiln/env.h"

#include <gtest/gtest.h>

#include "common/scoped_env.h"
#include "common/test_support.h"

namespace kiln {
namespace {

using test_support::ScopedEnv;

// A variable of this test binary alone (ctest runs each TEST in its own process).
constexpr const char* kVar = "KILN_TEST_ENV_READER";

TEST(Env, SwitchTakesZeroAndOne) {
  {
    const ScopedEnv v(kVar, nullptr);
    EXPECT_TRUE(env_switch(kVar, true));
    EXPECT_FALSE(env_switch(kVar, false));
  }
  {
    const ScopedEnv v(kVar, "");
    EXPECT_TRUE(env_switch(kVar, true));
  }
  {
    const ScopedEnv v(kVar, "1");
    EXPECT_TRUE(env_switch(kVar, false));
  }
  {
    const ScopedEnv v(kVar, "0");
    EXPECT_FALSE(env_switch(kVar, true));
  }
  const ScopedEnv v(kVar, "yes");
  test_support::expect_contains(test_support::error_of([] { env_switch(kVar, true); }),
                                {kVar, "must be 0 or 1", "'yes'"});
}

TEST(Env, NumberTakesDecimals) {
  {
    const ScopedEnv v(kVar, nullptr);
    EXPECT_EQ(env_number(kVar, 2.5), 2.5);
  }
  {
    const ScopedEnv v(kVar, "0.125");
    EXPECT_EQ(env_number(kVar, 2.5), 0.125);
  }
  const ScopedEnv v(kVar, "1x");
  test_support::expect_contains(test_support::error_of([] { env_number(kVar, 1.0); }),
                                {kVar, "must be a number", "'1x'"});
}

TEST(Env, CountTakesWholeNumbersFromItsMinimum) {
  {
    const ScopedEnv v(kVar, nullptr);
    EXPECT_EQ(env_count(kVar, 1, -1), -1);
  }
  {
    const ScopedEnv v(kVar, "");
    EXPECT_EQ(env_count(kVar, 1, 7), 7);
  }
  {
    const ScopedEnv v(kVar, "0");
    EXPECT_EQ(env_count(kVar, 0, -1), 0);
  }
  {
    const ScopedEnv v(kVar, "256");
    EXPECT_EQ(env_count(kVar, 1, -1), 256);
  }
  for (const char* bad : {"0", "-3", "8.5", "8 ", "x", "2000000000000"}) {
    SCOPED_TRACE(bad);
    const ScopedEnv v(kVar, bad);
    test_support::expect_contains(
        test_support::error_of([] { env_count(kVar, 1, -1, " (0: never)"); }),
        {kVar, "must be a whole number >= 1 (0: never)", std::string("'") + bad + "'"});
  }
}

}  // namespace
}  // namespace kiln
