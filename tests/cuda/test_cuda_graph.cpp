// The decode CUDA graph: replayed steps equal eager steps bit for bit while every input changes between
// replays (token, position, slot, context length, a page-table entry appearing at a page boundary), with
// and without programmatic dependent launch; a workspace reallocation forces a recapture. Batch buckets:
// a graph of B sequences fed fewer real ones plus padding rows (runtime pad_batch), page tables narrower
// than the graph's, equals the eager step of the same rows; the runner routes decode steps to its graphs.
// With kiln's GEMVs as the tactics (serving's batch-1 path) the replays equal the eager steps too.
// The overlap schedule's chained launches (launch_sampled; launch_forward + sample_launched under grammar
// masks) draw what steps run one at a time draw.
#include <numeric>
#include <string>

#include "common/test_support.h"
#include "decode_step_util.h"
#include "gemv_test_util.h"
#include "model/cuda_graph.h"
#include "model/cuda_step_choice.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#include "runtime/logit_processor.h"
#include "runtime/model_runner.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"

namespace kiln {
namespace {

ModelConfig tiny_config() {
  return test::tiny_graph_config();
}

// kiln's GEMV as the tactic of every projection of tiny_config at M = 1 (QKV and gate_up, which share a
// shape, with the residual-norm prologue; O and the LM head on the FMA kernel, down on the tensor-core
// one), installed in the process's GEMM engine for the scope's life: decode steps then run the GEMVs that
// serving's batch-1 graphs chain with PDL (the W loads issued before each kernel's wait, the next kernel
// launched right after it), where the untuned engine would run cuBLASLt.
class GemvTacticsScope : public test::EngineTacticsScope {
 public:
  GemvTacticsScope() : EngineTacticsScope("cuda_graph", entries()) {}

