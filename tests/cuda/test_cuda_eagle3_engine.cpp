// EAGLE-3 on CUDA through the engine: greedy outputs with EAGLE-3 equal plain greedy decoding (batch 1:
// tokens and log-probs bit for bit on the bitwise verify path; batched: but for near ties of the plain path's
// top two), with drafts kept, with every draft rejected, and with the draft's chain passes in CUDA graphs;
// every request runs to its length and no draft pass fails; tree drafting (--speculative-eagle-topk 3) the
// same but for near ties, and refused by name unless KILN_EAGLE3_TREE_CUDA=1. (test_cuda_eagle3: the same
// stages below the engine.)
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>

#include "../unit/engine_test_util.h"
#include "bitwise_verify.h"
#include "eagle3_cuda_util.h"
#include "greedy_parity_util.h"
#include "model/eagle3_model.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<int32_t>> prompts(int count, int min_len, int spread) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < min_len + (i * 13) % spread; ++j) p.push_back(int32_t(rng() % 500));
    out.push_back(p);
  }
  return out;
}

using test::Generated;

// draft_graphs: the draft's chain and extend graphs the runner captured, out ([2]).
Generated generate(const EngineOptions& o, const std::vector<std::vector<int32_t>>& ps, const fs::path& draft,
                   bool with_top, std::vector<std::vector<float>>* logprobs = nullptr,
                   int* draft_graphs = nullptr, int* decode_graphs = nullptr) {
  auto runner =
      std::make_unique<Qwen3Runner>(test::eagle3_target(Device::cuda()), ops::KvLayout::hnd, DType::bf16);
  if (!draft.empty()) runner->set_draft(Eagle3Model::load(draft.string(), runner->model()));
  const Qwen3Runner& r = *runner;
  Engine engine(std::move(runner), o);
  Generated out = test::generate_greedy(engine, ps, 32, with_top, /*ignore_eos=*/true, logprobs);
  out.verify_graphs = int(r.verify_graph_replays());
  if (draft_graphs) {
    draft_graphs[0] = r.num_draft_chain_graphs();
    draft_graphs[1] = r.num_draft_extend_graphs();
  }
  if (decode_graphs) *decode_graphs = r.num_graphs();
  return out;
}

// Each prompt alone through its own engine: the tokens and finishes in order, the spec counters summed, the
// graph counts their maxima (draft_graphs [2] and decode_graphs when given).
Generated generate_each(const EngineOptions& o, const std::vector<std::vector<int32_t>>& ps,
                        const fs::path& draft, int* draft_graphs = nullptr, int* decode_graphs = nullptr) {
  Generated got;
  for (const auto& p : ps) {
    int n[2] = {0, 0};
    const Generated one = generate(o, {p}, draft, false, nullptr, n, decode_graphs);
    if (draft_graphs)
      for (int g = 0; g < 2; ++g) draft_graphs[g] = std::max(draft_graphs[g], n[g]);
    got.tokens.push_back(one.tokens[0]);
    got.finish.push_back(one.finish[0]);
    spec::SpecStats& st = got.stats.spec;
    const spec::SpecStats& add = one.stats.spec;
    st.drafts += add.drafts;
    st.draft_tokens += add.draft_tokens;
    st.accepted_tokens += add.accepted_tokens;
    st.draft_passes += add.draft_passes;
    st.uniform_draft_passes += add.uniform_draft_passes;
    st.tree_verify_steps += add.tree_verify_steps;
    st.draft_failures += add.draft_failures;
    got.verify_graphs = std::max(got.verify_graphs, one.verify_graphs);
  }
  return got;
}

// Loads a draft of the tests' shape once: its GEMM shapes are tuned then (Eagle3Model::load), before any
// plain reference runs, so every run of the process takes the same tactics.
void tune_draft_shapes() {
  static const bool done = [] {
    const fs::path dir = test::eagle3_scratch() / "draft_tune";
    test::write_eagle3_draft(dir, test::eagle3_draft_shape(2, false), "", {1, 2}, 3);
    auto target = test::eagle3_target(Device::cuda());
    return Eagle3Model::load(dir.string(), *target) != nullptr;
  }();
  EXPECT_TRUE(done);
}

