// EAGLE-3 on CUDA: the draft's ops forward (model/eagle3_model.h) on the GPU against the same code on the CPU
// backend (outputs within bf16 tolerance, top-1 tokens equal but for a few near ties), and the engine's
// greedy output with EAGLE-3 (features captured inside the decode and verify graphs) equal to its plain
// greedy output except where the plain path's top two log-probs are a near tie (test_cuda_verify_graph's
// rule).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "../unit/eagle3_test_util.h"
#include "../unit/engine_test_util.h"
#include "common/test_support.h"
#include "greedy_parity_util.h"
#include "model/eagle3_model.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config() {
  ModelConfig c = test::tiny_graph_config();
  c.num_layers = 6;  // the draft reads layers 1, 3 and 4
  c.max_position_embeddings = 512;
  c.eos_token_ids = {511};
  return c;
}

std::unique_ptr<Qwen3Model> tiny_target(Device d) {
  LoadOptions o;
  o.device = d;
  o.seed = 9;
  return Qwen3Model::create(tiny_config(), nullptr, o);
}

test::Eagle3Shape draft_shape(int64_t draft_vocab, bool own_embeddings) {
  test::Eagle3Shape s;
  s.hidden = 256;
  s.target_hidden = 256;
  s.intermediate = 384;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 512;
  s.draft_vocab = draft_vocab;
  s.aux_layers = "[1, 3, 4]";
  s.own_embeddings = own_embeddings;
  s.scale = 0.1f;
  return s;
}

fs::path scratch() {
  return test_support::process_scratch_dir("cuda_eagle3");
}

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

TEST(CudaEagle3, DraftForwardMatchesTheCpuBackend) {
  KILN_REQUIRE_GPU();
  const fs::path dir = scratch() / "draft";
  test::write_eagle3_draft(dir, draft_shape(64, true));
  auto cpu_target = tiny_target(Device::cpu());
  auto gpu_target = tiny_target(Device::cuda());
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
  // Rounding may flip a near tie of the top two (a broken pass would agree on about 1 row in 64).
  EXPECT_LE(differ, T / 5) << "top-1 tokens of " << T << " rows";
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

std::vector<std::vector<int32_t>> prompts(int count) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 5 + (i * 13) % 40; ++j) p.push_back(int32_t(rng() % 500));
    out.push_back(p);
  }
  return out;
}

using test::Generated;

Generated generate(const EngineOptions& o, const std::vector<std::vector<int32_t>>& ps, const fs::path& draft,
                   bool with_top) {
  auto runner = std::make_unique<Qwen3Runner>(tiny_target(Device::cuda()), ops::KvLayout::hnd, DType::bf16);
  if (!draft.empty()) runner->set_draft(Eagle3Model::load(draft.string(), runner->model()));
  const Qwen3Runner& r = *runner;
  Engine engine(std::move(runner), o);
  Generated out = test::generate_greedy(engine, ps, 32, with_top, /*ignore_eos=*/true);
  out.verify_graphs = r.num_verify_graphs();
  return out;
}

TEST(CudaEagle3, GreedyEagle3EqualsPlainGreedy) {
  KILN_REQUIRE_GPU();
  const auto ps = prompts(8);
  EngineOptions base = test::small_opts(8192, 16, 256);
  base.device = "cuda";
  base.cuda_graph_buckets = {1, 2, 4, 8};
  const Generated want = generate(base, ps, {}, true);
  const fs::path draft = scratch() / "draft_top";
  test::write_eagle3_draft(draft, draft_shape(2, false), "", test::frequent_tokens(want.tokens, 2), 3);
  EngineOptions eo = base;
  eo.speculative.algorithm = spec::SpecAlgorithm::eagle3;
  eo.speculative.draft_model_path = draft.string();
  eo.speculative.num_draft_tokens = 3;
  eo.speculative.off_switch = false;
  for (const bool batched : {false, true}) {
    Generated got;
    if (batched) {
      got = generate(eo, ps, draft, false);
    } else {
      for (const auto& p : ps) {
        const Generated one = generate(eo, {p}, draft, false);
        got.tokens.push_back(one.tokens[0]);
        got.stats.spec.drafts += one.stats.spec.drafts;
        got.stats.spec.draft_tokens += one.stats.spec.draft_tokens;
        got.stats.spec.accepted_tokens += one.stats.spec.accepted_tokens;
        got.verify_graphs = std::max(got.verify_graphs, one.verify_graphs);
      }
    }
    const int parted = test::count_near_tie_partings(got, want, batched ? "batched" : "batch 1");
    const spec::SpecStats& st = got.stats.spec;
    std::printf("%s: %d of %zu requests part at a near tie; %lld drafts, %lld of %lld drafted tokens kept\n",
                batched ? "batched" : "batch 1", parted, ps.size(), (long long)st.drafts,
                (long long)st.accepted_tokens, (long long)st.draft_tokens);
    EXPECT_GT(st.accepted_tokens, 0);
    EXPECT_LT(st.accepted_tokens, st.draft_tokens);
    EXPECT_GT(got.verify_graphs, 0) << "no verify step replayed a graph";
  }
}

}  // namespace
}  // namespace kiln
