// EAGLE-3 in the engine on the CPU backend: a small random Qwen3 (6 layers) and a random draft written here.
//   - the target's captured features (Qwen3Model::set_aux_capture): layer 0's are the embeddings, and every
//     block is bitwise the same whether the prompt ran in one step or in chunks;
//   - the ops draft (Eagle3Model) against the f32 reference (Eagle3Draft): outputs within bf16 tolerance, the
//     same top-1 tokens where the reference's top two are apart; a draft KV entry rewritten after a rejected
//     chain reads as if the chain had never run (bitwise);
//   - the engine: greedy tokens with EAGLE-3 equal plain decoding at batch 1 and batched (mixed lengths,
//     chunked prefill, prefix-cache hits), drafts both kept and rejected, the metrics add up per request and
//     engine-wide, the pool is exact afterwards; the off switch turns costly verification off; a runner
//     without a draft is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "common/test_support.h"
#include "eagle3_engine_util.h"
#include "eagle3_test_util.h"
#include "engine_test_util.h"
#include "kiln/safetensors.h"
#include "model/eagle3.h"
#include "model/eagle3_model.h"
#include "model/qwen3.h"
#include "model/weights.h"
#include "runtime/fake_runner.h"
#include "runtime/qwen3_runner.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::base_opts;
using test::draft_over_frequent_tokens;
using test::draft_shape;
using test::kHidden;
using test::kVocab;
using test::mixed_prompts;
using test::Outputs;
using test::run;
using test::scratch;
using test::Sink;
using test::target_dir;
using test::with_eagle;

std::unique_ptr<Qwen3Model> load_target() {
  LoadOptions lo;
  return Qwen3Model::load(target_dir(), lo);
}

BatchDesc seq_batch(const std::vector<int32_t>& tokens, int32_t begin, std::vector<int32_t> logit_rows) {
  return test::one_sequence_batch(tokens, begin, std::move(logit_rows), 4);
}

std::vector<float> widen(const Tensor& t) {
  std::vector<bf16_t> raw(size_t(t.numel()));
  copy_bytes(raw.data(), Device::cpu(), t.data, t.device, raw.size() * 2);
  std::vector<float> out;
  for (bf16_t x : raw) out.push_back(bf16_to_f32(x));
  return out;
}

TEST(Eagle3Engine, CapturedFeaturesAreTheLayersInputsWhateverTheChunking) {
  auto m = load_target();
  m->set_aux_capture({0, 2, 5});
  KvCache cache(m->config(), 16, 4, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 11; ++i) prompt.push_back((i * 37 + 5) % int32_t(kVocab));
  const Tensor logits(nullptr, DType::f32, {0, kVocab}, Device::cpu());
  m->forward(seq_batch(prompt, 0, {}), cache, logits);
  const std::vector<float> whole = widen(m->aux_hidden());
  ASSERT_EQ(whole.size(), prompt.size() * 3 * kHidden);
  // Layer 0's block: the embedding rows.
  const std::vector<float> embed = widen(m->weights().embed);
  for (size_t t = 0; t < prompt.size(); ++t)
    for (int64_t e = 0; e < kHidden; ++e)
      ASSERT_EQ(whole[t * 3 * kHidden + size_t(e)], embed[size_t(prompt[t] * kHidden + e)]) << t << " " << e;
  // In two chunks (6 + 5 rows): the same bits in every block.
  std::vector<float> chunked;
  for (auto [a, n] : {std::pair<int32_t, int32_t>{0, 6}, {6, 5}}) {
    m->forward(seq_batch({prompt.begin() + a, prompt.begin() + a + n}, a, {}), cache, logits);
    const std::vector<float> part = widen(m->aux_hidden());
    chunked.insert(chunked.end(), part.begin(), part.end());
  }
  EXPECT_EQ(chunked, whole);
  // Layer 2's block is not a second copy of the embeddings.
  EXPECT_FALSE(std::equal(whole.begin(), whole.begin() + kHidden, whole.begin() + kHidden));
}

