// Verify steps of speculative decoding in CUDA graphs (model/cuda_graph.h, runtime/qwen3_runner.h): a graph
// per (bucket, k + 1) replays uniform verify steps (every sequence k + 1 positions, short rows filled with
// slot -1 rows, padding sequences) bit for bit as the eager runner computes the same batch, while every input
// changes between replays; and the engine's greedy output with n-gram speculation on CUDA equals its plain
// greedy output, token for token, except where the plain path's top two log-probs are a near tie (the verify
// rows run the prefill attention kernel and GEMMs, plain decode the decode kernel and GEMVs:
// docs/NUMERICS.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "../unit/engine_test_util.h"
#include "common/test_support.h"
#include "greedy_parity_util.h"
#include "runtime/model_runner.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"

namespace kiln {
namespace {

ModelConfig tiny_config() {
  ModelConfig c = test::tiny_graph_config();
  c.max_position_embeddings = 512;
  c.eos_token_ids = {511};
  return c;
}

std::unique_ptr<Qwen3Runner> tiny_runner() {
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 9;
  return std::make_unique<Qwen3Runner>(Qwen3Model::create(tiny_config(), nullptr, o), ops::KvLayout::hnd,
                                       DType::bf16);
}

// Three sequences, each owning pages 1 + 8 i, 2 + 8 i, ... (never the null page 0), each step computing q
// positions of which the first `real` are real (the rest slot -1 fill rows), the next step starting after
// the real ones, as the engine commits kept drafts.
struct VerifyWorkload {
  int32_t ps = 16, q = 4;
  std::vector<int32_t> begin = {0, 5, 11};
  BatchDesc next(int32_t t, int32_t bucket, std::vector<int32_t>* real) {
    BatchDesc b;
    b.page_size = ps;
    b.cu_q = {0};
    real->assign(3, 0);
    for (int32_t i = 0; i < 3; ++i)
      b.pages_stride = std::max(b.pages_stride, (begin[size_t(i)] + q + ps - 1) / ps);
    for (int32_t i = 0; i < 3; ++i) {
      const int32_t b0 = begin[size_t(i)], n = 1 + (t + i) % q;
      (*real)[size_t(i)] = n;
      for (int32_t j = 0; j < q; ++j) {
        const int32_t pos = b0 + j;
        b.tokens.push_back(j < n ? (t * 37 + i * 11 + j * 5 + 1) % 500 : 0);
        b.positions.push_back(pos);
        b.slot_mapping.push_back(j < n ? int64_t(1 + 8 * i + pos / ps) * ps + pos % ps : -1);
        b.logit_rows.push_back(b.cu_q.back() + j);
      }
      b.cu_q.push_back(b.cu_q.back() + q);
      b.kv_lens.push_back(b0 + q);
      const int32_t used = (b0 + n + ps - 1) / ps;
      for (int32_t p = 0; p < b.pages_stride; ++p) b.page_table.push_back(p < used ? 1 + 8 * i + p : 0);
      begin[size_t(i)] += n;
    }
    pad_batch(b, bucket, q);
    return b;
  }
};

TEST(CudaVerifyGraph, ReplayEqualsEagerWhileInputsChange) {
  KILN_REQUIRE_GPU();
  auto graphed = tiny_runner(), eager = tiny_runner();
  graphed->allocate_kv(32, 16);
  eager->allocate_kv(32, 16);
  ModelRunner::GraphPlan plan;
  plan.buckets = {1, 2, 4, 8, 48};
  plan.max_pages_per_seq = 8;
  plan.max_step_tokens = 64;
  plan.max_seqs = 48;
  plan.verify_rows_per_seq = 4;
  graphed->prepare_graphs(plan);
  EXPECT_EQ(graphed->verify_graph_bucket(3, 4, 2), 4);
  EXPECT_EQ(graphed->verify_graph_bucket(3, 5, 2), 0) << "another k";
  EXPECT_EQ(graphed->verify_graph_bucket(33, 4, 2), 0) << "above kMaxVerifySeqs";
  EXPECT_EQ(graphed->verify_graph_bucket(3, 4, 9), 0) << "wider than any graph";
  EXPECT_EQ(eager->verify_graph_bucket(3, 4, 2), 0) << "no plan, no graphs";
  VerifyWorkload wl;
  const int64_t V = 512;
  for (int32_t t = 0; t < 20; ++t) {
    std::vector<int32_t> real;
    const BatchDesc b = wl.next(t, 4, &real);
    ASSERT_TRUE(is_uniform_verify(b, 4));
    std::vector<float> got, want;
    graphed->forward(b, &got, nullptr);
    eager->forward(b, &want, nullptr);
    ASSERT_EQ(got.size(), want.size());
    for (int32_t i = 0; i < 3; ++i)
      for (int32_t j = 0; j < real[size_t(i)]; ++j) {
        const size_t row = size_t(i * 4 + j) * size_t(V);
        for (int64_t v = 0; v < V; ++v)
          ASSERT_EQ(got[row + size_t(v)], want[row + size_t(v)])
              << "step " << t << " sequence " << i << " position " << j << " logit " << v;
      }
  }
  EXPECT_EQ(graphed->num_verify_graphs(), 1);
}

// Prompts that quote themselves (the drafter finds matches), tokens below the EOS id.
std::vector<std::vector<int32_t>> quoting_prompts(int count) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> block;
    for (int j = 0; j < 6 + i % 5; ++j) block.push_back(int32_t(rng() % 500));
    std::vector<int32_t> p;
    for (int r = 0; r < 3; ++r) p.insert(p.end(), block.begin(), block.end());
    p.insert(p.end(), block.begin(), block.begin() + 2);
    out.push_back(p);
  }
  return out;
}

