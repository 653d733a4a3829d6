// EAGLE-3 on CUDA below the engine, stage by stage: the draft's ops forward (model/eagle3_model.h) on the GPU
// against the same code on the CPU backend (outputs within bf16 tolerance, top-1 tokens equal but for a few
// near ties; a draft vocabulary whose logits end off a 16-byte boundary); through the runner, a target with a
// draft against the same target without one on the same batches (prefill, decode and verify graphs, draft
// passes between steps): the target's logits and KV bit for bit, and its captured features and the draft's
// outputs equal to an eager runner's; the draft's chain passes from CUDA graphs equal to eager passes, bit
// for bit. test_cuda_eagle3_engine: the engine's greedy outputs with EAGLE-3.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "../unit/eagle3_test_util.h"
#include "eagle3_cuda_util.h"
#include "model/eagle3_model.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

using test::same_bits;

BatchDesc seq_batch(const std::vector<int32_t>& tokens, int32_t begin, std::vector<int32_t> logit_rows) {
  return test::one_sequence_batch(tokens, begin, std::move(logit_rows), 16);
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The draft's passes on CUDA against the CPU backend: an extend over T feature rows, then three chain rows
// from its last output. draft_vocab 2: the logits of an odd row count end off a 16-byte boundary, where the
// midlayer outputs' buffer must still start on one (the CUDA gather's stores); the engine's test drafts
// use it.
void check_draft_forward(int64_t draft_vocab) {
  SCOPED_TRACE("draft vocabulary " + std::to_string(draft_vocab));
  const fs::path dir = test::eagle3_scratch() / ("draft_v" + std::to_string(draft_vocab));
  test::write_eagle3_draft(dir, test::eagle3_draft_shape(draft_vocab, true));
  auto cpu_target = test::eagle3_target(Device::cpu());
  auto gpu_target = test::eagle3_target(Device::cuda());
  auto cpu = Eagle3Model::load(dir.string(), *cpu_target);
  auto gpu = Eagle3Model::load(dir.string(), *gpu_target);
  cpu->allocate_kv(8, 16, ops::KvLayout::nhd);
  gpu->allocate_kv(8, 16, ops::KvLayout::hnd);
  const int64_t T = 21, F = 3 * 256;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16_t> feat(size_t(T * F));
  for (bf16_t& x : feat) x = f32_to_bf16(nd(rng));
  Buffer dev_feat(feat.size() * 2, Device::cuda());
  copy_bytes(dev_feat.data(), Device::cuda(), feat.data(), Device::cpu(), feat.size() * 2);
  std::vector<int32_t> tokens, rows;
  for (int64_t t = 0; t < T; ++t) {
    tokens.push_back(int32_t((t * 41 + 7) % 500));
    rows.push_back(int32_t(t));
  }
  Eagle3Model::Out want, got;
  cpu->forward_features(seq_batch(tokens, 0, rows), Tensor(feat.data(), DType::bf16, {T, F}, Device::cpu()),
                        rows, &want);
  gpu->forward_features(seq_batch(tokens, 0, rows),
                        Tensor(dev_feat.data(), DType::bf16, {T, F}, Device::cuda()), rows, &got);
  EXPECT_LE(rel_err(got.hidden, want.hidden), 2e-2);
  int differ = 0;
  for (int64_t t = 0; t < T; ++t) differ += got.tokens[size_t(t)] != want.tokens[size_t(t)] ? 1 : 0;
  // Rounding may flip a near tie of the top two (a broken pass of 64 draft ids would agree on about 1 row in
  // 64; of 2, on about half).
  EXPECT_LE(differ, draft_vocab > 2 ? T / 5 : T / 4) << "top-1 tokens of " << T << " rows";
  // Three chain rows from the last output, each device from its own previous output.
  std::vector<float> hc(want.hidden.end() - 256, want.hidden.end()),
      hg(got.hidden.end() - 256, got.hidden.end());
  int32_t tc = want.tokens.back();  // the same token into both
  for (int32_t j = 0; j < 3; ++j) {
    Eagle3Model::Out oc, og;
    cpu->forward_hidden(seq_batch({tc}, int32_t(T) + j, {0}), hc, &oc);
    gpu->forward_hidden(seq_batch({tc}, int32_t(T) + j, {0}), hg, &og);
    EXPECT_LE(rel_err(og.hidden, oc.hidden), 3e-2) << "chain row " << j;
    hc = oc.hidden, hg = og.hidden, tc = oc.tokens[0];
  }
}

TEST(CudaEagle3, DraftForwardMatchesTheCpuBackend) {
  KILN_REQUIRE_GPU();
  check_draft_forward(64);
}

// Fails before the midlayer outputs were placed on a 16-byte boundary: every pass of an odd row count threw
// (embedding_gather's alignment check), so the engine drafted nothing at batch 1 (H100, 2026-12-06,
// `2f94697`) and a batched step whose chain pass had an odd row count ended its requests.
TEST(CudaEagle3, DraftForwardOfOddRowsAndASmallDraftVocabulary) {
  KILN_REQUIRE_GPU();
  check_draft_forward(2);
}

// KILN_EAGLE3_CUDA=0 switches EAGLE-3 off on CUDA: set_draft refuses it naming the switch and the
// alternative.
TEST(CudaEagle3, SwitchedOffOnCudaSetDraftRefusesByName) {
  KILN_REQUIRE_GPU();
  const test::ScopedEnv off("KILN_EAGLE3_CUDA", "0");
  const fs::path draft = test::eagle3_scratch() / "draft_refused";
  test::write_eagle3_draft(draft, test::eagle3_draft_shape(2, false), "", {1, 2}, 3);
  auto runner =
      std::make_unique<Qwen3Runner>(test::eagle3_target(Device::cuda()), ops::KvLayout::hnd, DType::bf16);
  try {
    runner->set_draft(Eagle3Model::load(draft.string(), runner->model()));
    FAIL() << "set_draft accepted an EAGLE-3 draft on CUDA with KILN_EAGLE3_CUDA=0";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_EAGLE3_CUDA"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NGRAM"), std::string::npos) << e.what();
  }
}

