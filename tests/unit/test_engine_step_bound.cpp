// The engine's time bound on steps (EngineOptions::max_prefill_chunk_ms): a long prompt is prefilled in
// steps whose size follows the measured prefill rate, so an abort or a shutdown is seen between steps of
// bounded length instead of after the whole prompt. FakeRunner's gate holds a step while the test acts, and
// its per-token sleep gives the model a known lower bound on its prefill time: the checks bound step sizes
// from above only, which a slower (loaded) machine can only make smaller.
#include <gtest/gtest.h>

#include <mutex>
#include <numeric>

#include "engine_test_util.h"
#include "runtime/fake_runner.h"

namespace kiln {
namespace {

using test::expect_pool_clean;
using test::greedy;
using test::prompt_of;
using test::Sink;
using test::small_opts;

TEST(EngineStepBound, AnAbortDuringALongPrefillEndsItAfterTheStepRunning) {
  auto model = std::make_unique<FakeRunner>(64);
  FakeRunner* m = model.get();
  EngineOptions o = small_opts(8192, 4, 4096);  // chunks of 4096 tokens: the prompt would be one step
  o.max_prefill_chunk_ms = 500;
  Engine engine(std::move(model), o);
  Sink sink;
  m->hold_steps();
  const RequestId id = engine.submit(greedy(prompt_of(3000, 1), 4), sink.cb());
  m->wait_until_held();  // the engine is inside its first step
  engine.abort(id);
  m->release_steps();
  sink.wait_finished(1);
  EXPECT_EQ(sink.last(id).finish_reason, "abort");
  EXPECT_TRUE(sink.tokens(id).empty()) << "the whole prompt was computed before the abort was seen";
  ASSERT_EQ(m->step_tokens.size(), 1u);
  EXPECT_LE(m->step_tokens[0], 128);  // the first step's probe
  expect_pool_clean(engine);
}

TEST(EngineStepBound, PrefillStepsFollowTheMeasuredRateAndOutputsAreUnchanged) {
  auto model = std::make_unique<FakeRunner>(64);
  FakeRunner* m = model.get();
  m->ms_per_prefill_token = 0.25;  // at most 4 prefill tokens per millisecond
  EngineOptions o = small_opts(8192, 4, 4096);
  o.max_prefill_chunk_ms = 20;  // so at most 80 tokens a step once the rate is measured
  Engine engine(std::move(model), o);
  Sink sink;
  const std::vector<int32_t> prompt = prompt_of(1200, 2);
  const RequestId id = engine.submit(greedy(prompt, 6), sink.cb());
  sink.wait_finished(1);
  EXPECT_EQ(sink.last(id).finish_reason, "length");
  EXPECT_EQ(sink.tokens(id), FakeRunner(64).reference(prompt, 6, false));
  ASSERT_GE(m->step_tokens.size(), 2u);
  EXPECT_LE(m->step_tokens[0], 128);
  for (size_t i = 1; i < m->step_tokens.size(); ++i) EXPECT_LE(m->step_tokens[i], 80) << "step " << i;
  EXPECT_EQ(std::accumulate(m->step_tokens.begin(), m->step_tokens.end(), 0), 1200 + 5);  // + 5 decode steps
  expect_pool_clean(engine);
}

TEST(EngineStepBound, AShortRequestIsNotHeldBackUntilALongPromptIsPrefilled) {
  auto model = std::make_unique<FakeRunner>(64);
  FakeRunner* m = model.get();
  Engine engine(std::move(model), small_opts(8192, 4, 64));  // 2000 tokens: 32 chunks of 64
  std::mutex mu;
  std::vector<RequestId> finished;  // in the order they ended
  auto cb = [&](const TokenEvent& e) {
    std::lock_guard<std::mutex> lk(mu);
    if (e.finished) finished.push_back(e.id);
  };
  m->hold_steps();
  const RequestId long_id = engine.submit(greedy(prompt_of(2000, 4), 1), cb);
  m->wait_until_held();  // the long prompt's first chunk is running
  const RequestId short_id = engine.submit(greedy(prompt_of(3, 5), 1), cb);
  m->release_steps();
  engine.shutdown(true);
  ASSERT_EQ(finished, (std::vector<RequestId>{short_id, long_id}));
  // The short request ran in the second step, beside the long prompt's second chunk (half the budget each).
  ASSERT_GE(m->step_tokens.size(), 3u);
  EXPECT_EQ(m->step_tokens[0], 64);
  EXPECT_EQ(m->step_tokens[1], 32 + 3);
}

TEST(EngineStepBound, OffTheWholeChunkRunsInOneStep) {
  auto model = std::make_unique<FakeRunner>(64);
  FakeRunner* m = model.get();
  EngineOptions o = small_opts(8192, 4, 4096);
  o.max_prefill_chunk_ms = 0;
  Engine engine(std::move(model), o);
  Sink sink;
  engine.submit(greedy(prompt_of(3000, 3), 1), sink.cb());
  sink.wait_finished(1);
  ASSERT_EQ(m->step_tokens.size(), 1u);
  EXPECT_EQ(m->step_tokens[0], 3000);
  EXPECT_THROW(
      [] {
        EngineOptions bad = small_opts(64);
        bad.max_prefill_chunk_ms = -2;
        Engine e(std::make_unique<FakeRunner>(64), bad);
      }(),
      Error);
}

}  // namespace
}  // namespace kiln