using test::Generated;

Generated generate(const EngineOptions& o, const std::vector<std::vector<int32_t>>& prompts, bool with_top) {
  auto runner = tiny_runner();
  const Qwen3Runner& r = *runner;
  Engine engine(std::move(runner), o);
  Generated out = test::generate_greedy(engine, prompts, 32, with_top);
  out.verify_graphs = r.num_verify_graphs();
  return out;
}

TEST(CudaVerifyGraph, GreedyNgramEqualsPlainGreedy) {
  KILN_REQUIRE_GPU();
  const auto prompts = quoting_prompts(8);
  EngineOptions base = test::small_opts(4096, 16, 256);
  base.device = "cuda";
  base.cuda_graph_buckets = {1, 2, 4, 8};
  EngineOptions spec = base;
  spec.speculative.algorithm = spec::SpecAlgorithm::ngram;
  spec.speculative.num_draft_tokens = 3;
  spec.speculative.ngram_min = 1;
  spec.speculative.ngram_max = 4;
  spec.speculative.off_switch = false;
  const Generated want = generate(base, prompts, true);
  for (const bool batched : {false, true}) {
    Generated got;
    if (batched) {
      got = generate(spec, prompts, false);
    } else {
      for (const auto& p : prompts) {
        const Generated one = generate(spec, {p}, false);
        got.tokens.push_back(one.tokens[0]);
        got.stats.spec.drafts += one.stats.spec.drafts;
        got.stats.spec.accepted_tokens += one.stats.spec.accepted_tokens;
        got.verify_graphs = std::max(got.verify_graphs, one.verify_graphs);
      }
    }
    const int parted = test::count_near_tie_partings(got, want, batched ? "batched" : "batch 1");
    std::printf("%s: %d of %zu requests part at a near tie; %lld drafts, %lld tokens accepted\n",
                batched ? "batched" : "batch 1", parted, prompts.size(), (long long)got.stats.spec.drafts,
                (long long)got.stats.spec.accepted_tokens);
    EXPECT_GT(got.stats.spec.accepted_tokens, 0);
    EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
    EXPECT_EQ(want.verify_graphs, 0) << "verify graphs without speculation";
  }
}

}  // namespace
}  // namespace kiln