TEST(Eagle3Engine, OpsDraftMatchesTheReferenceAndRewritesRejectedEntries) {
  const fs::path dir = scratch() / "draft_ref";
  test::write_eagle3_draft(dir, draft_shape(40, true));
  auto target = load_target();
  auto model = Eagle3Model::load(dir.string(), *target);
  model->allocate_kv(16, 4, ops::KvLayout::nhd);
  const auto ref = Eagle3Draft::load(dir.string());
  // Features: bf16 values, the same for both.
  const int64_t T = 7, F = 3 * kHidden;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16_t> feat(size_t(T * F));
  std::vector<float> feat_f;
  for (bf16_t& x : feat) {
    x = f32_to_bf16(nd(rng));
    feat_f.push_back(bf16_to_f32(x));
  }
  std::vector<int32_t> tokens, rows, all_rows;
  for (int64_t t = 0; t < T; ++t) {
    tokens.push_back(int32_t((t * 29 + 3) % kVocab));
    rows.push_back(int32_t(T - 1 - t));  // row t takes feature row T - 1 - t
    all_rows.push_back(int32_t(t));
  }
  const Tensor features(feat.data(), DType::bf16, {T, F}, Device::cpu());
  Eagle3Model::Out got;
  model->forward_features(seq_batch(tokens, 0, all_rows), features, rows, &got);
  std::vector<float> feat_rows;
  for (int32_t r : rows)
    feat_rows.insert(feat_rows.end(), feat_f.begin() + r * F, feat_f.begin() + (r + 1) * F);
  Eagle3Kv kv;
  std::vector<float> want, want_logits;
  ref->forward(kv, tokens, ref->project_features(feat_rows), &want, &want_logits);
  auto rel_err = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
  };
  ASSERT_EQ(got.hidden.size(), want.size());
  EXPECT_LE(rel_err(got.hidden, want), 3e-2);
  const int64_t Dv = 40;
  int agree = 0, clear = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(want_logits.begin() + t * Dv, want_logits.begin() + (t + 1) * Dv);
    std::vector<float> sorted = row;
    std::sort(sorted.rbegin(), sorted.rend());
    const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    if (sorted[0] - sorted[1] < 0.05f * (std::fabs(sorted[0]) + 1.0f)) continue;  // a near tie
    ++clear;
    agree += got.tokens[size_t(t)] == ref->target_token(best) ? 1 : 0;
  }
  EXPECT_EQ(agree, clear) << clear << " rows with a clear top-1";
  EXPECT_GT(clear, 0);

  // A chain of two rows at positions 7, 8 (speculative entries), then position 7 computed for real with other
  // inputs: the next row reads what a draft that never chained reads.
  Eagle3Model::Out chain1, chain2;
  const std::vector<float> last(got.hidden.end() - kHidden, got.hidden.end());
  model->forward_hidden(seq_batch({got.tokens.back()}, 7, {0}), last, &chain1);
  model->forward_hidden(seq_batch({chain1.tokens[0]}, 8, {0}), chain1.hidden, &chain2);
  const std::vector<int32_t> real_tok = {int32_t((got.tokens.back() + 1) % kVocab)};
  Eagle3Model::Out after, fresh_after, next, fresh_next;
  model->forward_hidden(seq_batch(real_tok, 7, {0}), last, &after);
  model->forward_hidden(seq_batch({5}, 8, {0}), after.hidden, &next);
  auto fresh = Eagle3Model::load(dir.string(), *target);
  fresh->allocate_kv(16, 4, ops::KvLayout::nhd);
  fresh->forward_features(seq_batch(tokens, 0, all_rows), features, rows, &got);
  fresh->forward_hidden(seq_batch(real_tok, 7, {0}), last, &fresh_after);
  fresh->forward_hidden(seq_batch({5}, 8, {0}), fresh_after.hidden, &fresh_next);
  EXPECT_EQ(next.hidden, fresh_next.hidden);
  EXPECT_EQ(next.tokens, fresh_next.tokens);
}