 private:
  static std::vector<test::GemvEntry> entries() {
    const ModelConfig c = tiny_config();
    const int64_t H = c.hidden_size, qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    const int64_t q = c.num_heads * c.head_dim, I = c.intermediate_size;
    return {{{1, qkv, H, cuda::GemmOut::bf16}, {4, false}, true},  // QKV and gate_up
            {{1, H, q, cuda::GemmOut::bf16}, {2, false}, false},   // O
            {{1, H, I, cuda::GemmOut::bf16}, {8, true}, false},    // down
            {{1, c.vocab_size, H, cuda::GemmOut::f32}, {4, false}, false}};
  }
};

void run_case(bool pdl) {
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 3;
  auto m = Qwen3Model::create(tiny_config(), nullptr, o);
  const int ps = 16;
  KvCache eager_cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  KvCache graph_cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  Buffer dl(512 * 4, Device::cuda());
  const Tensor eager_logits(dl.data(), DType::f32, {1, 512}, Device::cuda());
  cuda::set_pdl(pdl);
  CudaDecodeGraph g(*m, graph_cache, 16);
  for (int32_t pos = 0; pos < 40; ++pos) {  // crosses the page boundaries at 16 and 32
    const BatchDesc b = test::step_batch(pos, (pos * 97 + 5) % 512, ps);
    m->forward(b, eager_cache, eager_logits);
    const auto want = test::host_floats(eager_logits);
    const auto got = test::host_floats(g.step(b));
    ASSERT_EQ(got, want) << "step " << pos << " pdl " << pdl;
  }
  EXPECT_EQ(g.captures(), 1) << "inputs changing must not force a recapture";
  // A larger step reallocates the workspace: the next replay recaptures and stays exact.
  BatchDesc big;
  big.page_size = ps;
  for (int32_t i = 0; i < 64; ++i) {
    big.tokens.push_back(i), big.positions.push_back(i), big.slot_mapping.push_back(int64_t(8) * ps + i);
  }
  big.cu_q = {0, 64}, big.kv_lens = {64}, big.pages_stride = 4, big.page_table = {8, 9, 10, 11};
  big.logit_rows = {63};
  KvCache scratch_cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  m->forward(big, scratch_cache, eager_logits);
  const BatchDesc b = test::step_batch(40, 7, ps);
  m->forward(b, eager_cache, eager_logits);
  const auto want = test::host_floats(eager_logits);
  EXPECT_EQ(test::host_floats(g.step(b)), want);
  EXPECT_EQ(g.captures(), 2);
  cuda::set_pdl(false);
}

// Step t of a 3-sequence decode workload: sequence i joins at step 4 i (so contexts differ), writes
// position t - 4 i, and owns pages 1 + 8 i, 2 + 8 i, ... (never the null page 0). The page table is laid
// out `width` pages wide (0 = as narrow as the step allows), then padded to `bucket` sequences.
BatchDesc bucket_step(int32_t t, int32_t ps, int32_t width, int32_t bucket) {
  BatchDesc b;
  b.page_size = ps;
  b.cu_q = {0};
  std::vector<std::vector<int32_t>> rows;
  for (int32_t i = 0; i < 3 && 4 * i <= t; ++i) {
    const int32_t pos = t - 4 * i;
    b.tokens.push_back((t * 31 + i * 7 + 3) % 512);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(int64_t(1 + 8 * i + pos / ps) * ps + pos % ps);
    b.cu_q.push_back(b.cu_q.back() + 1);
    b.kv_lens.push_back(pos + 1);
    b.logit_rows.push_back(i);
    rows.emplace_back();
    for (int32_t p = 0; p <= pos / ps; ++p) rows.back().push_back(1 + 8 * i + p);
  }
  int32_t w = width;
  for (const auto& r : rows) w = std::max(w, int32_t(r.size()));
  b.pages_stride = w;
  for (auto& r : rows) {
    r.resize(size_t(w), 0);
    b.page_table.insert(b.page_table.end(), r.begin(), r.end());
  }
  pad_batch(b, bucket);
  return b;
}

void run_bucket_case(int32_t bucket) {
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 5;
  auto m = Qwen3Model::create(tiny_config(), nullptr, o);
  const int32_t ps = 16, width = 8, V = 512;
  KvCache eager_cache(m->config(), 32, ps, ops::KvLayout::nhd, DType::bf16, Device::cuda());
  KvCache graph_cache(m->config(), 32, ps, ops::KvLayout::nhd, DType::bf16, Device::cuda());
  Buffer dl(size_t(bucket) * V * 4, Device::cuda());
  const Tensor eager_logits(dl.data(), DType::f32, {bucket, V}, Device::cuda());
  Buffer shared(size_t(bucket + 3) * V * 4, Device::cuda());
  CudaDecodeGraph g(*m, graph_cache, width, bucket,
                    Tensor(shared.data(), DType::f32, {bucket + 3, V}, Device::cuda()));
  for (int32_t t = 0; t < 40; ++t) {  // 1, 2, then 3 real rows; page boundaries at 16 and 32
    // Eager: the same rows laid out at the graph's width, logits for every row as the graph computes them.
    BatchDesc e = bucket_step(t, ps, width, bucket);
    e.logit_rows.resize(size_t(bucket));
    std::iota(e.logit_rows.begin(), e.logit_rows.end(), 0);
    m->forward(e, eager_cache, eager_logits);
    const std::vector<float> all = test::host_floats(eager_logits);
    // Graph: the narrow table, logit rows of the real sequences only.
    const BatchDesc b = bucket_step(t, ps, 0, bucket);
    const Tensor got = g.step(b);
    ASSERT_EQ(got.shape[0], int64_t(b.logit_rows.size()));
    const std::vector<float> want(all.begin(), all.begin() + got.shape[0] * V);
    ASSERT_EQ(test::host_floats(got), want) << "bucket " << bucket << " step " << t;
  }
  EXPECT_EQ(g.captures(), 1);
  // Wrong shapes are errors, not silent misreads.
  EXPECT_THROW(g.step(bucket_step(3, ps, 0, bucket + 1)), Error);
  EXPECT_THROW(g.step(bucket_step(3, ps, width + 1, bucket)), Error);
  BatchDesc two_rows = bucket_step(3, ps, 0, bucket);
  two_rows.logit_rows = {0, 0};
  EXPECT_THROW(g.step(two_rows), Error);
}

TEST(CudaGraph, BucketReplayWithPaddingRowsEqualsEager) {
  KILN_REQUIRE_GPU();
  run_bucket_case(4);
  run_bucket_case(8);
}

// A runner over the tiny model (seed 9) with its paged cache, on the GPU.
std::unique_ptr<Qwen3Runner> tiny_runner(int32_t ps, int32_t pages) {
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 9;
  auto r = std::make_unique<Qwen3Runner>(Qwen3Model::create(tiny_config(), nullptr, o), ops::KvLayout::hnd,
                                         DType::bf16);
  r->allocate_kv(pages, ps);
  return r;
}

// The runner: graphs captured at prepare_graphs for every (bucket, width), decode steps routed to them, and
// their sampled tokens and log-probs equal to an eager runner's on the same padded rows.
TEST(CudaGraph, RunnerRoutesPaddedDecodeStepsToItsGraphs) {
  KILN_REQUIRE_GPU();
  const int32_t ps = 16, pages = 32;
  auto make = [&] { return tiny_runner(ps, pages); };
  auto graphed = make();
  auto eager = make();
  ModelRunner::GraphPlan plan;
  plan.buckets = {1, 2, 4, 8};
  plan.max_pages_per_seq = 40;  // widths 16, 32, 40
  plan.max_step_tokens = 64;
  plan.max_seqs = 8;
  graphed->prepare_graphs(plan);
  EXPECT_EQ(graphed->num_graphs(), 4 * 3);
  EXPECT_EQ(eager->graph_bucket(bucket_step(9, ps, 0, 3)), 0) << "no plan, no graphs";
  EXPECT_EQ(graphed->graph_bucket(bucket_step(9, ps, 0, 3)), 4);
  EXPECT_EQ(graphed->graph_bucket(bucket_step(9, ps, 0, 5)), 8);
  EXPECT_EQ(graphed->graph_bucket(bucket_step(9, ps, 0, 9)), 0) << "above the largest bucket";
  EXPECT_EQ(graphed->graph_bucket(bucket_step(9, ps, 41, 3)), 0) << "table wider than any graph";
  BatchDesc prefill = bucket_step(9, ps, 0, 3);
  prefill.tokens.push_back(1), prefill.positions.push_back(9), prefill.slot_mapping.push_back(-1);
  prefill.cu_q.back() += 1;
  EXPECT_EQ(graphed->graph_bucket(prefill), 0) << "a sequence with two new tokens";

  std::vector<ModelRunner::RowSampling> rows(8);  // greedy
  for (int32_t bucket : {4, 8}) {
    for (int32_t t = 0; t < 24; ++t) {
      const BatchDesc b = bucket_step(t, ps, 0, bucket);
      ASSERT_EQ(graphed->graph_bucket(b), bucket);
      std::vector<ModelRunner::SampledRow> got, want;
      const size_t R = b.logit_rows.size();
      ASSERT_TRUE(graphed->forward_sampled(b, {rows.begin(), rows.begin() + ptrdiff_t(R)}, 2, &got));
      // The eager runner on the same rows at the graph's width (16 pages) with every row's logits.
      BatchDesc e = bucket_step(t, ps, 16, bucket);
      e.logit_rows.resize(size_t(bucket));
      std::iota(e.logit_rows.begin(), e.logit_rows.end(), 0);
      ASSERT_TRUE(eager->forward_sampled(e, {rows.begin(), rows.begin() + bucket}, 2, &want));
      ASSERT_EQ(got.size(), R);
      for (size_t r = 0; r < R; ++r) {
        EXPECT_EQ(got[r].token, want[r].token) << "bucket " << bucket << " step " << t << " row " << r;
        EXPECT_EQ(got[r].logprob, want[r].logprob) << "bucket " << bucket << " step " << t << " row " << r;
        ASSERT_EQ(got[r].top.size(), 2u);
        EXPECT_EQ(got[r].top[1].id, want[r].top[1].id);
      }
    }
  }
}

// tiny_runner with decode graphs for steps of 4 sequences (launches ahead need a graph).
std::unique_ptr<Qwen3Runner> graphed_runner(int32_t ps, int32_t pages) {
  auto r = tiny_runner(ps, pages);
  ModelRunner::GraphPlan plan;
  plan.buckets = {4};
  plan.max_pages_per_seq = 16;
  plan.max_step_tokens = 64;
  plan.max_seqs = 4;
  r->prepare_graphs(plan);
  return r;
}

// The overlap schedule's runner path: steps launched ahead (launch_sampled), each chained on the previous
// step's draws by a device copy, give the draws of steps run one at a time with those draws as host tokens.
TEST(CudaGraph, ChainedLaunchesEqualStepByStepSampling) {
  KILN_REQUIRE_GPU();
  const int32_t ps = 16, pages = 32;
  auto one = graphed_runner(ps, pages), ahead = graphed_runner(ps, pages);
  const std::vector<ModelRunner::RowSampling> rows(3);  // greedy
  std::vector<ModelRunner::SampledRow> a, b;
  for (int32_t t = 0; t < 12; ++t) {  // the same contexts in both caches (3 rows from step 8 on)
    const BatchDesc s = bucket_step(t, ps, 0, 4);
    const size_t R = s.logit_rows.size();
    ASSERT_TRUE(one->forward_sampled(s, {rows.begin(), rows.begin() + ptrdiff_t(R)}, 0, &a));
    ASSERT_TRUE(ahead->forward_sampled(s, {rows.begin(), rows.begin() + ptrdiff_t(R)}, 0, &b));
  }
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t r = 0; r < 3; ++r)
    ASSERT_EQ(a[r].token, b[r].token) << "the two runners differ before the test";
  auto with_tokens = [&](int32_t t, const std::vector<ModelRunner::SampledRow>& prev) {
    BatchDesc s = bucket_step(t, ps, 0, 4);
    for (size_t r = 0; r < 3; ++r) s.tokens[r] = prev[r].token;
    return s;
  };
  // Steps 12 .. 24: one at a time on `one` (host tokens = the last draws); on `ahead`, step 12 launched
  // plain, then each next one launched chained before the previous is collected.
  std::vector<std::vector<ModelRunner::SampledRow>> want;
  for (int32_t t = 12; t <= 24; ++t) {
    const BatchDesc s = with_tokens(t, t == 12 ? a : want.back());
    std::vector<ModelRunner::SampledRow> w;
    ASSERT_TRUE(one->forward_sampled(s, rows, 2, &w));
    want.push_back(w);
  }
  ASSERT_TRUE(ahead->launch_sampled(with_tokens(12, a), rows, 2, false));
  std::vector<std::vector<ModelRunner::SampledRow>> got;
  for (int32_t t = 13; t <= 24; ++t) {
    BatchDesc s = bucket_step(t, ps, 0, 4);
    for (size_t r = 0; r < 3; ++r) s.tokens[r] = 0;  // not known on the host: taken on the device
    ASSERT_TRUE(ahead->launch_sampled(s, rows, 2, true)) << "step " << t;
    got.emplace_back();
    ahead->collect_sampled(&got.back());
  }
  got.emplace_back();
  ahead->collect_sampled(&got.back());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t r = 0; r < 3; ++r) {
      EXPECT_EQ(got[i][r].token, want[i][r].token) << "step " << 12 + i << " row " << r;
      EXPECT_EQ(got[i][r].logprob, want[i][r].logprob) << "step " << 12 + i << " row " << r;
      ASSERT_EQ(got[i][r].top.size(), 2u);
      EXPECT_EQ(got[i][r].top[1].id, want[i][r].top[1].id);
    }
  // A chained launch needs a step launched before it.
  EXPECT_FALSE(ahead->launch_sampled(bucket_step(25, ps, 0, 4), rows, 0, true)) << "nothing launched before";
}

