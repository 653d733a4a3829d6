// Verify steps of speculative decoding in CUDA graphs (model/cuda_graph.h, runtime/qwen3_runner.h): a graph
// per (bucket, k + 1) replays uniform verify steps (every sequence k + 1 positions, short rows filled with
// slot -1 rows, padding sequences) bit for bit as the eager runner computes the same batch, while every input
// changes between replays; and the engine's greedy output with n-gram speculation on CUDA equals its plain
// greedy output, token for token except at near ties of the plain path's top two (batched, k = 3: the GEMM
// tactics of M > 8), and where a verify step has at most 8 rows its logits are the plain decode step's bit
// for bit (its attention runs the decode kernel row by row, its projections the plain step's tactics:
// ops/attention.h decode_rows_per_seq, ops/linear.h LinearTacticRows), through the runner and the engine.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "../unit/engine_test_util.h"
#include "bitwise_verify.h"
#include "common/test_support.h"
#include "greedy_parity_util.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/context.h"
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

// One uniform verify step through both runners: sequence i's first real[i] rows (of q) give the same logits
// bit for bit.
void expect_replay_equals_eager(Qwen3Runner& graphed, Qwen3Runner& eager, const BatchDesc& b, int32_t q,
                                const std::vector<int32_t>& real, int32_t step) {
  std::vector<float> got, want;
  graphed.forward(b, &got, nullptr);
  eager.forward(b, &want, nullptr);
  ASSERT_EQ(got.size(), want.size());
  const size_t V = size_t(graphed.config().vocab_size);
  for (size_t i = 0; i < real.size(); ++i)
    for (int32_t j = 0; j < real[i]; ++j) {
      const size_t row = (i * size_t(q) + size_t(j)) * V;
      for (size_t v = 0; v < V; ++v)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[row + v]), std::bit_cast<uint32_t>(want[row + v]))
            << "step " << step << " sequence " << i << " row " << j << " logit " << v;
    }
}

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
  EXPECT_EQ(graphed->verify_graph_bucket(3, 4, 2, false), 4);
  EXPECT_EQ(graphed->verify_graph_bucket(3, 5, 2, false), 0) << "another k";
  EXPECT_EQ(graphed->verify_graph_bucket(3, 4, 2, true), 0) << "no tree graphs in the plan";
  EXPECT_EQ(graphed->verify_graph_bucket(33, 4, 2, false), 0) << "above kMaxVerifySeqs";
  EXPECT_EQ(graphed->verify_graph_bucket(3, 4, 9, false), 0) << "wider than any graph";
  EXPECT_EQ(eager->verify_graph_bucket(3, 4, 2, false), 0) << "no plan, no graphs";
  VerifyWorkload wl;
  for (int32_t t = 0; t < 20; ++t) {
    std::vector<int32_t> real;
    const BatchDesc b = wl.next(t, 4, &real);
    ASSERT_TRUE(is_uniform_verify(b, 4));
    expect_replay_equals_eager(*graphed, *eager, b, 4, real, t);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(graphed->num_verify_graphs(), 4) << "one per verify bucket (1, 2, 4, 8) at the one width";
  EXPECT_EQ(graphed->verify_graph_replays(), 20) << "every step replayed a graph captured at prepare_graphs";
}