// Draft passes over sequences seqs[k] (sequence i owns pages 16 i .. 16 i + 15 of page size 4): n rows each
// from position begin[k], tokens tok[k] .. (one per row), the last row's logits; a frozen sequence's rows
// write no K/V (slot -1), as the engine pads a chain that ended.
BatchDesc pages_pass(const std::vector<int32_t>& seqs, const std::vector<int32_t>& begin, int32_t n,
                     const std::vector<int32_t>& tok, const std::vector<bool>& frozen = {}) {
  BatchDesc b;
  b.page_size = 4;
  b.pages_stride = 16;
  b.cu_q = {0};
  for (size_t k = 0; k < seqs.size(); ++k) {
    const int32_t i = seqs[k];
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pos = begin[k] + j;
      b.tokens.push_back((tok[k] + 31 * j) % int32_t(kVocab));
      b.positions.push_back(pos);
      b.slot_mapping.push_back(!frozen.empty() && frozen[k] ? -1 : int64_t(16 * i + pos / 4) * 4 + pos % 4);
    }
    b.logit_rows.push_back(b.cu_q.back() + n - 1);
    b.cu_q.push_back(b.cu_q.back() + n);
    b.kv_lens.push_back(begin[k] + n);
    b.seq_ids.push_back(uint64_t(i + 1));
    for (int32_t p = 0; p < 16; ++p) b.page_table.push_back(16 * i + p);
  }
  return b;
}