// ---- Through the runner: a target with a draft against the same target without one.

// Sequence i of a runner test owns pages 1 + kPagesPerSeq i, ...; its tokens are toks[i] (prompt, then the
// tokens the test feeds as if drawn).
constexpr int32_t kPageSize = 16, kPagesPerSeq = 8;
constexpr int32_t kMaxExtendQ = 4;  // the graphed draft's longest uniform extend pass (the engine's k + 1)

int32_t slot_of(int32_t seq, int32_t pos) {
  return (1 + kPagesPerSeq * seq + pos / kPageSize) * kPageSize + pos % kPageSize;
}

// A batch where sequence i computes q[i] rows at begin[i] .., the first real[i] real (the rest fill rows:
// token 0, slot -1), with logits at every row (all_logits) or at each sequence's last real row. A row at
// position p takes token p + shift: 0 for the target's steps, 1 for the draft's passes (engine_eagle3.cpp).
BatchDesc rows_batch(const std::vector<std::vector<int32_t>>& toks, const std::vector<int32_t>& begin,
                     const std::vector<int32_t>& q, const std::vector<int32_t>& real, bool all_logits,
                     int32_t shift = 0) {
  BatchDesc b;
  b.page_size = kPageSize;
  b.pages_stride = kPagesPerSeq;
  b.cu_q = {0};
  for (size_t i = 0; i < toks.size(); ++i) {
    for (int32_t j = 0; j < q[i]; ++j) {
      const int32_t pos = begin[i] + j;
      const bool is_real = j < real[i];
      b.tokens.push_back(is_real ? toks[i][size_t(pos + shift)] : 0);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(is_real ? slot_of(int32_t(i), pos) : -1);
      if (all_logits || j + 1 == real[i]) b.logit_rows.push_back(b.cu_q.back() + j);
    }
    b.cu_q.push_back(b.cu_q.back() + q[i]);
    b.kv_lens.push_back(begin[i] + q[i]);
    b.seq_ids.push_back(uint64_t(i + 1));
    for (int32_t p = 0; p < kPagesPerSeq; ++p) b.page_table.push_back(1 + kPagesPerSeq * int32_t(i) + p);
  }
  return b;
}

// A draft pass: sequence i's rows at begin[i] .. begin[i] + n[i] - 1, its last row's logits.
BatchDesc draft_batch(const std::vector<std::vector<int32_t>>& toks, const std::vector<int32_t>& begin,
                      const std::vector<int32_t>& n) {
  return rows_batch(toks, begin, n, n, false, 1);
}

