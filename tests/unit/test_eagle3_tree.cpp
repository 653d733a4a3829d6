// EAGLE-3 tree drafting in the engine on the CPU backend (runtime/engine_tree.cpp; SpecOptions::tree): the
// random Qwen3 and drafts of test_eagle3_engine.cpp, with --speculative-eagle-topk K > 1.
//   - greedy tokens equal plain decoding at batch 1 and batched (mixed lengths, chunked prefill, prefix-cache
//     hits) for K = 2 and 3: token trees verified, nodes kept off the first branch (their KV moved to the
//     path's positions), drafts kept and rejected, a longer acceptance than the same draft's chain of the
//     tree's depth, the counters adding up per request and engine-wide, the pool exact afterwards;
//   - seeded sampling gives the same tokens alone and batched (each request's generator walks its own tree);
//   - rows with logit processing (a repetition penalty) draft nothing and draw as plain rows;
//   - the uniform tree batch of a tree graph (CPU runner asked as CUDA's is) gives plain decoding's tokens;
//   - the ragged verify rule chooses between the uniform and the ragged tree batch;
//   - trees verified by device draws (a CPU runner sampling as CUDA does) give plain decoding's draws, seeded
//     sampling included;
//   - the options: K, the depth and the node budget checked against the token-tree window.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>

#include "eagle3_engine_util.h"
#include "model/eagle3_model.h"
#include "runtime/fake_runner.h"
#include "runtime/qwen3_runner.h"
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

// The CPU Qwen3Runner taking token-tree verify steps as a CUDA tree graph takes them (every row its root and
// the budget's nodes, short trees filled with rows at slot -1, the batch padded to a power of two with causal
// sequences): the engine's uniform tree batch through the eager path.
// sample_on_host: forward_sampled draws as a device sampler does (draw_rows_on_host), so the engine takes its
// device paths (a tree's nodes drawn as the plain steps would draw them); a runner without a draft (o has
// none) is the plain reference of such a run.
class UniformTreeRunner : public Qwen3Runner {
 public:
  UniformTreeRunner(const EngineOptions& o, int32_t rows_per_seq, bool sample_on_host = false)
      : Qwen3Runner(Qwen3Model::load(o.model_dir, parse_qwen3_runner_settings(o).load), ops::KvLayout::nhd,
                    DType::bf16),
        rows_per_seq_(rows_per_seq),
        sample_on_host_(sample_on_host) {
    if (!o.speculative.draft_model_path.empty())
      set_draft(Eagle3Model::load(o.speculative.draft_model_path, model()));
  }
  using Qwen3Runner::forward_sampled;
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out, const std::function<void()>& before_sample) override {
    if (!sample_on_host_) return false;
    std::vector<float> logits;
    forward(batch, &logits, nullptr);
    if (before_sample) before_sample();
    draw_rows_on_host(logits, config().vocab_size, rows, top_n, out);
    ++sampled_steps;
    return true;
  }
  int sampled_steps = 0;
  int32_t verify_graph_bucket(int32_t num_seqs, int32_t rows_per_seq, int32_t, bool tree) const override {
    EXPECT_TRUE(tree) << "an EAGLE-3 tree engine asked for a chain's verify graph";
    EXPECT_EQ(rows_per_seq, rows_per_seq_);
    return int32_t(std::bit_ceil(uint32_t(num_seqs)));
  }
  void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) override {
    // A step with prompt rows (a mixed batch) runs ragged, as it would eagerly on CUDA.
    if (batch.has_tree() && is_uniform_verify(batch, rows_per_seq_)) {
      ++uniform_tree_steps;
      for (int32_t b = 0; b < batch.num_seqs(); ++b) {
        const int32_t r0 = batch.cu_q[size_t(b)], r1 = batch.cu_q[size_t(b) + 1];
        const auto written = std::count_if(batch.slot_mapping.begin() + r0, batch.slot_mapping.begin() + r1,
                                           [](int64_t s) { return s >= 0; });
        if (written == 0) ++padding_seqs;
        if (batch.tree_window[size_t(b)] > 0 && written > 0 && written < r1 - r0) ++filled_trees;
      }
    }
    Qwen3Runner::forward(batch, logits, hidden);
  }
  int uniform_tree_steps = 0, padding_seqs = 0, filled_trees = 0;

 private:
  int32_t rows_per_seq_;
  bool sample_on_host_;
};