// forward_chain (tokens and hidden states kept on the device between passes) drafts what forward_hidden pass
// by pass drafts: three sequences over ten positions of history, a chain of three passes, then a chain where
// sequence 1 ended after one pass (padding rows in the later passes, no K/V written: the pass after reads
// the same cache on both models).
TEST(Eagle3Engine, ChainOnTheDeviceEqualsPassByPass) {
  const fs::path dir = scratch() / "draft_chain";
  test::write_eagle3_draft(dir, draft_shape(40, true));
  auto target = load_target();
  auto stepped = Eagle3Model::load(dir.string(), *target);
  auto chained = Eagle3Model::load(dir.string(), *target);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto bf16_values = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    return v;
  };
  const BatchDesc history = pages_pass({0, 1, 2}, {0, 0, 0}, 10, {3, 7, 11});
  std::vector<bf16_t> feat;
  for (float x : bf16_values(30 * 3 * kHidden)) feat.push_back(f32_to_bf16(x));
  const Tensor features(feat.data(), DType::bf16, {30, 3 * kHidden}, Device::cpu());
  std::vector<int32_t> rows(30);
  std::iota(rows.begin(), rows.end(), 0);
  Eagle3Model::Out h0, h1;
  for (auto* m : {stepped.get(), chained.get()}) m->allocate_kv(48, 4, ops::KvLayout::nhd);
  stepped->forward_features(history, features, rows, &h0);
  chained->forward_features(history, features, rows, &h1);
  ASSERT_EQ(h0.tokens, h1.tokens);

  // Sequences `alive` (by index into {0, 1, 2}) take passes 1 and 2; all three take pass 0.
  const auto chain = [&](int32_t at, const std::vector<bool>& ended) {
    const std::vector<float> hidden = bf16_values(3 * kHidden);
    const std::vector<int32_t> first = {int32_t(rng() % kVocab), int32_t(rng() % kVocab),
                                        int32_t(rng() % kVocab)};
    // Pass by pass: a sequence whose chain ended leaves the batch.
    std::vector<std::vector<int32_t>> want(3);
    std::vector<int32_t> tok = first;
    std::vector<float> h = hidden;
    for (int32_t j = 0; j < 3; ++j) {
      std::vector<int32_t> seqs, begin, in_tok;
      std::vector<float> in_h;
      for (int32_t i = 0; i < 3; ++i) {
        if (j > 0 && ended[size_t(i)]) continue;
        seqs.push_back(i);
        begin.push_back(at + j);
        in_tok.push_back(tok[size_t(i)]);
        in_h.insert(in_h.end(), h.begin() + i * kHidden, h.begin() + (i + 1) * kHidden);
      }
      Eagle3Model::Out out;
      stepped->forward_hidden(pages_pass(seqs, begin, 1, in_tok), in_h, &out);
      for (size_t k = 0; k < seqs.size(); ++k) {
        const int32_t i = seqs[k];
        want[size_t(i)].push_back(out.tokens[k]);
        tok[size_t(i)] = out.tokens[k];
        std::copy(out.hidden.begin() + int64_t(k) * kHidden, out.hidden.begin() + int64_t(k + 1) * kHidden,
                  h.begin() + i * kHidden);
      }
    }
    // On the device: every pass keeps all three rows; an ended chain's row repeats its last position, frozen.
    std::vector<BatchDesc> passes;
    for (int32_t j = 0; j < 3; ++j) {
      std::vector<int32_t> begin;
      std::vector<bool> frozen;
      for (int32_t i = 0; i < 3; ++i) {
        const bool pad = j > 0 && ended[size_t(i)];
        begin.push_back(pad ? at : at + j);
        frozen.push_back(pad);
      }
      passes.push_back(
          pages_pass({0, 1, 2}, begin, 1, j == 0 ? first : std::vector<int32_t>{0, 0, 0}, frozen));
    }
    std::vector<std::vector<int32_t>> got;
    chained->forward_chain(passes, hidden, &got);
    ASSERT_EQ(got.size(), 3u);
    for (int32_t i = 0; i < 3; ++i)
      for (size_t j = 0; j < want[size_t(i)].size(); ++j)
        EXPECT_EQ(got[j][size_t(i)], want[size_t(i)][j]) << "sequence " << i << ", pass " << j;
  };
  chain(10, {false, false, false});
  chain(13, {false, true, false});
  // The next pass over every sequence reads the K/V both models wrote: bitwise the same outputs.
  const std::vector<float> hidden = bf16_values(3 * kHidden);
  Eagle3Model::Out a, b;
  stepped->forward_hidden(pages_pass({0, 1, 2}, {16, 16, 16}, 1, {1, 2, 3}), hidden, &a);
  chained->forward_hidden(pages_pass({0, 1, 2}, {16, 16, 16}, 1, {1, 2, 3}), hidden, &b);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST(Eagle3Engine, GreedyTokensEqualPlainDecoding) {
  const auto prompts = mixed_prompts();
  for (const bool one_at_a_time : {true, false}) {
    const Outputs plain = run(Engine::create(base_opts()), prompts, 20, one_at_a_time);
    const fs::path draft = draft_over_frequent_tokens(plain.tokens, 3);
    const Outputs got =
        run(Engine::create(with_eagle(base_opts(), draft, 3, false)), prompts, 20, one_at_a_time);
    const char* mode = one_at_a_time ? "batch 1" : "batched";
    EXPECT_EQ(got.tokens, plain.tokens) << mode;
    const spec::SpecStats& st = got.stats.spec;
    EXPECT_GT(st.verify_steps, 0) << mode;
    EXPECT_GT(st.accepted_tokens, 0) << mode << ": " << st.draft_tokens << " drafted";
    EXPECT_LT(st.accepted_tokens, st.draft_tokens) << mode;
    EXPECT_LE(st.draft_tokens, 3 * st.drafts) << mode;
    // Where the time went: the draft passes, the decode-only verify steps (their passes inside them).
    EXPECT_GT(st.draft_seconds, 0.0) << mode;
    EXPECT_GT(st.draft_chain_seconds, 0.0) << mode << ": k = 3 chains";
    EXPECT_LT(st.draft_chain_seconds, st.draft_seconds)
        << mode << ": the passes after steps are not in chains";
    EXPECT_GT(st.timed_verify_steps, 0) << mode;
    EXPECT_LE(st.timed_verify_steps, st.verify_steps) << mode;
    EXPECT_GT(st.verify_step_seconds, 0.0) << mode;
    if (one_at_a_time) {  // batched, the steps depend on when the requests arrive
      EXPECT_LT(got.stats.steps, plain.stats.steps);
    }
    test::expect_request_sums(got, mode);
    EXPECT_NEAR(st.mean_acceptance_length(), 1.0 + double(st.accepted_tokens) / double(st.drafts), 1e-12);
    if (one_at_a_time) {
      EXPECT_GT(got.cached[4], 0) << "prompt 4 shares 12 tokens with prompt 0";
    }
    std::printf(
        "%s: %lld steps plain, %lld with EAGLE-3; %lld of %lld drafted tokens kept (acceptance length "
        "%.2f)\n",
        mode, (long long)plain.stats.steps, (long long)got.stats.steps, (long long)st.accepted_tokens,
        (long long)st.draft_tokens, st.mean_acceptance_length());
  }
}