// The target's K and V of sequence i's positions [0, len[i]) in every layer (HND bf16 cache), as bits.
std::vector<uint16_t> target_kv(Qwen3Runner& r, const std::vector<int32_t>& len) {
  std::vector<uint16_t> out;
  KvCache& c = r.cache();
  for (int l = 0; l < c.num_layers(); ++l) {
    const ops::KvCacheView v = c.layer(l);
    for (const Tensor* t : {&v.k, &v.v}) {
      std::vector<uint16_t> all(size_t(t->numel()));
      copy_bytes(all.data(), Device::cpu(), t->data, t->device, all.size() * 2);
      const int64_t hkv = t->shape[1], D = t->shape[3];  // [pages, Hkv, page_size, D]
      for (size_t i = 0; i < len.size(); ++i)
        for (int32_t pos = 0; pos < len[i]; ++pos) {
          const int32_t slot = slot_of(int32_t(i), pos), page = slot / kPageSize, off = slot % kPageSize;
          for (int64_t h = 0; h < hkv; ++h) {
            const size_t at = size_t(((page * hkv + h) * kPageSize + off) * D);
            out.insert(out.end(), all.begin() + ptrdiff_t(at), all.begin() + ptrdiff_t(at + size_t(D)));
          }
        }
    }
  }
  return out;
}

// The captured features of the given rows of the runner's last step, as bits.
std::vector<uint16_t> features(Qwen3Runner& r, const std::vector<int32_t>& rows) {
  const Tensor f = r.model().aux_hidden();
  std::vector<uint16_t> all(size_t(f.numel()));
  copy_bytes(all.data(), Device::cpu(), f.data, f.device, all.size() * 2);
  std::vector<uint16_t> out;
  for (int32_t row : rows)
    out.insert(out.end(), all.begin() + ptrdiff_t(row * f.shape[1]),
               all.begin() + ptrdiff_t((row + 1) * f.shape[1]));
  return out;
}

std::unique_ptr<Qwen3Runner> stage_runner(const fs::path& draft, bool graphs) {
  auto r =
      std::make_unique<Qwen3Runner>(test::eagle3_target(Device::cuda()), ops::KvLayout::hnd, DType::bf16);
  if (!draft.empty()) r->set_draft(Eagle3Model::load(draft.string(), r->model()));
  r->allocate_kv(1 + 2 * kPagesPerSeq, kPageSize);
  if (graphs) {
    ModelRunner::GraphPlan plan;
    plan.buckets = {1, 2, 4};
    plan.max_pages_per_seq = kPagesPerSeq;
    plan.max_step_tokens = 64;
    plan.max_seqs = 4;
    plan.verify_rows_per_seq = 4;
    r->prepare_graphs(plan);
  }
  return r;
}