EngineOptions plain_opts() {
  EngineOptions o = test::small_opts(8192, 16, 256);
  o.device = "cuda";
  o.cuda_graph_buckets = {1, 2, 4, 8};
  return o;
}

EngineOptions eagle_opts(const fs::path& draft) {
  EngineOptions o = plain_opts();
  o.speculative.algorithm = spec::SpecAlgorithm::eagle3;
  o.speculative.draft_model_path = draft.string();
  o.speculative.num_draft_tokens = 3;
  o.speculative.off_switch = false;
  return o;
}

// Two target ids that no plain output holds: a draft proposing only them has every draft rejected.
std::vector<int64_t> absent_tokens(const Generated& want) {
  std::set<int32_t> seen;
  for (const auto& t : want.tokens) seen.insert(t.begin(), t.end());
  std::vector<int64_t> out;
  for (int32_t t = 0; t < 500 && out.size() < 2; ++t)
    if (!seen.count(t)) out.push_back(t);
  return out;
}

// Every request ran to its length (a failed step would end it early with an error, which a token comparison
// alone reads as a parting), no draft pass failed, and the counts are printed.
void expect_clean_run(const Generated& got, const std::string& label) {
  for (size_t i = 0; i < got.finish.size(); ++i)
    EXPECT_EQ(got.finish[i], "length") << label << ": request " << i;
  const spec::SpecStats& st = got.stats.spec;
  EXPECT_EQ(st.draft_failures, 0) << label << ": EAGLE-3 draft passes failed";
  std::printf("%s: %lld drafts, %lld of %lld drafted tokens kept, %lld draft passes (%lld failed)\n",
              label.c_str(), (long long)st.drafts, (long long)st.accepted_tokens, (long long)st.draft_tokens,
              (long long)st.draft_passes, (long long)st.draft_failures);
}

// Batch 1 on the bitwise verify path (4 rows a verify step; contexts within 64 keys, one decode split, so
// the eager verify batches of the last steps round as the graphs do: test_cuda_verify_graph's
// GreedyNgramLogprobsBitwisePlainBatch1): EAGLE-3's greedy tokens and log-probs (each token's and the top 2)
// are plain decoding's bit for bit, with drafts kept and rejected.
TEST(CudaEagle3Engine, GreedyEagle3LogprobsBitwisePlainBatch1) {
  KILN_REQUIRE_GPU();
  const test::ScopedEnv eagle3_on("KILN_EAGLE3_CUDA", "1");
  tune_draft_shapes();
  const test::BitwiseVerify bitwise;
  const auto ps = prompts(4, 5, 20);
  EngineOptions base = plain_opts();
  base.sampling_backend = "cpu";  // log-probs from the host's logits on both paths
  std::vector<Generated> want(ps.size());
  std::vector<std::vector<std::vector<float>>> want_lp(ps.size());
  std::vector<std::vector<int32_t>> all;
  for (size_t i = 0; i < ps.size(); ++i) {
    want[i] = generate(base, {ps[i]}, {}, true, &want_lp[i]);
    all.push_back(want[i].tokens[0]);
  }
  const fs::path draft = test::eagle3_scratch() / "draft_bitwise";
  test::write_eagle3_draft(draft, test::eagle3_draft_shape(2, false), "", test::frequent_tokens(all, 2), 3);
  EngineOptions eo = eagle_opts(draft);
  eo.sampling_backend = "cpu";
  spec::SpecStats total;
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    std::vector<std::vector<float>> got_lp;
    const Generated got = generate(eo, {ps[i]}, draft, true, &got_lp);
    expect_clean_run(got, "batch 1, request " + std::to_string(i));
    total.drafts += got.stats.spec.drafts;
    total.accepted_tokens += got.stats.spec.accepted_tokens;
    total.draft_tokens += got.stats.spec.draft_tokens;
    EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
    const auto& a = got.tokens[0];
    const auto& b = want[i].tokens[0];
    size_t j = 0;
    while (j < a.size() && j < b.size() && a[j] == b[j]) ++j;
    ASSERT_EQ(a, b) << "parts at token " << j;
    ASSERT_EQ(got_lp[0].size(), want_lp[i][0].size());
    for (size_t t = 0; t < got_lp[0].size(); ++t)
      EXPECT_EQ(std::bit_cast<uint32_t>(got_lp[0][t]), std::bit_cast<uint32_t>(want_lp[i][0][t]))
          << "token " << t << ": log-prob " << got_lp[0][t] << " vs plain " << want_lp[i][0][t];
    ASSERT_EQ(got.top[0].size(), want[i].top[0].size());
    for (size_t t = 0; t < got.top[0].size(); ++t)
      for (size_t k = 0; k < got.top[0][t].size() && k < want[i].top[0][t].size(); ++k) {
        EXPECT_EQ(got.top[0][t][k].id, want[i].top[0][t][k].id) << "token " << t << " top " << k;
        EXPECT_EQ(std::bit_cast<uint32_t>(got.top[0][t][k].logprob),
                  std::bit_cast<uint32_t>(want[i].top[0][t][k].logprob))
            << "token " << t << " top " << k;
      }
  }
  EXPECT_GT(total.drafts, 0) << "nothing drafted";
  EXPECT_GT(total.accepted_tokens, 0) << "no draft kept: the kept path went untested";
  EXPECT_LT(total.accepted_tokens, total.draft_tokens) << "no draft rejected: the rollback went untested";
}