// The engine's chains on the device (the default) and pass by pass (KILN_EAGLE3_DEVICE_CHAIN=0) draft the
// same tokens: the CPU ops give the same bits however rows are grouped, so the counts match exactly, batched
// too (where chains of different lengths leave padding rows in the later passes). So do the uniform passes
// after verify steps that the draft's CUDA graphs replay (KILN_EAGLE3_UNIFORM_EXTEND=1: every sequence k + 1
// rows, those past its kept positions filled at slot -1).
TEST(Eagle3Engine, DeviceChainDraftsWhatPassByPassDrafts) {
  const auto prompts = mixed_prompts();
  for (const bool one_at_a_time : {true, false}) {
    const Outputs plain = run(Engine::create(base_opts()), prompts, 20, one_at_a_time);
    const fs::path draft = draft_over_frequent_tokens(plain.tokens, 4);
    const EngineOptions o = with_eagle(base_opts(), draft, 4, false);
    const Outputs device = run(Engine::create(o), prompts, 20, one_at_a_time);
    ::setenv("KILN_EAGLE3_DEVICE_CHAIN", "0", 1);
    const Outputs stepped = run(Engine::create(o), prompts, 20, one_at_a_time);
    ::unsetenv("KILN_EAGLE3_DEVICE_CHAIN");
    ::setenv("KILN_EAGLE3_UNIFORM_EXTEND", "1", 1);
    const Outputs uniform = run(Engine::create(o), prompts, 20, one_at_a_time);
    ::unsetenv("KILN_EAGLE3_UNIFORM_EXTEND");
    const char* mode = one_at_a_time ? "batch 1" : "batched";
    EXPECT_EQ(uniform.tokens, plain.tokens) << mode;
    EXPECT_GT(uniform.stats.spec.uniform_draft_passes, 0) << mode;
    EXPECT_EQ(device.stats.spec.uniform_draft_passes, 0) << mode;
    EXPECT_EQ(uniform.stats.spec.draft_tokens, device.stats.spec.draft_tokens) << mode;
    EXPECT_EQ(uniform.stats.spec.accepted_tokens, device.stats.spec.accepted_tokens) << mode;
    EXPECT_EQ(device.tokens, plain.tokens) << mode;
    EXPECT_EQ(stepped.tokens, plain.tokens) << mode;
    EXPECT_GT(device.stats.spec.accepted_tokens, 0) << mode;
    EXPECT_EQ(device.stats.spec.draft_tokens, stepped.stats.spec.draft_tokens) << mode;
    EXPECT_EQ(device.stats.spec.accepted_tokens, stepped.stats.spec.accepted_tokens) << mode;
    if (one_at_a_time) {
      EXPECT_EQ(device.stats.spec.draft_passes, stepped.stats.spec.draft_passes);
    }
  }
}

// A CPU runner whose every third chain pass throws (as a draft pass that fails on a device would).
class ChainFailingRunner : public Qwen3Runner {
 public:
  using Qwen3Runner::Qwen3Runner;
  void draft_from_hidden(const BatchDesc& batch, const std::vector<float>& hidden, DraftOut* out) override {
    if (++calls_ % 3 == 0) KILN_FAIL("a chain pass failed on purpose");
    Qwen3Runner::draft_from_hidden(batch, hidden, out);
  }
  void draft_chain(const std::vector<BatchDesc>& passes, const std::vector<float>& hidden,
                   std::vector<std::vector<int32_t>>* tokens) override {
    if (++calls_ % 3 == 0) KILN_FAIL("a chain failed on purpose");
    Qwen3Runner::draft_chain(passes, hidden, tokens);
  }

 private:
  int calls_ = 0;
};