// Stage by stage, two sequences: `plain` (no draft) and `spec` (a draft, its features captured inside the
// decode and verify graphs, draft passes after every step and chains before every verify step) run the same
// target steps: prefill (eager), a decode step and six verify steps of 4 rows (1 to 4 real, the rest fill
// rows) replayed from graphs. After every step and every draft pass: spec's logits and target KV are plain's
// bit for bit (the draft touches nothing of the target's); spec's features and draft outputs are those of
// `eager` (the same draft, no graphs: the features captured inside a graph are the eager step's). The first
// stage that breaks is named.
TEST(CudaEagle3, DraftPassesLeaveTheTargetBitwiseAndGraphFeaturesEqualEager) {
  KILN_REQUIRE_GPU();
  const test::ScopedEnv eagle3_on("KILN_EAGLE3_CUDA", "1");
  const fs::path draft = test::eagle3_scratch() / "draft_stages";
  test::write_eagle3_draft(draft, test::eagle3_draft_shape(2, false), "", {7, 300}, 3);
  // The draft first: its load tunes its GEMM shapes, so all three runners capture with the same tactics.
  auto spec = stage_runner(draft, true), eager = stage_runner(draft, false), plain = stage_runner({}, true);
  const int64_t V = 512;
  const std::vector<int32_t> prompt_len = {21, 13};
  std::vector<std::vector<int32_t>> toks(2);
  for (int32_t i = 0; i < 2; ++i)
    for (int32_t j = 0; j < 64; ++j) toks[size_t(i)].push_back((i * 131 + j * 37 + 3) % 500);
  std::vector<int32_t> pos = {0, 0};
  std::string stage;
  // One target step on all three runners: logits and KV against plain's, features against eager's.
  const auto run_step = [&](const BatchDesc& b, const std::vector<int32_t>& real_rows) {
    std::vector<float> lp, ls, le;
    plain->forward(b, &lp, nullptr);
    spec->forward(b, &ls, nullptr);
    eager->forward(b, &le, nullptr);
    std::vector<int32_t> after = pos;
    for (size_t i = 0; i < 2; ++i)
      for (int32_t j = b.cu_q[i]; j < b.cu_q[i + 1]; ++j)
        if (b.slot_mapping[size_t(j)] >= 0) after[i] = std::max(after[i], b.positions[size_t(j)] + 1);
    // Logits of real rows only (fill rows' logits are nobody's).
    std::vector<float> rp, rs, re;
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      if (b.slot_mapping[size_t(b.logit_rows[r])] < 0) continue;
      rp.insert(rp.end(), lp.begin() + ptrdiff_t(r * V), lp.begin() + ptrdiff_t((r + 1) * V));
      rs.insert(rs.end(), ls.begin() + ptrdiff_t(r * V), ls.begin() + ptrdiff_t((r + 1) * V));
      re.insert(re.end(), le.begin() + ptrdiff_t(r * V), le.begin() + ptrdiff_t((r + 1) * V));
    }
    EXPECT_TRUE(same_bits(rs, rp)) << stage << ": the target's logits with a draft differ from without";
    EXPECT_TRUE(same_bits(re, rs)) << stage << ": the eager runner's logits differ from the graph's";
    EXPECT_TRUE(target_kv(*spec, after) == target_kv(*plain, after))
        << stage << ": the target's KV with a draft differs from without";
    EXPECT_TRUE(features(*spec, real_rows) == features(*eager, real_rows))
        << stage << ": the features captured in the step differ from the eager runner's";
  };
  // The draft pass after a step over `n` positions a sequence from `begin`, then a chain of two passes from
  // its outputs, on spec and eager: their outputs equal, the target's KV untouched.
  const auto run_draft = [&](const std::vector<int32_t>& begin, const std::vector<int32_t>& n,
                             const std::vector<int32_t>& step_rows) {
    const BatchDesc db = draft_batch(toks, begin, n);
    Eagle3Model::Out os, oe;
    spec->draft_from_step(db, step_rows, &os);
    eager->draft_from_step(db, step_rows, &oe);
    EXPECT_EQ(os.tokens, oe.tokens) << stage << ": draft tokens from the step's features";
    EXPECT_TRUE(same_bits(os.hidden, oe.hidden)) << stage << ": draft outputs from the step's features";
    for (int32_t j = 1; j <= 2; ++j) {
      std::vector<int32_t> cb = {pos[0] + j - 1, pos[1] + j - 1}, one = {1, 1};
      const BatchDesc chain = draft_batch(toks, cb, one);
      Eagle3Model::Out cs, ce;
      spec->draft_from_hidden(chain, os.hidden, &cs);
      eager->draft_from_hidden(chain, oe.hidden, &ce);
      EXPECT_EQ(cs.tokens, ce.tokens) << stage << ": chain pass " << j << " tokens";
      EXPECT_TRUE(same_bits(cs.hidden, ce.hidden)) << stage << ": chain pass " << j << " outputs";
      os = cs, oe = ce;
    }
    EXPECT_TRUE(target_kv(*spec, pos) == target_kv(*plain, pos))
        << stage << ": the draft passes changed the target's KV";
  };
  stage = "prefill";
  {
    const BatchDesc b = rows_batch(toks, pos, prompt_len, prompt_len, false);
    std::vector<int32_t> rows;
    for (int32_t t = 0; t < b.num_tokens(); ++t) rows.push_back(t);
    run_step(b, rows);
    pos = prompt_len;
    stage = "draft pass after the prefill";
    run_draft({0, 0}, prompt_len, rows);
  }
  ASSERT_FALSE(HasFailure()) << "first failing stage: " << stage;
  stage = "decode step (graph)";
  {
    const BatchDesc b = rows_batch(toks, pos, {1, 1}, {1, 1}, true);
    ASSERT_GT(spec->graph_bucket(b), 0);
    run_step(b, {0, 1});
    const std::vector<int32_t> begin = pos;
    pos = {pos[0] + 1, pos[1] + 1};
    stage = "draft pass after the decode step";
    run_draft(begin, {1, 1}, {0, 1});
  }
  ASSERT_FALSE(HasFailure()) << "first failing stage: " << stage;
  for (int32_t t = 0; t < 6; ++t) {
    stage = "verify step " + std::to_string(t) + " (graph)";
    const std::vector<int32_t> real = {1 + t % 4, 1 + (t + 2) % 4};
    const BatchDesc b = rows_batch(toks, pos, {4, 4}, real, true);
    ASSERT_TRUE(is_uniform_verify(b, 4));
    std::vector<int32_t> rows;
    for (int32_t i = 0; i < 2; ++i)
      for (int32_t j = 0; j < real[size_t(i)]; ++j) rows.push_back(4 * i + j);
    run_step(b, rows);
    const std::vector<int32_t> begin = pos;
    pos = {pos[0] + real[0], pos[1] + real[1]};
    stage = "draft pass after verify step " + std::to_string(t);
    run_draft(begin, real, rows);
    ASSERT_FALSE(HasFailure()) << "first failing stage: " << stage;
  }
  EXPECT_GT(spec->verify_graph_replays(), 0);
}