// The overlap schedule with constrained rows: the forward launched alone (launch_forward, chained on the
// previous step's draws), the previous step collected, the rows' grammar masks for this step set, then its
// sampling queued (sample_launched): the draws equal those of steps run one at a time with the same masks,
// each inside its mask.
TEST(CudaGraph, ChainedForwardLaunchesSampledUnderMasksEqualStepByStepSampling) {
  KILN_REQUIRE_GPU();
  const int32_t ps = 16, pages = 32;
  auto one = graphed_runner(ps, pages), ahead = graphed_runner(ps, pages);
  const int64_t V = one->config().vocab_size;
  const size_t W = size_t((V + 31) / 32);
  std::vector<std::unique_ptr<LogitProcessor>> procs;
  std::vector<ModelRunner::RowSampling> rows(3);
  for (size_t r = 0; r < 3; ++r) {
    procs.push_back(
        std::make_unique<LogitProcessor>(SamplingParams{}, std::vector<int32_t>{}, std::vector<int32_t>{}));
    rows[r].proc = procs.back().get();
    rows[r].request = r + 1;
    if (r == 1) rows[r].temperature = 0.8f, rows[r].seed = 9;  // one sampled row
  }
  auto set_masks = [&](int32_t t) {  // about a fifth of the ids allowed, a different set each step and row
    for (size_t r = 0; r < 3; ++r) {
      std::vector<uint32_t>& m = procs[r]->token_mask();
      m.assign(W, 0u);
      for (int64_t id = 0; id < V; ++id)
        if ((id * 7 + t * 3 + int64_t(r)) % 5 == 0) m[size_t(id / 32)] |= 1u << (id % 32);
    }
  };
  auto step = [&](int32_t t, const std::vector<ModelRunner::SampledRow>* prev) {
    BatchDesc s = bucket_step(t, ps, 0, 4);
    for (size_t r = 0; r < 3; ++r) s.tokens[r] = prev ? (*prev)[r].token : 0;
    return s;
  };
  const std::vector<ModelRunner::RowSampling> plain(3);
  std::vector<ModelRunner::SampledRow> a, b;
  for (int32_t t = 0; t < 12; ++t) {  // the same contexts in both caches
    const BatchDesc s = bucket_step(t, ps, 0, 4);
    const size_t R = s.logit_rows.size();
    ASSERT_TRUE(one->forward_sampled(s, {plain.begin(), plain.begin() + ptrdiff_t(R)}, 0, &a));
    ASSERT_TRUE(ahead->forward_sampled(s, {plain.begin(), plain.begin() + ptrdiff_t(R)}, 0, &b));
  }
  std::vector<std::vector<ModelRunner::SampledRow>> want;
  for (int32_t t = 12; t <= 24; ++t) {
    rows[1].step = uint64_t(t);
    set_masks(t);
    std::vector<ModelRunner::SampledRow> w;
    ASSERT_TRUE(one->forward_sampled(step(t, t == 12 ? &a : &want.back()), rows, 2, &w));
    want.push_back(w);
  }
  std::vector<std::vector<ModelRunner::SampledRow>> got;
  ASSERT_TRUE(ahead->launch_forward(step(12, &a), 2, false));
  rows[1].step = 12;
  set_masks(12);
  ahead->sample_launched(rows);
  for (int32_t t = 13; t <= 24; ++t) {
    ASSERT_TRUE(ahead->launch_forward(step(t, nullptr), 2, true)) << "step " << t;
    got.emplace_back();
    ahead->collect_sampled(&got.back());
    rows[1].step = uint64_t(t);
    set_masks(t);
    ahead->sample_launched(rows);
  }
  got.emplace_back();
  ahead->collect_sampled(&got.back());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t r = 0; r < 3; ++r) {
      const int32_t t = int32_t(12 + i), tok = got[i][r].token;
      EXPECT_EQ(tok, want[i][r].token) << "step " << t << " row " << r;
      EXPECT_EQ(got[i][r].logprob, want[i][r].logprob) << "step " << t << " row " << r;
      EXPECT_EQ((int64_t(tok) * 7 + t * 3 + int64_t(r)) % 5, 0)
          << "step " << t << " row " << r << " drew " << tok;
      ASSERT_EQ(got[i][r].top.size(), 2u);
      EXPECT_EQ(got[i][r].top[1].id, want[i][r].top[1].id);
    }
}