TEST(Eagle3Tree, UniformTreeBatchEqualsPlainDecoding) {
  const auto prompts = mixed_prompts();
  // Batched: steps padded to their bucket; one at a time: every step uniform; the trees of requests near
  // their end (depth cut to the room) short of the budget.
  int padding_seqs = 0, filled_trees = 0;
  for (const bool one_at_a_time : {false, true}) {
    const std::string mode = one_at_a_time ? "batch 1" : "batched";
    // Odd requests end 3 tokens in: their one verify step has room for a tree of depth 1 (K nodes).
    const auto lengths = [](size_t i, Request& q) {
      if (i % 2 == 1) q.sampling.max_new_tokens = int32_t(3 + i % 4);
    };
    const Outputs plain = run(Engine::create(base_opts()), prompts, 20, one_at_a_time, 0.0f, lengths);
    const EngineOptions o = with_tree(base_opts(), draft_over_frequent_tokens(plain.tokens, 6), 3, 3, 6);
    auto runner = std::make_unique<UniformTreeRunner>(o, 7);
    const UniformTreeRunner& r = *runner;
    const Outputs got =
        run(std::make_unique<Engine>(std::move(runner), o), prompts, 20, one_at_a_time, 0.0f, lengths);
    EXPECT_EQ(got.tokens, plain.tokens) << mode;
    EXPECT_GT(r.uniform_tree_steps, 0) << mode;
    EXPECT_LE(r.uniform_tree_steps, got.stats.spec.tree_verify_steps) << mode;
    EXPECT_GT(got.stats.spec.accepted_tokens, 0) << mode;
    EXPECT_GT(got.stats.spec.tree_moved_tokens, 0) << mode;
    test::expect_request_sums(got, mode);
    padding_seqs += r.padding_seqs;
    filled_trees += r.filled_trees;
  }
  EXPECT_GT(padding_seqs, 0) << "no batch padded to its bucket";
  EXPECT_GT(filled_trees, 0) << "no tree short of the budget (fill rows untested)";
}

// The ragged verify rule holds for trees too (nodes against the graph's rows): with it always true every tree
// step runs ragged and is counted, with it off none does; plain decoding's greedy tokens either way.
TEST(Eagle3Tree, RaggedVerifyRuleChoosesTheTreeBatch) {
  const auto prompts = mixed_prompts();
  const Outputs plain = run(Engine::create(base_opts()), prompts, 20, false);
  for (const double factor : {0.0, 1e-6}) {
    EngineOptions o = with_tree(base_opts(), draft_over_frequent_tokens(plain.tokens, 6), 3, 3, 6);
    o.speculative.ragged_verify_factor = factor;
    o.speculative.ragged_verify_min_seqs = 1;
    auto runner = std::make_unique<UniformTreeRunner>(o, 7);
    const UniformTreeRunner& r = *runner;
    const Outputs got = run(std::make_unique<Engine>(std::move(runner), o), prompts, 20, false);
    const std::string mode = "factor " + std::to_string(factor);
    EXPECT_EQ(got.tokens, plain.tokens) << mode;
    EXPECT_GT(got.stats.spec.tree_verify_steps, 0) << mode;
    if (factor == 0.0) {
      EXPECT_EQ(got.stats.spec.ragged_verify_steps, 0) << mode;
      EXPECT_GT(r.uniform_tree_steps, 0) << mode;
    } else {
      EXPECT_GT(got.stats.spec.ragged_verify_steps, 0) << mode;
      EXPECT_EQ(r.padding_seqs, 0) << mode << ": a ragged step is never padded";
    }
  }
}

// Trees verified by device draws (runtime/engine_tree.cpp tree_row_sampling): each node draws the token after
// it as the plain step drawing that token would (the request's seed, step completion + depth), and the walk
// keeps the child equal to its parent's draw, so a seeded sampled request's tokens are plain decoding's own
// draws, bit for bit (the CPU's tree rows are its causal rows), alone and batched; greedy too.
TEST(Eagle3Tree, DeviceDrawnTreesGivePlainDecodingsDraws) {
  const auto prompts = mixed_prompts();
  const EngineOptions base = base_opts();
  for (const float temperature : {0.0f, 0.4f}) {
    const auto seeded = [&](size_t i, Request& r) {
      r.sampling.temperature = temperature;
      r.sampling.top_k = i % 2 ? 8 : -1;
      r.sampling.seed = int64_t(500 + i);
    };
    const Outputs plain =
        run(std::make_unique<Engine>(std::make_unique<UniformTreeRunner>(base, 7, true), base), prompts, 20,
            false, temperature, seeded);
    const EngineOptions o = with_tree(base, draft_over_frequent_tokens(plain.tokens, 6), 3, 3, 6);
    for (const bool one_at_a_time : {true, false}) {
      const std::string mode =
          std::string(one_at_a_time ? "batch 1" : "batched") + ", T " + std::to_string(temperature);
      auto runner = std::make_unique<UniformTreeRunner>(o, 7, true);
      const UniformTreeRunner& r = *runner;
      const Outputs got = run(std::make_unique<Engine>(std::move(runner), o), prompts, 20, one_at_a_time,
                              temperature, seeded);
      EXPECT_EQ(got.tokens, plain.tokens) << mode;
      EXPECT_GT(r.sampled_steps, 0) << mode;
      EXPECT_GT(r.uniform_tree_steps, 0) << mode;
      EXPECT_GT(got.stats.spec.tree_verify_steps, 0) << mode;
      EXPECT_GT(got.stats.spec.accepted_tokens, 0) << mode << ": no node kept, the kept path untested";
    }
  }
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
