// EAGLE-3 tree drafting in the engine on the CPU backend (runtime/engine_tree.cpp; SpecOptions::tree): the
// random Qwen3 and drafts of test_eagle3_engine.cpp, with --speculative-eagle-topk K > 1.
//   - greedy tokens equal plain decoding at batch 1 and batched (mixed lengths, chunked prefill, prefix-cache
//     hits) for K = 2 and 3: token trees verified, nodes kept off the first branch (their KV moved to the
//     path's positions), drafts kept and rejected, a longer acceptance than the same draft's chain of the
//     tree's depth, the counters adding up per request and engine-wide, the pool exact afterwards;
//   - seeded sampling gives the same tokens alone and batched (each request's generator walks its own tree);
//   - rows with logit processing (a repetition penalty) draft nothing and draw as plain rows;
//   - the options: K, the depth and the node budget checked against the token-tree window.
#include <gtest/gtest.h>

#include "eagle3_engine_util.h"
#include "spec/spec_options.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::base_opts;
using test::draft_over_frequent_tokens;
using test::mixed_prompts;
using test::Outputs;
using test::run;
using test::with_eagle;

EngineOptions with_tree(EngineOptions o, const fs::path& draft, int topk, int steps, int nodes) {
  o = with_eagle(std::move(o), draft, nodes, false);
  o.speculative.eagle_topk = topk;
  o.speculative.eagle_steps = steps;
  return o;
}

TEST(Eagle3Tree, GreedyTokensEqualPlainDecoding) {
  const auto prompts = mixed_prompts();
  for (const bool one_at_a_time : {true, false}) {
    const Outputs plain = run(Engine::create(base_opts()), prompts, 20, one_at_a_time);
    const fs::path draft = draft_over_frequent_tokens(plain.tokens, 6);
    // The chain of the same depth from the same draft, for the acceptance lengths beside the trees'.
    const Outputs chain =
        run(Engine::create(with_eagle(base_opts(), draft, 3, false)), prompts, 20, one_at_a_time);
    EXPECT_EQ(chain.tokens, plain.tokens);
    for (const int topk : {2, 3}) {
      const Outputs got =
          run(Engine::create(with_tree(base_opts(), draft, topk, 3, 6)), prompts, 20, one_at_a_time);
      const std::string mode =
          std::string(one_at_a_time ? "batch 1" : "batched") + ", K " + std::to_string(topk);
      EXPECT_EQ(got.tokens, plain.tokens) << mode;
      const spec::SpecStats& st = got.stats.spec;
      EXPECT_GT(st.tree_verify_steps, 0) << mode;
      EXPECT_EQ(st.tree_verify_steps, st.verify_steps) << mode << ": every verify step takes a tree";
      EXPECT_GT(st.accepted_tokens, 0) << mode << ": " << st.draft_tokens << " drafted";
      EXPECT_LT(st.accepted_tokens, st.draft_tokens) << mode;
      EXPECT_LE(st.draft_tokens, 6 * st.drafts) << mode << ": at most the budget's nodes a tree";
      EXPECT_GT(st.draft_tokens, 3 * st.drafts) << mode << ": trees wider than the chain of their depth";
      EXPECT_GT(st.tree_moved_tokens, 0) << mode << ": no kept node came off the first branch";
      EXPECT_LE(st.accepted_tokens, 3 * st.drafts) << mode << ": at most the depth kept a tree";
      test::expect_request_sums(got, mode);
      if (one_at_a_time) {
        EXPECT_LT(got.stats.steps, plain.stats.steps) << mode;
        EXPECT_GT(got.cached[4], 0) << "prompt 4 shares 12 tokens with prompt 0";
      }
      std::printf(
          "%s: %lld steps plain, %lld with trees; %lld of %lld drafted nodes kept (acceptance length "
          "%.2f; the chain's %.2f), %lld moved\n",
          mode.c_str(), (long long)plain.stats.steps, (long long)got.stats.steps,
          (long long)st.accepted_tokens, (long long)st.draft_tokens, st.mean_acceptance_length(),
          chain.stats.spec.mean_acceptance_length(), (long long)st.tree_moved_tokens);
    }
  }
}

TEST(Eagle3Tree, SeededSamplingIsIndependentOfTheBatch) {
  const auto prompts = mixed_prompts();
  const Outputs plain = run(Engine::create(base_opts()), prompts, 20, true);
  const EngineOptions o = with_tree(base_opts(), draft_over_frequent_tokens(plain.tokens, 6), 3, 3, 8);
  const Outputs alone = run(Engine::create(o), prompts, 20, true, 0.3f);
  const Outputs batched = run(Engine::create(o), prompts, 20, false, 0.3f);
  EXPECT_EQ(alone.tokens, batched.tokens);
  EXPECT_GT(alone.stats.spec.tree_verify_steps, 0);
  EXPECT_GT(alone.stats.spec.accepted_tokens, 0);
}

// A row with logit processing drafts nothing (its processing would have to follow every path) and draws as a
// plain row in the tree steps of the others: the outputs are plain decoding's, penalties and all.
TEST(Eagle3Tree, RowsWithLogitProcessingDrawAsPlainRows) {
  const auto prompts = mixed_prompts();
  const auto penalize = [](size_t i, Request& r) {
    if (i % 2 == 1) r.sampling.repetition_penalty = 1.3f;
  };
  const Outputs plain = run(Engine::create(base_opts()), prompts, 20, false, 0.0f, penalize);
  const EngineOptions o = with_tree(base_opts(), draft_over_frequent_tokens(plain.tokens, 6), 3, 3, 6);
  const Outputs got = run(Engine::create(o), prompts, 20, false, 0.0f, penalize);
  EXPECT_EQ(got.tokens, plain.tokens);
  EXPECT_GT(got.stats.spec.tree_verify_steps, 0);
  for (size_t i = 1; i < prompts.size(); i += 2) EXPECT_EQ(got.spec[i].draft_tokens, 0) << "request " << i;
}

TEST(Eagle3Tree, OptionsFitTheTokenTreeWindow) {
  spec::SpecOptions o;
  o.algorithm = spec::SpecAlgorithm::eagle3;
  o.draft_model_path = "/d";
  o.eagle_topk = 4;
  o.eagle_steps = 3;
  o.num_draft_tokens = 12;
  EXPECT_TRUE(o.tree());
  EXPECT_NO_THROW(spec::validate_spec_options(o));
  const auto refused = [](spec::SpecOptions bad, const char* what) {
    try {
      spec::validate_spec_options(bad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  spec::SpecOptions b = o;
  b.num_draft_tokens = 64;  // 65 rows with the root: past the window
  refused(b, "--speculative-num-draft-tokens");
  b = o;
  b.eagle_topk = 2;
  b.eagle_steps = 2;
  b.num_draft_tokens = 7;  // 2 + 1 x 4 = 6 nodes grown at most
  refused(b, "K + (S - 1) K^2");
  b = o;
  b.eagle_topk = 9;
  b.eagle_steps = 9;  // 9 x 8 = 72 expanded entries
  refused(b, "64 a token-tree window holds");
  b = o;
  b.eagle_steps = 0;
  refused(b, "--speculative-num-steps");
  b = o;
  b.eagle_topk = 17;
  refused(b, "--speculative-eagle-topk");
  b = o;
  b.algorithm = spec::SpecAlgorithm::ngram;
  refused(b, "is for --speculative-algorithm EAGLE3");
}

}  // namespace
}  // namespace kiln