// The engine's greedy output with EAGLE-3 (features captured inside the decode and verify graphs) against its
// plain greedy output, batch 1 and batched (mixed prompt lengths, k = 3), on the default verify path (its own
// GEMM tactics: partings only where the plain path's top two are a near tie); with a draft of the outputs'
// frequent tokens (drafts kept and rejected), with one of tokens no output holds (every draft rejected: the
// verify path and the draft passes alone, no kept draft), and with the first draft's chains and passes after
// verify steps replayed from graphs (KILN_EAGLE3_DRAFT_GRAPHS=1; the other modes set it to 0, whatever the
// default).
TEST(CudaEagle3Engine, GreedyEagle3EqualsPlainGreedy) {
  KILN_REQUIRE_GPU();
  const test::ScopedEnv eagle3_on("KILN_EAGLE3_CUDA", "1");
  tune_draft_shapes();
  const auto ps = prompts(8, 5, 40);
  const Generated want = generate(plain_opts(), ps, {}, true);
  enum class Mode { kept, rejected, draft_graphs };
  for (const Mode mode : {Mode::kept, Mode::rejected, Mode::draft_graphs}) {
    const bool rejected = mode == Mode::rejected;
    const fs::path draft = test::eagle3_scratch() / (rejected ? "draft_rejected" : "draft_top");
    test::write_eagle3_draft(draft, test::eagle3_draft_shape(2, false), "",
                             rejected ? absent_tokens(want) : test::frequent_tokens(want.tokens, 2), 3);
    const EngineOptions eo = eagle_opts(draft);
    const test::ScopedEnv graphs("KILN_EAGLE3_DRAFT_GRAPHS", mode == Mode::draft_graphs ? "1" : "0");
    for (const bool batched : {false, true}) {
      const std::string label = std::string(batched ? "batched" : "batch 1") +
                                (rejected             ? ", drafts rejected"
                                 : mode == Mode::kept ? ", drafts kept"
                                                      : ", drafts kept, draft graphs");
      SCOPED_TRACE(label);
      Generated got;
      int draft_graphs[2] = {0, 0}, decode_graphs = 0;  // chain, extend
      if (batched) {
        got = generate(eo, ps, draft, false, nullptr, draft_graphs, &decode_graphs);
      } else {
        got = generate_each(eo, ps, draft, draft_graphs, &decode_graphs);
      }
      expect_clean_run(got, label);
      const int parted = test::count_near_tie_partings(got, want, label);
      std::printf("%s: %d of %zu requests part at a near tie; %d chain and %d extend graphs\n", label.c_str(),
                  parted, ps.size(), draft_graphs[0], draft_graphs[1]);
      const spec::SpecStats& st = got.stats.spec;
      EXPECT_GT(st.drafts, 0) << "nothing drafted";
      if (rejected) {
        EXPECT_EQ(st.accepted_tokens, 0) << "a draft of tokens no plain output holds was kept";
      } else {
        EXPECT_GT(st.accepted_tokens, 0);
        EXPECT_LT(st.accepted_tokens, st.draft_tokens);
      }
      EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
      if (mode == Mode::draft_graphs) {
        EXPECT_GT(draft_graphs[0], 0) << "no chain pass replayed a graph";
        EXPECT_GT(draft_graphs[1], 0) << "no pass after a verify step replayed a graph";
        // One q (k + 1) per (bucket, width): a prompt's last chunk, of its own length, takes no graph.
        EXPECT_LE(draft_graphs[1], decode_graphs) << "extend graphs beyond one per bucket and width";
        EXPECT_GT(st.uniform_draft_passes, 0) << "no uniform pass after a verify step (the extend graphs)";
      } else {
        EXPECT_EQ(draft_graphs[0] + draft_graphs[1], 0) << "draft graphs with KILN_EAGLE3_DRAFT_GRAPHS=0";
        EXPECT_EQ(st.uniform_draft_passes, 0) << "uniform passes with KILN_EAGLE3_DRAFT_GRAPHS=0";
      }
    }
  }
}