// ---- The draft's chain passes from CUDA graphs (Eagle3Model::prepare_draft_graphs).

// The chain pass `b` (one row per sequence) padded to `bucket` sequences as the chain graphs pad it: token 0
// at slot -1, one key of page 0, page-table rows of page 0.
BatchDesc padded_chain_pass(BatchDesc b, int32_t bucket) {
  for (int32_t i = b.num_seqs(); i < bucket; ++i) {
    b.tokens.push_back(0);
    b.positions.push_back(0);
    b.slot_mapping.push_back(-1);
    b.cu_q.push_back(i + 1);
    b.kv_lens.push_back(1);
    b.logit_rows.push_back(i);
    b.seq_ids.push_back(0);
    b.page_table.insert(b.page_table.end(), size_t(b.pages_stride), 0);
  }
  return b;
}

// Two drafts of the same weights (written to `name` in the scratch folder) beside one target, each with the
// KV of 4 sequences: `graphed` with the draft's graphs (buckets 1, 2, 4; one width), `eager` without.
struct GraphedAndEager {
  explicit GraphedAndEager(const char* name) {
    const fs::path dir = test::eagle3_scratch() / name;
    test::write_eagle3_draft(dir, test::eagle3_draft_shape(64, true));
    graphed = Eagle3Model::load(dir.string(), *target);
    eager = Eagle3Model::load(dir.string(), *target);
    for (auto* m : {graphed.get(), eager.get()})
      m->allocate_kv(1 + 4 * kPagesPerSeq, kPageSize, ops::KvLayout::hnd);
    graphed->prepare_draft_graphs({1, 2, 4}, {kPagesPerSeq}, kMaxExtendQ);
  }
  std::unique_ptr<Qwen3Model> target = test::eagle3_target(Device::cuda());
  std::unique_ptr<Eagle3Model> graphed, eager;
};

// Four sequences' tokens (i a + j b + c) % 500 for positions up to 120 (the graph tests feed up to ~72).
std::vector<std::vector<int32_t>> graph_test_tokens(int32_t a, int32_t b, int32_t c) {
  std::vector<std::vector<int32_t>> toks(4);
  for (int32_t i = 0; i < 4; ++i)
    for (int32_t j = 0; j < 120; ++j) toks[size_t(i)].push_back((i * a + j * b + c) % 500);
  return toks;
}