TEST(CudaGraph, ReplayEqualsEagerWhileInputsChange) {
  KILN_REQUIRE_GPU();
  run_case(false);
}

TEST(CudaGraph, ReplayEqualsEagerWithPdl) {
  KILN_REQUIRE_GPU();
  run_case(true);
}

// The same with kiln's GEMVs for every projection (serving's batch-1 path), without and with PDL.
TEST(CudaGraph, ReplayEqualsEagerWithGemvTactics) {
  KILN_REQUIRE_GPU();
  const GemvTacticsScope scope;
  ASSERT_TRUE(scope.loaded());
  const cuda::GemmEngine& eng = cuda::gemm_engine();
  const ModelConfig c = tiny_config();
  const int64_t qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  ASSERT_TRUE(eng.gemv_norm_in_choice(1, qkv, c.hidden_size).has_value());
  ASSERT_TRUE(eng.gemv_choice(1, c.vocab_size, c.hidden_size, cuda::GemmOut::f32).has_value());
  const int64_t before = eng.gemv_dispatches();
  run_case(false);
  EXPECT_GT(eng.gemv_dispatches(), before) << "the O, down and LM-head projections ran no GEMV";
  run_case(true);
}

// The batch-1 residual-norm prologue chosen from the whole step (model/cuda_step_choice.h): timed both ways,
// the engine left in the state it reports, and decode graphs captured either way give the same logits bit for
// bit (the choice changes no output).
TEST(CudaGraph, NormPrologueChosenFromTheStepKeepsTheBits) {
  KILN_REQUIRE_GPU();
  const GemvTacticsScope scope;
  ASSERT_TRUE(scope.loaded());
  cuda::GemmEngine& eng = cuda::gemm_engine();
  ASSERT_TRUE(eng.gemv_norm_in_tuned_at(1));
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 5;
  auto m = Qwen3Model::create(tiny_config(), nullptr, o);
  const int ps = 16;
  KvCache probe_cache(m->config(), 4, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  const StepChoice c = cuda_choose_norm_in_by_step(*m, probe_cache, /*pdl=*/true);
  ASSERT_TRUE(c.timed);
  EXPECT_GT(c.with_ms, 0.0);
  EXPECT_GT(c.without_ms, 0.0);
  EXPECT_EQ(eng.gemv_norm_in_off_at(1), !c.norm_in);
  const ModelConfig cfg = tiny_config();
  const int64_t qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
  EXPECT_EQ(eng.gemv_norm_in_choice(1, qkv, cfg.hidden_size).has_value(), c.norm_in);
  const auto steps = [&](bool off) {
    eng.set_gemv_norm_in_off_at(1, off);
    KvCache cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
    CudaDecodeGraph g(*m, cache, 16, 1, {}, /*pdl=*/true);
    std::vector<std::vector<float>> out;
    for (int32_t pos = 0; pos < 20; ++pos)
      out.push_back(test::host_floats(g.step(test::step_batch(pos, (pos * 31 + 7) % 512, ps))));
    return out;
  };
  const auto with = steps(false), without = steps(true);
  eng.set_gemv_norm_in_off_at(1, false);
  EXPECT_TRUE(with == without)
      << "the decode step's logits differ with and without the residual-norm prologue";
}

}  // namespace
}  // namespace kiln