// A failed chain pass leaves its step a plain one: every request still runs to its length with plain
// decoding's tokens, the failures are counted, and the passes that worked still keep drafts. (The step's
// requests used to end with an error: on the H100 at `2f94697` a chain pass of an odd row count threw, and
// the batched requests ended early.)
TEST(Eagle3Engine, FailedChainPassLeavesAPlainStep) {
  const auto prompts = mixed_prompts();
  for (const bool one_at_a_time : {true, false}) {
    const Outputs plain = run(Engine::create(base_opts()), prompts, 20, one_at_a_time);
    const fs::path draft = draft_over_frequent_tokens(plain.tokens, 3);
    const EngineOptions o = with_eagle(base_opts(), draft, 3, false);
    auto target = load_target();
    auto d = Eagle3Model::load(draft.string(), *target);
    auto runner = std::make_unique<ChainFailingRunner>(std::move(target), ops::KvLayout::nhd, DType::bf16);
    runner->set_draft(std::move(d));
    const Outputs got = run(std::make_unique<Engine>(std::move(runner), o), prompts, 20, one_at_a_time);
    const char* mode = one_at_a_time ? "batch 1" : "batched";
    EXPECT_EQ(got.tokens, plain.tokens) << mode;
    EXPECT_GT(got.stats.spec.draft_failures, 0) << mode;
    EXPECT_GT(got.stats.spec.accepted_tokens, 0) << mode;
  }
}