// Chains of three passes replayed from the draft's graphs (buckets 1, 2, 4; one width) against the same
// chains run eagerly (forward_chain without graphs), padded to the same bucket, on a second draft of the same
// weights: the real rows' tokens bit for bit, while every input changes between replays (1 to 4 sequences, 3
// of them padded to 4; positions, first tokens, hidden states), each pass reading the K/V the one before
// wrote, and an extend pass between replays growing the workspace (the graphs captured again).
// (ChainOnTheDeviceEqualsPassByPass ties the eager chain to forward_hidden pass by pass.)
TEST(CudaEagle3, ChainGraphEqualsEagerChain) {
  KILN_REQUIRE_GPU();
  GraphedAndEager d("draft_chain_graphs");
  Eagle3Model *graphed = d.graphed.get(), *eager = d.eager.get();
  const int64_t H = 256, F = 3 * 256;
  constexpr int32_t kPasses = 3;
  const std::vector<std::vector<int32_t>> toks = graph_test_tokens(97, 29, 5);
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> pos = {0, 0, 0, 0};
  // An extend pass over n positions of every sequence (eager on both drafts): the chains attend to them.
  const auto extend = [&](int32_t n) {
    const std::vector<int32_t> ns(4, n);
    const BatchDesc b = draft_batch(toks, pos, ns);
    std::vector<bf16_t> feat(size_t(b.num_tokens() * F));
    for (bf16_t& x : feat) x = f32_to_bf16(nd(rng));
    const Buffer dev = test::to_device(feat);
    std::vector<int32_t> rows;
    for (int32_t t = 0; t < b.num_tokens(); ++t) rows.push_back(t);
    const Tensor f(dev.data(), DType::bf16, {b.num_tokens(), F}, Device::cuda());
    Eagle3Model::Out a, e;
    graphed->forward_features(b, f, rows, &a);
    eager->forward_features(b, f, rows, &e);
    EXPECT_TRUE(same_bits(a.hidden, e.hidden)) << "extend pass";
    for (int32_t& p : pos) p += n;
  };
  extend(9);
  for (int32_t t = 0; t < 12; ++t) {
    SCOPED_TRACE("chain " + std::to_string(t));
    if (t == 6) extend(24);  // more rows than any chain pass: the workspace grows, the graphs recapture
    const int32_t B = 1 + (t * 3) % 4, bucket = B == 3 ? 4 : B;
    const std::vector<std::vector<int32_t>> seqs(toks.begin(), toks.begin() + B);
    std::vector<BatchDesc> passes, padded;
    for (int32_t j = 0; j < kPasses; ++j) {
      std::vector<int32_t> begin(pos.begin(), pos.begin() + B);
      for (int32_t& p : begin) p += j;
      passes.push_back(draft_batch(seqs, begin, std::vector<int32_t>(size_t(B), 1)));
      padded.push_back(padded_chain_pass(passes.back(), bucket));
    }
    std::vector<float> hidden(size_t(B * H));
    for (float& x : hidden) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    std::vector<float> padded_hidden = hidden;
    padded_hidden.resize(size_t(bucket * H), 0.0f);
    std::vector<std::vector<int32_t>> g, e;
    graphed->forward_chain(passes, hidden, &g);
    eager->forward_chain(padded, padded_hidden, &e);
    ASSERT_EQ(g.size(), size_t(kPasses));
    ASSERT_EQ(e.size(), size_t(kPasses));
    for (int32_t j = 0; j < kPasses; ++j) {
      ASSERT_EQ(g[size_t(j)].size(), size_t(B));
      e[size_t(j)].resize(size_t(B));
      EXPECT_EQ(g[size_t(j)], e[size_t(j)])
          << "pass " << j << ", " << B << " sequences in a bucket of " << bucket;
    }
    for (int32_t i = 0; i < B; ++i) pos[size_t(i)] += kPasses;
  }
  EXPECT_EQ(graphed->num_chain_graphs(), 3) << "a graph per bucket (one width, one pass count)";
  EXPECT_EQ(graphed->num_extend_graphs(), 0)
      << "extend passes of 9 and 24 rows (above kMaxExtendQ) are eager";
  EXPECT_EQ(eager->num_chain_graphs() + eager->num_extend_graphs(), 0);
}