// Tree drafting on CUDA (--speculative-eagle-topk 3, 3 levels, 6 nodes; KILN_EAGLE3_TREE_CUDA=1 while it has
// not run on a GPU): the token-tree verify steps replay tree graphs (the runner captures no chain verify
// graphs then, so its verify replays are the trees'), the kept nodes' KV moves, and greedy outputs equal
// plain greedy decoding but for near ties of the plain path's top two; off by default, refused by name.
TEST(CudaEagle3Engine, TreeGreedyEqualsPlainGreedy) {
  KILN_REQUIRE_GPU();
  const test::ScopedEnv eagle3_on("KILN_EAGLE3_CUDA", "1");
  tune_draft_shapes();
  const auto ps = prompts(8, 5, 40);
  const Generated want = generate(plain_opts(), ps, {}, true);
  const fs::path draft = test::eagle3_scratch() / "draft_tree";
  test::write_eagle3_draft(draft, test::eagle3_draft_shape(4, false), "",
                           test::frequent_tokens(want.tokens, 4), 3);
  EngineOptions eo = eagle_opts(draft);
  eo.speculative.eagle_topk = 3;
  eo.speculative.eagle_steps = 3;
  eo.speculative.num_draft_tokens = 6;
  {
    const test::ScopedEnv off("KILN_EAGLE3_TREE_CUDA", "0");
    try {
      generate(eo, {ps[0]}, draft, false);
      ADD_FAILURE() << "tree drafting ran on CUDA with KILN_EAGLE3_TREE_CUDA=0";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_EAGLE3_TREE_CUDA=1"), std::string::npos) << e.what();
    }
  }
  const test::ScopedEnv on("KILN_EAGLE3_TREE_CUDA", "1");
  for (const bool batched : {false, true}) {
    const std::string label = batched ? "trees, batched" : "trees, batch 1";
    SCOPED_TRACE(label);
    Generated got;
    if (batched) {
      got = generate(eo, ps, draft, false);
    } else {
      got = generate_each(eo, ps, draft);
    }
    expect_clean_run(got, label);
    const int parted = test::count_near_tie_partings(got, want, label);
    std::printf("%s: %d of %zu requests part at a near tie; %lld tree verify steps\n", label.c_str(), parted,
                ps.size(), (long long)got.stats.spec.tree_verify_steps);
    EXPECT_GT(got.stats.spec.tree_verify_steps, 0);
    EXPECT_GT(got.verify_graphs, 0) << "no token-tree step replayed a tree graph";
    EXPECT_GT(got.stats.spec.accepted_tokens, 0);
    EXPECT_LT(got.stats.spec.accepted_tokens, got.stats.spec.draft_tokens);
  }
}

}  // namespace
}  // namespace kiln
