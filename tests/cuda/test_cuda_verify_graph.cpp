// Verify steps of speculative decoding in CUDA graphs (model/cuda_graph.h, runtime/qwen3_runner.h): a graph
// per (bucket, k + 1) replays uniform verify steps (every sequence k + 1 positions, short rows filled with
// slot -1 rows, padding sequences) bit for bit as the eager runner computes the same batch, while every input
// changes between replays; and the engine's greedy output with n-gram speculation on CUDA equals its plain
// greedy output: token for token and log-prob for log-prob (bitwise) where a verify step has at most 8 rows
// (its attention runs the decode kernel row by row, its projections the plain step's GEMV tactics:
// ops/attention.h decode_rows_per_seq, ops/linear.h LinearTacticRows), and token for token except at near
// ties of the plain path's top two where it has more (the GEMM tactics of M > 8: docs/NUMERICS.md).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <random>

#include "../unit/engine_test_util.h"
#include "common/test_support.h"
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

struct Generated {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<TokenLogprob>>> top;  // per request, per token: the plain path's top 2
  EngineStats stats;
  int verify_graphs = 0;  // the runner's verify graphs after the run: the engine took the graph path
};

Generated generate(const EngineOptions& o, const std::vector<std::vector<int32_t>>& prompts, bool with_top,
                   std::vector<std::vector<float>>* logprobs = nullptr) {
  auto runner = tiny_runner();
  const Qwen3Runner& r = *runner;
  Engine engine(std::move(runner), o);
  test::Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r = test::greedy(p, 32);
    if (with_top) {
      r.sampling.return_logprob = true;
      r.sampling.top_logprobs = 2;
    }
    ids.push_back(engine.submit(r, sink.cb()));
  }
  sink.wait_finished(int(prompts.size()));
  Generated out;
  for (RequestId id : ids) {
    out.tokens.push_back(sink.tokens(id));
    out.top.emplace_back();
    if (logprobs) logprobs->emplace_back();
    for (const TokenEvent& e : sink.events[id]) {
      for (const auto& t : e.top_logprobs) out.top.back().push_back(t);
      if (logprobs) logprobs->back().insert(logprobs->back().end(), e.logprobs.begin(), e.logprobs.end());
    }
  }
  out.stats = engine.stats();
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
    int parted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& a = got.tokens[i];
      const auto& b = want.tokens[i];
      size_t j = 0;
      while (j < a.size() && j < b.size() && a[j] == b[j]) ++j;
      if (j == a.size() && j == b.size()) continue;
      // They part: only where the plain step's top two were within the kernels' rounding.
      ASSERT_LT(j, want.top[i].size());
      ASSERT_EQ(want.top[i][j].size(), 2u);
      const float margin = want.top[i][j][0].logprob - want.top[i][j][1].logprob;
      // 0.1: docs/NUMERICS.md's exemption for greedy tokens that rounding decides (HF parity, 4B shape).
      EXPECT_LT(margin, 0.1f) << (batched ? "batched" : "batch 1") << ": request " << i << " parts at token "
                              << j << " with a top-2 margin of " << margin;
      ++parted;
    }
    std::printf("%s: %d of %zu requests part at a near tie; %lld drafts, %lld tokens accepted\n",
                batched ? "batched" : "batch 1", parted, prompts.size(), (long long)got.stats.spec.drafts,
                (long long)got.stats.spec.accepted_tokens);
    EXPECT_GT(got.stats.spec.accepted_tokens, 0);
    EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
    EXPECT_EQ(want.verify_graphs, 0) << "verify graphs without speculation";
  }
}

// Bitwise: a verify step of B sequences x (k + 1) <= 8 rows computes each row as the plain decode step of B
// sequences does (the same decode attention splits and GEMV configs), so greedy speculation emits the plain
// tokens with the plain log-probs (each emitted token's and the top 2), bit for bit. Batch 1 with k = 3 (4
// rows), batch 4 with k = 1 (8 rows; graph buckets {4, 8}, so a batch that shrinks as requests finish still
// pads to the plain run's 4 sequences). Fails where the verify rows take the prefill kernel
// (KILN_ATTN_VERIFY_DECODE=0) or their own M bucket's tactics (KILN_VERIFY_TACTICS=0) and those differ.
TEST(CudaVerifyGraph, GreedyNgramLogprobsBitwisePlain) {
  KILN_REQUIRE_GPU();
  const auto prompts = quoting_prompts(4);
  for (const int batch : {1, 4}) {
    EngineOptions base = test::small_opts(4096, 16, 256);
    base.device = "cuda";
    base.cuda_graph_buckets = batch == 1 ? std::vector<int32_t>{1, 2, 4, 8} : std::vector<int32_t>{4, 8};
    EngineOptions spec = base;
    spec.speculative.algorithm = spec::SpecAlgorithm::ngram;
    spec.speculative.num_draft_tokens = batch == 1 ? 3 : 1;
    spec.speculative.ngram_min = 1;
    spec.speculative.ngram_max = 4;
    spec.speculative.off_switch = false;
    const auto run = [&](const EngineOptions& o, Generated* g, std::vector<std::vector<float>>* lp) {
      if (batch > 1) {
        *g = generate(o, prompts, true, lp);
        return;
      }
      for (const auto& p : prompts) {
        std::vector<std::vector<float>> one_lp;
        const Generated one = generate(o, {p}, true, &one_lp);
        g->tokens.push_back(one.tokens[0]);
        g->top.push_back(one.top[0]);
        lp->push_back(one_lp[0]);
        g->stats.spec.accepted_tokens += one.stats.spec.accepted_tokens;
        g->verify_graphs = std::max(g->verify_graphs, one.verify_graphs);
      }
    };
    Generated want, got;
    std::vector<std::vector<float>> want_lp, got_lp;
    run(base, &want, &want_lp);
    run(spec, &got, &got_lp);
    SCOPED_TRACE("batch " + std::to_string(batch));
    EXPECT_GT(got.stats.spec.accepted_tokens, 0);
    EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got.tokens[i], want.tokens[i]) << "request " << i;
      ASSERT_EQ(got_lp[i].size(), want_lp[i].size()) << "request " << i;
      for (size_t j = 0; j < want_lp[i].size(); ++j)
        EXPECT_EQ(std::bit_cast<uint32_t>(got_lp[i][j]), std::bit_cast<uint32_t>(want_lp[i][j]))
            << "request " << i << " token " << j << ": log-prob " << got_lp[i][j] << " vs plain "
            << want_lp[i][j];
      ASSERT_EQ(got.top[i].size(), want.top[i].size()) << "request " << i;
      for (size_t j = 0; j < want.top[i].size(); ++j) {
        ASSERT_EQ(got.top[i][j].size(), want.top[i][j].size());
        for (size_t t = 0; t < want.top[i][j].size(); ++t) {
          EXPECT_EQ(got.top[i][j][t].id, want.top[i][j][t].id)
              << "request " << i << " token " << j << " top " << t;
          EXPECT_EQ(std::bit_cast<uint32_t>(got.top[i][j][t].logprob),
                    std::bit_cast<uint32_t>(want.top[i][j][t].logprob))
              << "request " << i << " token " << j << " top " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