// The uniform pass after a verify step (q = 4 rows a sequence, its first n real, the rest fill rows at slot
// -1; one logit row at its last real row) replayed from the draft's extend graphs (buckets 1, 2, 4) against
// the same pass run eagerly, padded as the graphs pad it (q fill rows a padding sequence reading feature row
// 0, its logit row the last): the real rows' tokens and outputs bit for bit, while the inputs change between
// replays (1 to 4 sequences, 1 to 4 real rows each, positions, features, the features' buffer). topk: the
// draft's top k pass by pass (both drafts; a change captures the graph again), whose Out::topk_* must match
// bit for bit too.
void check_extend_graph(const char* name, const std::vector<int>& topk) {
  GraphedAndEager d(name);
  Eagle3Model *graphed = d.graphed.get(), *eager = d.eager.get();
  const int64_t H = 256, F = 3 * 256;
  constexpr int32_t q = kMaxExtendQ;
  const std::vector<std::vector<int32_t>> toks = graph_test_tokens(83, 41, 11);
  std::mt19937 rng(33);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> pos = {0, 0, 0, 0};
  for (int32_t t = 0; t < int32_t(topk.size()); ++t) {
    const int k = topk[size_t(t)];
    SCOPED_TRACE("extend pass " + std::to_string(t) + ", top " + std::to_string(k));
    graphed->set_topk(k);
    eager->set_topk(k);
    const int32_t B = 1 + (t * 3) % 4, bucket = B == 3 ? 4 : B;
    const std::vector<std::vector<int32_t>> seqs(toks.begin(), toks.begin() + B);
    const std::vector<int32_t> begin(pos.begin(), pos.begin() + B);
    std::vector<int32_t> real(static_cast<size_t>(B));
    for (int32_t i = 0; i < B; ++i) real[size_t(i)] = 1 + (t + i) % q;
    const BatchDesc b = rows_batch(seqs, begin, std::vector<int32_t>(size_t(B), q), real, false, 1);
    ASSERT_EQ(b.logit_rows.size(), size_t(B));
    BatchDesc padded = b;
    for (int32_t i = B; i < bucket; ++i) {
      for (int32_t j = 0; j < q; ++j) {
        padded.tokens.push_back(0);
        padded.positions.push_back(j);
        padded.slot_mapping.push_back(-1);
      }
      padded.logit_rows.push_back(padded.cu_q.back() + q - 1);
      padded.cu_q.push_back(padded.cu_q.back() + q);
      padded.kv_lens.push_back(q);
      padded.seq_ids.push_back(0);
      padded.page_table.insert(padded.page_table.end(), size_t(padded.pages_stride), 0);
    }
    // Features [bucket * q, F]: the graphed pass reads rows 0 .. B q - 1, padding rows row 0 (the eager one
    // the copies of row 0 past B q). A new buffer every pass: a graph whose features moved is captured again.
    std::vector<bf16_t> feat(size_t(bucket * q * F));
    for (bf16_t& x : feat) x = f32_to_bf16(nd(rng));
    for (int64_t r = int64_t(B) * q; r < int64_t(bucket) * q; ++r)
      std::copy_n(feat.begin(), F, feat.begin() + r * F);
    const Buffer dev = test::to_device(feat);
    const Tensor f(dev.data(), DType::bf16, {int64_t(bucket) * q, F}, Device::cuda());
    std::vector<int32_t> rows(size_t(B * q)), padded_rows(size_t(bucket * q));
    for (size_t r = 0; r < rows.size(); ++r) rows[r] = int32_t(r);
    for (size_t r = 0; r < padded_rows.size(); ++r) padded_rows[r] = r < rows.size() ? int32_t(r) : 0;
    Eagle3Model::Out g, e;
    graphed->forward_features(b, f, rows, &g);
    eager->forward_features(padded, f, padded_rows, &e);
    ASSERT_EQ(g.tokens.size(), size_t(B));
    e.tokens.resize(size_t(B));
    e.hidden.resize(size_t(B * H));
    EXPECT_EQ(g.tokens, e.tokens) << B << " sequences in a bucket of " << bucket;
    EXPECT_TRUE(same_bits(g.hidden, e.hidden)) << B << " sequences in a bucket of " << bucket;
    ASSERT_EQ(g.topk_tokens.size(), k > 1 ? size_t(B * k) : 0);
    e.topk_tokens.resize(g.topk_tokens.size());
    e.topk_logprobs.resize(g.topk_logprobs.size());
    EXPECT_EQ(g.topk_tokens, e.topk_tokens) << B << " sequences in a bucket of " << bucket;
    EXPECT_TRUE(same_bits(g.topk_logprobs, e.topk_logprobs)) << B << " sequences in a bucket of " << bucket;
    for (int32_t i = 0; i < B; ++i) pos[size_t(i)] += real[size_t(i)];
  }
  EXPECT_EQ(graphed->num_extend_graphs(), 3) << "an extend graph per bucket (one width, one q)";
  EXPECT_EQ(graphed->num_chain_graphs(), 0);
  EXPECT_EQ(eager->num_chain_graphs() + eager->num_extend_graphs(), 0);
}

TEST(CudaEagle3, ExtendGraphEqualsEagerExtend) {
  KILN_REQUIRE_GPU();
  check_extend_graph("draft_extend_graphs", std::vector<int>(12, 1));
}

// The same with the draft's top k changing between passes (4, 2, 1, 16): each change captures the extend
// graphs again (their launches and output layout follow k), and every replay's top k is the eager pass's.
TEST(CudaEagle3, ExtendGraphWithTopkEqualsEagerExtend) {
  KILN_REQUIRE_GPU();
  check_extend_graph("draft_extend_graphs_topk", {4, 4, 4, 4, 2, 2, 2, 1, 1, 16, 16, 16, 4, 4});
}

