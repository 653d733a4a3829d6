// Prompt log-probabilities and scores through the engine on the CPU model (runtime/prompt_logprobs.h),
// checked against an independent oracle: one prefill of the whole prompt with every row's logits, and
// log-softmax in double here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/prompt_logits.h"
#include "common/test_support.h"
#include "engine_test_util.h"
#include "model/qwen3.h"
#include "runtime/model_runner.h"
#include "runtime/prompt_logprobs.h"
#include "runtime/qwen3_runner.h"

namespace kiln {
namespace {

using test::Sink;

const char* kTinyConfig = R"({
  "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 16,
  "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 4096,
  "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false, "vocab_size": 997})";

ModelConfig tiny_config() {
  return parse_model_config(kTinyConfig, "tiny config");
}

std::unique_ptr<Qwen3Model> tiny_model() {
  LoadOptions lo;
  lo.seed = 11;
  return Qwen3Model::create(tiny_config(), nullptr, lo);
}

std::unique_ptr<Engine> tiny_engine(int chunk, bool prefix_cache = true) {
  EngineOptions o = test::small_opts(4096, 4, chunk);
  o.enable_prefix_cache = prefix_cache;
  o.max_prompt_logprob_tokens = 200;
  return std::make_unique<Engine>(
      std::make_unique<Qwen3Runner>(tiny_model(), ops::KvLayout::nhd, DType::bf16), o);
}

std::vector<float> oracle_logits(const std::vector<int32_t>& prompt) {
  return test::every_row_logits(*tiny_model(), prompt, 4);
}

double log_softmax_at(const float* x, int64_t V, int32_t id) {
  return test_support::log_softmax(x, V)[size_t(id)];
}

std::vector<int32_t> test_prompt(int n, int salt) {
  std::vector<int32_t> p;
  uint32_t r = uint32_t(salt);
  for (int i = 0; i < n; ++i) p.push_back(int32_t((r = r * 1664525u + 1013904223u) >> 9) % 997);
  return p;
}

Request asking(const std::vector<int32_t>& prompt, int32_t from, int32_t top, int new_tokens) {
  Request r = test::greedy(prompt, new_tokens);
  r.prompt_logprobs_from = from;
  r.prompt_top_logprobs = top;
  return r;
}

// The engine's answers against the oracle: each position's logprob, rank and top list.
void expect_matches_oracle(const std::vector<int32_t>& prompt, int32_t from, int32_t top,
                           const std::vector<PromptTokenLogprob>& got) {
  const std::vector<float> logits = oracle_logits(prompt);
  const int64_t V = tiny_config().vocab_size;
  const int32_t first = std::max(1, from);
  ASSERT_EQ(got.size(), prompt.size() - size_t(first));
  for (size_t k = 0; k < got.size(); ++k) {
    const int32_t p = first + int32_t(k);
    const float* x = logits.data() + size_t(p - 1) * size_t(V);
    const PromptTokenLogprob& g = got[k];
    EXPECT_EQ(g.position, p);
    EXPECT_EQ(g.id, prompt[size_t(p)]);
    EXPECT_NEAR(g.logprob, log_softmax_at(x, V, prompt[size_t(p)]), 1e-4) << "position " << p;
    int32_t rank = 1;
    for (int64_t i = 0; i < V; ++i) rank += x[i] > x[prompt[size_t(p)]];
    EXPECT_EQ(g.rank, rank) << "position " << p;
    ASSERT_EQ(int(g.top.size()), top);
    for (int j = 0; j < top; ++j) {
      EXPECT_NEAR(g.top[size_t(j)].logprob, log_softmax_at(x, V, g.top[size_t(j)].id), 1e-4);
      if (j > 0) {
        EXPECT_GE(x[g.top[size_t(j - 1)].id], x[g.top[size_t(j)].id]);
      }
    }
    if (top > 0) {
      EXPECT_EQ(x[g.top[0].id], *std::max_element(x, x + V));
    }
  }
}

TEST(EnginePromptLogprobs, EqualTheOracleUnderChunkedPrefill) {
  auto e = tiny_engine(/*chunk=*/8);  // 45 prompt tokens over six steps
  const std::vector<int32_t> prompt = test_prompt(45, 3);
  Sink sink;
  const RequestId id = e->submit(asking(prompt, 0, 3, 2), sink.cb());
  sink.wait_finished(1);
  std::lock_guard<std::mutex> lk(sink.mu);
  const auto& evs = sink.events[id];
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().finish_reason, "length");
  expect_matches_oracle(prompt, 0, 3, evs.front().prompt_logprobs);
  for (size_t i = 1; i < evs.size(); ++i) EXPECT_TRUE(evs[i].prompt_logprobs.empty()) << "sent once";
}

TEST(EnginePromptLogprobs, FromAPositionGivesOnlyTheRest) {
  auto e = tiny_engine(64);
  const std::vector<int32_t> prompt = test_prompt(30, 5);
  Sink sink;
  const RequestId id = e->submit(asking(prompt, 17, 0, 1), sink.cb());
  sink.wait_finished(1);
  std::lock_guard<std::mutex> lk(sink.mu);
  expect_matches_oracle(prompt, 17, 0, sink.events[id].front().prompt_logprobs);
}

// A prompt whose pages are in the prefix cache is computed again from the first asked row: before the
// cache limit, the second request got only the uncached tail's positions.
TEST(EnginePromptLogprobs, CachedPrefixIsRecomputedForAskedRows) {
  auto e = tiny_engine(64);
  const std::vector<int32_t> prompt = test_prompt(37, 9);
  Sink sink;
  const RequestId warm = e->submit(test::greedy(prompt, 1), sink.cb());
  sink.wait_finished(1);
  const RequestId id = e->submit(asking(prompt, 0, 1, 1), sink.cb());
  sink.wait_finished(2);
  (void)warm;
  const TokenEvent last = sink.last(id);
  EXPECT_EQ(last.cached_tokens, 0);
  expect_matches_oracle(prompt, 0, 1, last.prompt_logprobs);
  // From position 20 on: the cache may serve the first 19 tokens (whole pages: 16).
  const RequestId tail = e->submit(asking(prompt, 20, 0, 1), sink.cb());
  sink.wait_finished(3);
  EXPECT_EQ(sink.last(tail).cached_tokens, 16);
  expect_matches_oracle(prompt, 20, 0, sink.last(tail).prompt_logprobs);
  test::expect_pool_clean(*e);
}

TEST(EnginePromptLogprobs, ScoreIdsAreTheLastRowsLogprobs) {
  auto e = tiny_engine(16);
  const std::vector<int32_t> prompt = test_prompt(23, 4);
  Sink sink;
  Request r = test::greedy(prompt, 0);
  r.score_ids = {7, 400, 996};
  const RequestId id = e->submit(r, sink.cb());
  sink.wait_finished(1);
  const TokenEvent last = sink.last(id);
  EXPECT_TRUE(last.ids.empty());
  const std::vector<float> logits = oracle_logits(prompt);
  const int64_t V = tiny_config().vocab_size;
  const float* x = logits.data() + (prompt.size() - 1) * size_t(V);
  ASSERT_EQ(last.score_logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(last.score_logprobs[i], log_softmax_at(x, V, r.score_ids[i]), 1e-4);
  // The reranker's score sigmoid(logit(yes) - logit(no)) is the same from logprobs.
  const double want = 1.0 / (1.0 + std::exp(-(double(x[400]) - double(x[7]))));
  const double got = 1.0 / (1.0 + std::exp(-(double(last.score_logprobs[1]) - last.score_logprobs[0])));
  EXPECT_NEAR(got, want, 1e-5);
}

TEST(EnginePromptLogprobs, BatchedWithOtherRequestsAndGenerationUnchanged) {
  auto e = tiny_engine(16);
  const std::vector<int32_t> a = test_prompt(21, 1), b = test_prompt(34, 2);
  Sink sink;
  const RequestId plain = e->submit(test::greedy(b, 6), sink.cb());
  const RequestId asked = e->submit(asking(a, 0, 2, 6), sink.cb());
  const RequestId plain_a = e->submit(test::greedy(a, 6), sink.cb());
  sink.wait_finished(3);
  EXPECT_EQ(sink.tokens(asked), sink.tokens(plain_a)) << "asking prompt logprobs changes no output";
  std::lock_guard<std::mutex> lk(sink.mu);
  expect_matches_oracle(a, 0, 2, sink.events[asked].front().prompt_logprobs);
  EXPECT_TRUE(sink.events[plain].front().prompt_logprobs.empty());
}

TEST(EnginePromptLogprobs, LimitsAreRefusedNamingThem) {
  auto e = tiny_engine(16);
  Sink sink;
  try {
    e->submit(asking(test_prompt(300, 1), 0, 0, 1), sink.cb());
    FAIL() << "over the limit";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("max_prompt_logprob_tokens = 200"), std::string::npos)
        << err.what();
  }
  EXPECT_NO_THROW(e->submit(asking(test_prompt(300, 1), 100, 0, 1), sink.cb()));  // 200 positions asked
  EXPECT_THROW(e->submit(asking(test_prompt(10, 1), 0, 21, 1), sink.cb()), Error);
  Request r = test::greedy(test_prompt(10, 1), 0);
  r.score_ids = {997};
  EXPECT_THROW(e->submit(r, sink.cb()), Error);
  sink.wait_finished(1);
}

TEST(RowLogprobs, HostReferenceOnASmallRow) {
  const std::vector<float> x = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  const RowLogprobs r = row_logprobs(x, {0, 2}, 3);
  double s = 0;
  for (float v : x) s += std::exp(double(v));
  EXPECT_NEAR(r.logprobs[0], 1.0 - std::log(s), 1e-6);
  EXPECT_EQ(r.ranks[0], 3);
  EXPECT_EQ(r.ranks[1], 1);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 1);  // ties by lowest id
  EXPECT_EQ(r.top[1].id, 2);
  EXPECT_EQ(r.top[2].id, 0);
}

}  // namespace
}  // namespace kiln