// Token-tree verify steps (EAGLE-3's, runtime/engine_tree.cpp's uniform layout) replayed from a tree graph
// give the eager step's logits bit for bit while the trees change every step: sequence i holds a tree of
// (t + i) % 7 nodes (node j's parent (j - 1) / 2, rotary position begin + its depth, slot begin + 1 + j),
// fill rows (slot -1, seeing the root and themselves) up to 7 rows, none a causal sequence; the batch is
// padded to its bucket with causal sequences. Both runners take the same table width (the graph's), so the
// tree kernel splits the same.
TEST(CudaVerifyGraph, TreeReplayEqualsEagerWhileTreesChange) {
  KILN_REQUIRE_GPU();
  auto graphed = tiny_runner(), eager = tiny_runner();
  graphed->allocate_kv(32, 16);
  eager->allocate_kv(32, 16);
  const int32_t q = 7, ps = 16, W = 8;
  ModelRunner::GraphPlan plan;
  plan.buckets = {1, 2, 4, 8};
  plan.max_pages_per_seq = W;
  plan.max_step_tokens = 64;
  plan.max_seqs = 8;
  plan.verify_rows_per_seq = q;
  plan.verify_trees = true;
  graphed->prepare_graphs(plan);
  EXPECT_EQ(graphed->verify_graph_bucket(3, q, 2, true), 4);
  EXPECT_EQ(graphed->verify_graph_bucket(3, q, 2, false), 0) << "with trees no chain verify graphs";
  EXPECT_EQ(graphed->num_verify_graphs(), 0);
  std::vector<int32_t> begin = {0, 5, 11};
  const int64_t V = 512;
  const int32_t steps = 16;
  for (int32_t t = 0; t < steps; ++t) {
    BatchDesc b;
    b.page_size = ps;
    b.pages_stride = W;
    b.cu_q = {0};
    std::vector<int32_t> real(3);
    for (int32_t i = 0; i < 3; ++i) {
      const int32_t b0 = begin[size_t(i)], n = (t + i) % q;
      real[size_t(i)] = 1 + n;
      const auto slot = [&](int32_t pos) { return int64_t(1 + W * i + pos / ps) * ps + pos % ps; };
      std::vector<uint64_t> seen(size_t(q), 1);
      std::vector<int32_t> depth(size_t(q), 0);
      for (int32_t j = 0; j < q; ++j) {  // row j: the root, node j - 1, or fill
        const int32_t node = j - 1, parent = node <= 0 ? -1 : (node - 1) / 2;
        if (j > 0) {
          depth[size_t(j)] = 1 + (parent < 0 ? 0 : depth[size_t(parent + 1)]);
          seen[size_t(j)] = (j <= n ? seen[size_t(parent + 1)] : uint64_t(1)) | (uint64_t(1) << j);
        }
        b.tokens.push_back(j <= n ? (t * 37 + i * 11 + j * 5 + 1) % 500 : 0);
        b.positions.push_back(j == 0 ? b0 : j <= n ? b0 + depth[size_t(j)] : b0 + 1);
        b.slot_mapping.push_back(j == 0 ? slot(b0) : j <= n ? slot(b0 + j) : -1);
        b.tree_mask.push_back(n > 0 ? seen[size_t(j)] : 0);
        b.logit_rows.push_back(b.cu_q.back() + j);
      }
      b.cu_q.push_back(b.cu_q.back() + q);
      b.kv_lens.push_back(b0 + q);
      b.tree_window.push_back(n > 0 ? q : 0);
      for (int32_t p = 0; p < W; ++p) b.page_table.push_back(1 + W * i + p);
      begin[size_t(i)] += 1 + std::min(n, 2);  // a kept path of up to 2 nodes (their KV left where it is)
    }
    pad_batch(b, 4, q);
    ASSERT_NO_THROW(b.validate(V, 32));
    ASSERT_TRUE(is_uniform_verify(b, q));
    expect_replay_equals_eager(*graphed, *eager, b, q, real, t);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(graphed->tree_graph_replays(), steps) << "every tree step replayed a tree graph";
  EXPECT_EQ(graphed->verify_graph_replays(), steps);
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

Generated generate(const EngineOptions& o, const std::vector<std::vector<int32_t>>& prompts, bool with_top,
                   std::vector<std::vector<float>>* logprobs = nullptr) {
  auto runner = tiny_runner();
  const Qwen3Runner& r = *runner;
  Engine engine(std::move(runner), o);
  Generated out = test::generate_greedy(engine, prompts, 32, with_top, false, logprobs);
  out.verify_graphs = int(r.verify_graph_replays());
  return out;
}

// The engine on CUDA with graphs of 1, 2, 4, 8 sequences; and with n-gram speculation on it (k = 3, every
// step it can verify).
EngineOptions cuda_opts() {
  EngineOptions o = test::small_opts(4096, 16, 256);
  o.device = "cuda";
  o.cuda_graph_buckets = {1, 2, 4, 8};
  return o;
}
EngineOptions ngram_opts(EngineOptions o) {
  o.speculative.algorithm = spec::SpecAlgorithm::ngram;
  o.speculative.num_draft_tokens = 3;
  o.speculative.ngram_min = 1;
  o.speculative.ngram_max = 4;
  o.speculative.off_switch = false;
  return o;
}

TEST(CudaVerifyGraph, GreedyNgramEqualsPlainGreedy) {
  KILN_REQUIRE_GPU();
  const auto prompts = quoting_prompts(8);
  const EngineOptions base = cuda_opts(), spec = ngram_opts(base);
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

using test::BitwiseVerify;

// Bitwise, through the runner: verify steps of B sequences x q rows (B x q <= 8) replayed from their graph
// give, row for row, the logits the plain decode step of B sequences gives at that position (decode graphs),
// bit for bit: the decode attention kernel row by row with the B-sequence split count, and the B bucket's
// GEMV / GEMM tactics. Sequences advance by 1 .. q kept rows a step (fill rows after), as the engine commits
// kept drafts; the same tokens feed both (BitwiseVerify on). Fails where the verify rows take the prefill
// kernel or their own M bucket's tactics and those differ.
TEST(CudaVerifyGraph, VerifyLogitsBitwiseThePlainDecodeStep) {
  KILN_REQUIRE_GPU();
  const BitwiseVerify bitwise;
  const int64_t V = 512;
  struct Shape {
    int32_t B, q;
  };
  for (const Shape sh : {Shape{1, 4}, Shape{2, 4}, Shape{4, 2}}) {
    SCOPED_TRACE("batch " + std::to_string(sh.B) + ", " + std::to_string(sh.q) + " rows");
    // N tokens decoded after each prompt; W pages a sequence (a 256-token table: 4 decode splits of 64 keys,
    // so contexts past 64 keys go through the combine).
    const int32_t B = sh.B, q = sh.q, ps = 16, N = 14, W = 16;
    auto plain = tiny_runner(), spec = tiny_runner();
    for (auto* r : {plain.get(), spec.get()}) {
      r->allocate_kv(1 + 4 * W, ps);
      ModelRunner::GraphPlan plan;
      plan.buckets = {1, 2, 4, 8};
      plan.max_pages_per_seq = W;
      plan.max_step_tokens = 512;
      plan.max_seqs = 8;
      plan.verify_rows_per_seq = r == spec.get() ? q : 0;
      r->prepare_graphs(plan);
    }
    // Sequence i owns pages 1 + W i ..; its prompt of 70 + 23 i tokens, then N tokens fed one (plain) or up
    // to q (verify) at a time.
    std::vector<int32_t> len(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> toks(static_cast<size_t>(B));
    for (int32_t i = 0; i < B; ++i) {
      len[size_t(i)] = 70 + 23 * i;
      for (int32_t j = 0; j < len[size_t(i)] + N; ++j)
        toks[size_t(i)].push_back((i * 131 + j * 37 + 3) % 500);
    }
    // A step: sequence i computes rows at positions begin[i] .. begin[i] + q_len - 1, the first real[i] real.
    const auto step = [&](ModelRunner& r, const std::vector<int32_t>& begin, int32_t q_len,
                          const std::vector<int32_t>& real, std::vector<float>* logits) {
      BatchDesc b;
      b.page_size = ps;
      b.pages_stride = W;
      b.cu_q = {0};
      for (int32_t i = 0; i < B; ++i) {
        for (int32_t j = 0; j < q_len; ++j) {
          const int32_t pos = begin[size_t(i)] + j;
          const bool is_real = j < real[size_t(i)];
          b.tokens.push_back(is_real ? toks[size_t(i)][size_t(pos)] : 0);
          b.positions.push_back(pos);
          b.slot_mapping.push_back(is_real ? int64_t(1 + W * i + pos / ps) * ps + pos % ps : -1);
          if (q_len > 1 || j + 1 == q_len) b.logit_rows.push_back(b.cu_q.back() + j);
        }
        b.cu_q.push_back(b.cu_q.back() + q_len);
        b.kv_lens.push_back(begin[size_t(i)] + q_len);
        for (int32_t p = 0; p < W; ++p) b.page_table.push_back(1 + W * i + p);
      }
      r.forward(b, logits, nullptr);
    };
    // The prompts, one prefill step each runner (same batch, same bits), logits of their last rows.
    for (auto* r : {plain.get(), spec.get()}) {
      BatchDesc b;
      b.page_size = ps;
      b.pages_stride = W;
      b.cu_q = {0};
      for (int32_t i = 0; i < B; ++i) {
        for (int32_t pos = 0; pos < len[size_t(i)]; ++pos) {
          b.tokens.push_back(toks[size_t(i)][size_t(pos)]);
          b.positions.push_back(pos);
          b.slot_mapping.push_back(int64_t(1 + W * i + pos / ps) * ps + pos % ps);
        }
        b.cu_q.push_back(b.cu_q.back() + len[size_t(i)]);
        b.logit_rows.push_back(b.cu_q.back() - 1);
        b.kv_lens.push_back(len[size_t(i)]);
        for (int32_t p = 0; p < W; ++p) b.page_table.push_back(1 + W * i + p);
      }
      std::vector<float> unused;
      r->forward(b, &unused, nullptr);
    }
    // Plain: want[i][pos] = the logits of the decode step feeding token pos of sequence i.
    std::vector<std::vector<std::vector<float>>> want(static_cast<size_t>(B));
    for (int32_t s = 0; s < N; ++s) {
      std::vector<int32_t> begin(static_cast<size_t>(B)), one(size_t(B), 1);
      for (int32_t i = 0; i < B; ++i) begin[size_t(i)] = len[size_t(i)] + s;
      std::vector<float> lg;
      step(*plain, begin, 1, one, &lg);
      ASSERT_EQ(lg.size(), size_t(B) * size_t(V));
      for (int32_t i = 0; i < B; ++i)
        want[size_t(i)].emplace_back(lg.begin() + ptrdiff_t(i) * V, lg.begin() + ptrdiff_t(i + 1) * V);
    }
    // Verify steps, sequence i keeping 1 + (t + i) % q rows at step t, until every one has fed N tokens.
    std::vector<int32_t> fed(size_t(B), 0);
    int32_t compared = 0;
    for (int32_t t = 0; *std::min_element(fed.begin(), fed.end()) < N; ++t) {
      std::vector<int32_t> begin(static_cast<size_t>(B)), real(static_cast<size_t>(B));
      for (int32_t i = 0; i < B; ++i) {
        begin[size_t(i)] = len[size_t(i)] + fed[size_t(i)];
        real[size_t(i)] = std::min(1 + (t + i) % q, N - fed[size_t(i)]);
        if (real[size_t(i)] <= 0) real[size_t(i)] = 1;  // a finished sequence feeds its last token again
        if (fed[size_t(i)] >= N) begin[size_t(i)] = len[size_t(i)] + N - 1;
      }
      ASSERT_EQ(spec->verify_graph_bucket(B, q, W, false), B);
      std::vector<float> lg;
      step(*spec, begin, q, real, &lg);
      ASSERT_EQ(lg.size(), size_t(B) * size_t(q) * size_t(V));
      for (int32_t i = 0; i < B; ++i) {
        for (int32_t j = 0; j < real[size_t(i)]; ++j) {
          const int32_t s = begin[size_t(i)] - len[size_t(i)] + j;
          const float* got = lg.data() + (ptrdiff_t(i) * q + j) * V;
          const std::vector<float>& w = want[size_t(i)][size_t(s)];
          int64_t diff = 0, first = -1;
          for (int64_t v = 0; v < V; ++v)
            if (std::bit_cast<uint32_t>(got[v]) != std::bit_cast<uint32_t>(w[size_t(v)]) && diff++ == 0)
              first = v;
          ASSERT_EQ(diff, 0) << "verify step " << t << " sequence " << i << " row " << j << " (token " << s
                             << "): " << diff << " logits differ; first " << first << ": " << got[first]
                             << " vs plain " << w[size_t(first)];
          ++compared;
        }
        fed[size_t(i)] = std::min(N, fed[size_t(i)] + real[size_t(i)]);
      }
    }
    EXPECT_GE(compared, B * N);
    EXPECT_EQ(spec->num_verify_graphs(), 4) << "one per verify bucket (1, 2, 4, 8) at the one width";
    EXPECT_GE(spec->verify_graph_replays(), N / q) << "the verify steps replayed the graphs";
  }
}

// The engine: greedy with n-gram speculation at batch 1 (k = 3: 4 rows a verify step) emits plain decoding's
// tokens with its log-probs (each emitted token's and the top 2), bit for bit. (Batched requests are checked
// through the runner above: the engine's step composition depends on when requests arrive.) Contexts stay
// within 64 keys (one decode split whatever the table width), so the last steps, whose drafts run as an eager
// verify batch with the batch's own page-table width (engine_spec.cpp verify_batch), round as the graphs do.
TEST(CudaVerifyGraph, GreedyNgramLogprobsBitwisePlainBatch1) {
  KILN_REQUIRE_GPU();
  const BitwiseVerify bitwise;
  const auto prompts = quoting_prompts(4);
  // Log-probs from the logits on the host for both paths: device sampling computes a plain step's on the GPU
  // and a verify step's on the host (runtime/engine_spec.cpp emitted_logprobs), 1 float ulp apart.
  EngineOptions base = cuda_opts();
  base.sampling_backend = "cpu";
  const EngineOptions spec = ngram_opts(base);
  int64_t accepted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<std::vector<float>> want_lp, got_lp;
    const Generated want = generate(base, {prompts[i]}, true, &want_lp);
    const Generated got = generate(spec, {prompts[i]}, true, &got_lp);
    accepted += got.stats.spec.accepted_tokens;
    EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
    ASSERT_EQ(got.tokens[0], want.tokens[0]) << "request " << i;
    ASSERT_EQ(got_lp[0].size(), want_lp[0].size()) << "request " << i;
    for (size_t j = 0; j < want_lp[0].size(); ++j)
      EXPECT_EQ(std::bit_cast<uint32_t>(got_lp[0][j]), std::bit_cast<uint32_t>(want_lp[0][j]))
          << "request " << i << " token " << j << ": log-prob " << got_lp[0][j] << " vs plain "
          << want_lp[0][j];
    ASSERT_EQ(got.top[0].size(), want.top[0].size()) << "request " << i;
    for (size_t j = 0; j < want.top[0].size(); ++j) {
      ASSERT_EQ(got.top[0][j].size(), want.top[0][j].size());
      for (size_t t = 0; t < want.top[0][j].size(); ++t) {
        EXPECT_EQ(got.top[0][j][t].id, want.top[0][j][t].id) << "request " << i << " token " << j;
        EXPECT_EQ(std::bit_cast<uint32_t>(got.top[0][j][t].logprob),
                  std::bit_cast<uint32_t>(want.top[0][j][t].logprob))
            << "request " << i << " token " << j << " top " << t;
      }
    }
  }
  EXPECT_GT(accepted, 0) << "no draft kept: the verify rows went untested";
}

// Seeded sampling on the device: with the bitwise verify path (BitwiseVerify) a verify step draws each
// position as the plain step drawing that token would (runtime/engine_spec.cpp verify_on_device: the
// request's seed, the token's step counter), so a seeded sampled request's tokens equal plain decoding's at
// batch 1, drafts kept and rejected. A low temperature keeps the tiny model's draws near its greedy ones,
// where drafts get kept.
TEST(CudaVerifyGraph, SeededSampledNgramEqualsPlainBatch1) {
  KILN_REQUIRE_GPU();
  const BitwiseVerify bitwise;
  const auto prompts = quoting_prompts(4);
  const EngineOptions base = cuda_opts(), spec = ngram_opts(base);
  const auto run = [&](const EngineOptions& o, size_t i, spec::SpecStats* stats, int* graphs) {
    auto runner = tiny_runner();
    const Qwen3Runner& r = *runner;
    Engine engine(std::move(runner), o);
    test::Sink sink;
    Request req = test::greedy(prompts[i], 32);
    req.sampling.temperature = i % 2 ? 0.05f : 0.2f;
    req.sampling.top_k = i % 2 ? 20 : -1;
    req.sampling.seed = int64_t(300 + i);
    const RequestId id = engine.submit(req, sink.cb());
    sink.wait_finished(1);
    if (stats) *stats = engine.stats().spec;
    if (graphs) *graphs = int(r.verify_graph_replays());
    return sink.tokens(id);
  };
  int64_t accepted = 0, verified = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    spec::SpecStats st;
    int graphs = 0;
    const std::vector<int32_t> want = run(base, i, nullptr, nullptr);
    const std::vector<int32_t> got = run(spec, i, &st, &graphs);
    EXPECT_EQ(got, want) << "request " << i;
    EXPECT_GT(graphs, 0) << "request " << i << ": no verify step replayed a graph";
    accepted += st.accepted_tokens;
    verified += st.verify_steps;
  }
  EXPECT_GT(verified, 0);
  EXPECT_GT(accepted, 0) << "no draft kept: the kept path went untested";
}

}  // namespace
}  // namespace kiln