// A uniform pass (2 rows a sequence, one logit row each: an extend graph's shape) that carries a token tree
// runs eagerly: no extend graph is captured for it.
TEST(CudaEagle3, TreePassesTakeNoDraftGraph) {
  KILN_REQUIRE_GPU();
  GraphedAndEager d("draft_tree_no_graph");
  const std::vector<std::vector<int32_t>> toks = graph_test_tokens(83, 41, 11);
  BatchDesc b = rows_batch({toks[0], toks[1]}, {0, 0}, {2, 2}, {2, 2}, false, 1);
  ASSERT_EQ(b.logit_rows.size(), 2u);
  b.tree_window = {2, 2};
  b.tree_mask = {1, 3, 1, 3};  // chain masks: the causal rows
  std::vector<bf16_t> feat(size_t(4 * 3 * 256), f32_to_bf16(0.5f));
  const Buffer dev = test::to_device(feat);
  const std::vector<int32_t> rows = {0, 1, 2, 3};
  Eagle3Model::Out o;
  d.graphed->forward_features(b, Tensor(dev.data(), DType::bf16, {4, 3 * 256}, Device::cuda()), rows, &o);
  EXPECT_EQ(o.tokens.size(), 2u);
  EXPECT_EQ(d.graphed->num_extend_graphs(), 0);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// forward_chain on CUDA (tokens and hidden states kept on the device between passes) equals forward_hidden
// pass by pass, bit for bit: the same launches over the same rows, with the same bf16 values in (the host
// round trip widens and rounds back exactly). Three sequences after a 9-position extend, chains of 3 passes.
TEST(CudaEagle3, ChainOnTheDeviceEqualsPassByPass) {
  KILN_REQUIRE_GPU();
  const fs::path dir = test::eagle3_scratch() / "draft_device_chain";
  test::write_eagle3_draft(dir, test::eagle3_draft_shape(64, true));
  auto target = test::eagle3_target(Device::cuda());
  auto stepped = Eagle3Model::load(dir.string(), *target);
  auto chained = Eagle3Model::load(dir.string(), *target);
  for (auto* m : {stepped.get(), chained.get()})
    m->allocate_kv(1 + 3 * kPagesPerSeq, kPageSize, ops::KvLayout::hnd);
  const int64_t H = 256, F = 3 * 256;
  std::vector<std::vector<int32_t>> toks(3);
  for (int32_t i = 0; i < 3; ++i)
    for (int32_t j = 0; j < 64; ++j) toks[size_t(i)].push_back((i * 89 + j * 31 + 7) % 500);
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  {
    const BatchDesc b = draft_batch(toks, {0, 0, 0}, {9, 9, 9});
    std::vector<bf16_t> feat(size_t(b.num_tokens() * F));
    for (bf16_t& x : feat) x = f32_to_bf16(nd(rng));
    const Buffer dev = test::to_device(feat);
    std::vector<int32_t> rows;
    for (int32_t t = 0; t < b.num_tokens(); ++t) rows.push_back(t);
    const Tensor f(dev.data(), DType::bf16, {b.num_tokens(), F}, Device::cuda());
    Eagle3Model::Out a, e;
    stepped->forward_features(b, f, rows, &a);
    chained->forward_features(b, f, rows, &e);
    ASSERT_TRUE(same_bits(a.hidden, e.hidden));
  }
  for (int32_t round = 0; round < 2; ++round) {
    SCOPED_TRACE("chain " + std::to_string(round));
    const int32_t at = 9 + 3 * round;
    std::vector<float> hidden(size_t(3 * H));
    for (float& x : hidden) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    std::vector<std::vector<int32_t>> want;
    std::vector<BatchDesc> passes;
    std::vector<float> h = hidden;
    for (int32_t j = 0; j < 3; ++j) {
      BatchDesc b = draft_batch(toks, {at + j, at + j, at + j}, {1, 1, 1});
      if (j > 0)
        for (size_t r = 0; r < 3; ++r) b.tokens[r] = want.back()[r];
      Eagle3Model::Out o;
      stepped->forward_hidden(b, h, &o);
      want.push_back(o.tokens);
      h = o.hidden;
      if (j > 0)
        for (int32_t& t : b.tokens) t = 0;  // the chain ignores them: pass j takes pass j - 1's tokens
      passes.push_back(b);
    }
    std::vector<std::vector<int32_t>> got;
    chained->forward_chain(passes, hidden, &got);
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace kiln