// The drafts the engine verified, replayed offline for batch-1 requests without prefix-cache hits: features
// of the request's final tokens in one target pass, the draft's extend over positions 0 .. N - 2 and its
// chain before each verify step of a sequence of N tokens, the step keeping the drafts that match the tokens
// the engine emitted. The CPU ops give the same bits however rows are grouped, so the engine's drafts are
// these exactly and its drafted and kept counts per request must be these.
struct Replayed {
  int64_t drafted = 0, accepted = 0, rows = 0;
};
Replayed replay_chains(Qwen3Model& target, Eagle3Model& draft, const std::vector<int32_t>& full, int32_t P,
                       int max_new, int k) {
  const int32_t L = int32_t(full.size());
  KvCache cache(target.config(), 64, 4, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  const Tensor no_logits(nullptr, DType::f32, {0, kVocab}, Device::cpu());
  target.forward(seq_batch({full.begin(), full.end() - 1}, 0, {}), cache, no_logits);
  std::vector<bf16_t> aux(size_t(target.aux_hidden().numel()));
  copy_bytes(aux.data(), Device::cpu(), target.aux_hidden().data, Device::cpu(), aux.size() * 2);
  const Tensor features(aux.data(), DType::bf16, {L - 1, 3 * kHidden}, Device::cpu());
  Replayed r;
  int32_t N = P + 1, completion = 1;  // after the prefill's first drawn token
  while (completion < max_new) {
    const int32_t room = max_new - completion;
    if (room <= 1) {
      ++N, ++completion;
      continue;
    }
    const int32_t n = std::min(room - 1, k);
    std::vector<int32_t> rows;
    for (int32_t i = 0; i + 1 < N; ++i) rows.push_back(i);
    Eagle3Model::Out out;
    draft.forward_features(seq_batch({full.begin() + 1, full.begin() + N}, 0, {N - 2}), features, rows, &out);
    std::vector<int32_t> drafts = {out.tokens[0]};
    for (int32_t j = 1; j < n; ++j) {
      draft.forward_hidden(seq_batch({drafts.back()}, N - 2 + j, {0}), out.hidden, &out);
      drafts.push_back(out.tokens[0]);
    }
    int32_t kept = 0;
    while (kept < n && N + kept < L && drafts[size_t(kept)] == full[size_t(N + kept)]) ++kept;
    r.drafted += n;
    r.accepted += kept;
    ++r.rows;
    N += kept + 1;
    completion += kept + 1;
  }
  return r;
}

TEST(Eagle3Engine, DraftsAreTheReferenceChains) {
  const auto prompts = mixed_prompts();
  const Outputs plain = run(Engine::create(base_opts()), prompts, 20, true);
  const fs::path dir = draft_over_frequent_tokens(plain.tokens, 3);
  const Outputs got = run(Engine::create(with_eagle(base_opts(), dir, 3, false)), prompts, 20, true);
  ASSERT_EQ(got.tokens, plain.tokens);
  auto target = load_target();
  auto draft = Eagle3Model::load(dir.string(), *target);
  target->set_aux_capture({1, 3, 4});
  draft->allocate_kv(64, 4, ops::KvLayout::nhd);
  int checked = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (got.cached[i] > 0) continue;  // a cached page's last draft entry saw the caching request's next token
    std::vector<int32_t> full = prompts[i];
    full.insert(full.end(), got.tokens[i].begin(), got.tokens[i].end());
    const Replayed want = replay_chains(*target, *draft, full, int32_t(prompts[i].size()), 20, 3);
    EXPECT_EQ(got.spec[i].draft_tokens, want.drafted) << "prompt " << i;
    EXPECT_EQ(got.spec[i].accepted_tokens, want.accepted) << "prompt " << i;
    EXPECT_EQ(got.spec[i].verify_rows, want.rows) << "prompt " << i;
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

// Sampled, seeded: a request's drafts depend on its own tokens only and its verify draws on its own
// generator, so its tokens are the same alone or batched; and a sharp distribution (temperature 0.3) keeps
// some point drafts.
TEST(Eagle3Engine, SeededSamplingIsIndependentOfTheBatch) {
  const auto prompts = mixed_prompts();
  const Outputs plain = run(Engine::create(base_opts()), prompts, 20, true);
  const EngineOptions o = with_eagle(base_opts(), draft_over_frequent_tokens(plain.tokens, 3), 3, false);
  const Outputs alone = run(Engine::create(o), prompts, 20, true, 0.3f);
  const Outputs batched = run(Engine::create(o), prompts, 20, false, 0.3f);
  EXPECT_EQ(alone.tokens, batched.tokens);
  EXPECT_GT(alone.stats.spec.drafts, 0);
  EXPECT_GT(alone.stats.spec.accepted_tokens, 0);
}

TEST(Eagle3Engine, OffSwitchTurnsCostlyVerificationOff) {
  const auto prompts = mixed_prompts();
  const Outputs plain = run(Engine::create(base_opts()), prompts, 64, true);
  EngineOptions o = with_eagle(base_opts(), draft_over_frequent_tokens(plain.tokens, 3), 3, true);
  o.spec_step_cost = [](bool verify, int32_t) { return verify ? 10.0 : 1.0; };  // verify never pays
  const Outputs got = run(Engine::create(o), prompts, 64, true);
  EXPECT_EQ(got.tokens, plain.tokens);
  EXPECT_GT(got.stats.spec.switched_off, 0);
  EXPECT_LT(got.stats.spec.verify_steps, got.stats.steps / 4);
  // Where it is off the draft does not run either (but around the probes): fewer passes than steps, where
  // always on (or a pass after every step) there are more passes than steps.
  EXPECT_LT(got.stats.spec.draft_passes, got.stats.steps * 3 / 4)
      << got.stats.spec.draft_passes << " draft passes in " << got.stats.steps << " steps";
  o.speculative.off_switch = false;
  const Outputs on = run(Engine::create(o), prompts, 64, true);
  EXPECT_EQ(on.tokens, plain.tokens);
  EXPECT_GT(on.stats.spec.draft_passes, on.stats.steps);
}

TEST(Eagle3Engine, RefusedWithoutADraft) {
  EngineOptions o = test::small_opts(4096, 4, 16);
  o.speculative.algorithm = spec::SpecAlgorithm::eagle3;
  o.speculative.draft_model_path = "/nonexistent/draft";
  try {
    Engine e(std::make_unique<FakeRunner>(3), o);
    FAIL() << "the engine started with EAGLE-3 and no draft";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--speculative-draft-model-path"), std::string::npos)
        << err.what();
  }
  // A draft whose vocabulary is not the target's: the loader names the field.
  test::Eagle3Shape bad = draft_shape(8, false);
  bad.vocab = 300;
  test::write_eagle3_draft(scratch() / "bad_vocab", bad);
  try {
    Engine::create(with_eagle(base_opts(), scratch() / "bad_vocab", 3, false));
    FAIL() << "a draft of another vocabulary loaded";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("vocab_size"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kiln
