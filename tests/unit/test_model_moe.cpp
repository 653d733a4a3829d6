// Qwen3-MoE through Qwen3Model and the engine on the CPU backend: the sparse layers where the config puts
// them, a one-expert model bitwise equal to the dense model holding that expert, the fused checkpoint layout
// equal to the hub's, batch invariance, greedy generation through the engine, and the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model_steps.h"
#include "common/moe_checkpoints.h"
#include "common/test_support.h"
#include "engine_test_util.h"
#include "kiln/safetensors.h"
#include "model/qwen3.h"
#include "model/weights.h"
#include "runtime/engine.h"

using namespace kiln;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A tiny Qwen3 config.json; moe() turns it into Qwen3-MoE.
json dense_json() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 301, "hidden_size": 96,
    "intermediate_size": 160, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "max_position_embeddings": 256, "tie_word_embeddings": false, "dtype": "bfloat16",
    "eos_token_id": 300})");
}

json moe_json(int64_t experts, int64_t top_k, int64_t width, bool norm, const json& only = json::array(),
              int64_t step = 1) {
  return test::moe_config_json(dense_json(), experts, top_k, width, norm, only, step);
}

fs::path write_checkpoint(const std::string& name, const json& cfg, const std::vector<NamedTensor>& tensors) {
  return test::write_json_checkpoint("model_moe", name, cfg, tensors);
}

// Random weights for a config, as the checkpoint tensors (hub layout).
struct Ckpt {
  RandomWeights w;
  explicit Ckpt(const json& cfg, uint64_t seed)
      : w(random_weights(qwen3_weight_specs(parse_model_config(cfg.dump(), "test config")), seed)) {}
};

std::unique_ptr<Qwen3Model> load(const fs::path& dir) {
  return Qwen3Model::load(dir.string(), LoadOptions{});
}

std::vector<std::vector<float>> greedy_logits(Qwen3Model& m, const std::vector<int32_t>& prompt, int steps) {
  return test::model_steps(m, prompt, steps, {}, DType::bf16, ops::KvLayout::nhd, 4);
}

const std::vector<int32_t> kPrompt = {5, 17, 33, 48, 64, 3, 31, 250, 7, 99, 120};

}  // namespace

TEST(Qwen3Moe, SparseLayersWhereTheConfigPutsThem) {
  const json j = moe_json(4, 2, 32, true, json{2}, 1);  // layer 2 dense
  const Ckpt ck(j, 1);
  auto m = load(write_checkpoint("placement", j, ck.w.tensors));
  const bool want[4] = {true, true, false, true};
  for (int l = 0; l < 4; ++l) {
    const LayerWeights& lw = m->weights().layers[size_t(l)];
    EXPECT_EQ(lw.moe.present(), want[l]) << "layer " << l;
    EXPECT_EQ(lw.gate_up.weight.data == nullptr, want[l]) << "layer " << l;
    if (want[l]) {
      EXPECT_EQ(lw.moe.num_experts(), 4);
      EXPECT_EQ(lw.moe.intermediate(), 32);
      EXPECT_EQ(lw.moe.top_k, 2);
      EXPECT_TRUE(lw.moe.norm_topk_prob);
    }
  }
  // decoder_sparse_step 2: layers 1 and 3 only.
  const json s2 = moe_json(4, 2, 32, false, json::array(), 2);
  const Ckpt ck2(s2, 1);
  auto m2 = load(write_checkpoint("step2", s2, ck2.w.tensors));
  for (int l = 0; l < 4; ++l) EXPECT_EQ(m2->weights().layers[size_t(l)].moe.present(), l % 2 == 1) << l;
  EXPECT_EQ(greedy_logits(*m2, kPrompt, 3).size(), 3u);
}

// One expert, top-1: its routing weight is exactly 1 (softmax of one logit), so the sparse layer is the dense
// MLP holding that expert's weights, bit for bit, with or without renormalization.
TEST(Qwen3Moe, OneExpertEqualsTheDenseModelBitwise) {
  const json dense = dense_json();
  Ckpt ck(dense, 3);
  const fs::path dense_dir = write_checkpoint("dense", dense, ck.w.tensors);
  json moe = moe_json(1, 1, 160, false);
  std::vector<NamedTensor> renamed = ck.w.tensors;
  std::vector<bf16_t> router(96 * 4, f32_to_bf16(0.25f));
  for (NamedTensor& t : renamed) {
    const size_t at = t.name.find(".mlp.");
    if (at != std::string::npos) t.name.replace(at, 5, ".mlp.experts.0.");
  }
  for (int l = 0; l < 4; ++l)
    renamed.push_back({"model.layers." + std::to_string(l) + ".mlp.gate.weight",
                       Tensor(router.data() + 96 * l, DType::bf16, {1, 96})});
  auto d = load(dense_dir);
  const auto want = greedy_logits(*d, kPrompt, 6);
  for (bool norm : {false, true}) {
    moe["norm_topk_prob"] = norm;
    auto m = load(write_checkpoint(norm ? "one_expert_norm" : "one_expert", moe, renamed));
    const auto got = greedy_logits(*m, kPrompt, 6);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_EQ(0, std::memcmp(got[s].data(), want[s].data(), want[s].size() * 4)) << "step " << s;
  }
}

// transformers 5's fused expert tensors ([E, 2I, H] gate rows first, [E, H, I]) hold the same model.
TEST(Qwen3Moe, FusedExpertLayoutEqualsTheHubLayout) {
  const int64_t E = 4, I = 32, H = 96;
  const json j = moe_json(E, 2, I, true);
  const Ckpt ck(j, 5);
  auto hub = load(write_checkpoint("hub", j, ck.w.tensors));
  std::vector<NamedTensor> fused;
  std::vector<std::vector<bf16_t>> store;
  store.reserve(8);
  for (int l = 0; l < 4; ++l) {
    const std::string L = "model.layers." + std::to_string(l) + ".mlp.";
    std::vector<bf16_t> gu(size_t(E * 2 * I * H)), down(size_t(E * H * I));
    for (const NamedTensor& t : ck.w.tensors) {
      if (t.name.rfind(L + "experts.", 0) != 0) continue;
      const std::string rest = t.name.substr(L.size() + 8);  // "e.proj.weight"
      const int64_t e = std::stoll(rest.substr(0, rest.find('.')));
      const auto* src = t.tensor.ptr<bf16_t>();
      if (rest.find("gate_proj") != std::string::npos)
        std::copy(src, src + I * H, gu.begin() + e * 2 * I * H);
      if (rest.find("up_proj") != std::string::npos)
        std::copy(src, src + I * H, gu.begin() + e * 2 * I * H + I * H);
      if (rest.find("down_proj") != std::string::npos) std::copy(src, src + H * I, down.begin() + e * H * I);
    }
    store.push_back(std::move(gu));
    fused.push_back({L + "experts.gate_up_proj", Tensor(store.back().data(), DType::bf16, {E, 2 * I, H})});
    store.push_back(std::move(down));
    fused.push_back({L + "experts.down_proj", Tensor(store.back().data(), DType::bf16, {E, H, I})});
  }
  for (const NamedTensor& t : ck.w.tensors)
    if (t.name.find(".mlp.experts.") == std::string::npos) fused.push_back(t);
  auto f = load(write_checkpoint("fused", j, fused));
  const auto want = greedy_logits(*hub, kPrompt, 4), got = greedy_logits(*f, kPrompt, 4);
  for (size_t s = 0; s < want.size(); ++s)
    EXPECT_EQ(0, std::memcmp(got[s].data(), want[s].data(), want[s].size() * 4)) << "step " << s;
}

// Two sequences in one step (prefill + prefill) give each one's logits alone, bit for bit: the experts'
// gathered GEMMs never mix rows.
TEST(Qwen3Moe, BatchedSequencesEqualEachAlone) {
  const json j = moe_json(8, 3, 32, false, json{0});
  const Ckpt ck(j, 9);
  auto m = load(write_checkpoint("batch", j, ck.w.tensors));
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7}, b = {200, 100, 50, 25};
  const auto alone_a = greedy_logits(*m, a, 1), alone_b = greedy_logits(*m, b, 1);
  const ModelConfig& c = m->config();
  KvCache cache(c, 8, 4, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  BatchDesc bd;
  bd.page_size = 4;
  for (size_t i = 0; i < a.size(); ++i) {
    bd.tokens.push_back(a[i]);
    bd.positions.push_back(int32_t(i));
    bd.slot_mapping.push_back(int64_t(i));  // pages 0, 1
  }
  for (size_t i = 0; i < b.size(); ++i) {
    bd.tokens.push_back(b[i]);
    bd.positions.push_back(int32_t(i));
    bd.slot_mapping.push_back(int64_t(16 + i));  // page 4
  }
  bd.cu_q = {0, int32_t(a.size()), int32_t(a.size() + b.size())};
  bd.kv_lens = {int32_t(a.size()), int32_t(b.size())};
  bd.pages_stride = 2;
  bd.page_table = {0, 1, 4, 0};
  bd.logit_rows = {int32_t(a.size()) - 1, int32_t(a.size() + b.size()) - 1};
  std::vector<float> logits(2 * size_t(c.vocab_size));
  m->forward(bd, cache, Tensor(logits.data(), DType::f32, {2, c.vocab_size}));
  EXPECT_EQ(0, std::memcmp(logits.data(), alone_a[0].data(), size_t(c.vocab_size) * 4));
  EXPECT_EQ(0, std::memcmp(logits.data() + c.vocab_size, alone_b[0].data(), size_t(c.vocab_size) * 4));
}

// The engine (chunked prefill, mixed batches, prefix cache) generates what stepping the model alone does.
TEST(Qwen3Moe, EngineGreedyEqualsTheModelStepByStep) {
  const json j = moe_json(8, 2, 32, true, json{1});
  const Ckpt ck(j, 13);
  const fs::path dir = write_checkpoint("engine", j, ck.w.tensors);
  std::vector<std::vector<int32_t>> prompts = {kPrompt, {9, 8, 7}, {42}, kPrompt};
  prompts.back().push_back(77);  // shares a cached prefix with the first
  auto m = load(dir);
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    std::vector<int32_t> toks;
    for (const auto& l : greedy_logits(*m, p, 8)) toks.push_back(test::argmax(l));
    want.push_back(toks);
  }
  EngineOptions o = test::small_opts(1024, 4, 5);
  o.model_dir = dir.string();
  o.device = "cpu";
  auto engine = Engine::create(o);
  test::Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r = test::greedy(p, 8);
    r.sampling.ignore_eos = true;
    ids.push_back(engine->submit(r, sink.cb()));
  }
  sink.wait_finished(int(prompts.size()));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(sink.tokens(ids[i]), want[i]) << "prompt " << i;
  test::expect_pool_clean(*engine);
}

TEST(Qwen3Moe, RefusalsNameWhatIsMissing) {
  // (--device cuda runs MoE layers since the CUDA kernels exist: tests/cuda/test_cuda_model_moe.cpp.)
  // A hub checkpoint without one expert's tensor: the error names it.
  const json j = moe_json(4, 2, 32, true);
  const Ckpt ck(j, 2);
  std::vector<NamedTensor> missing;
  for (const NamedTensor& t : ck.w.tensors)
    if (t.name != "model.layers.3.mlp.experts.2.up_proj.weight") missing.push_back(t);
  const fs::path dir = write_checkpoint("missing", j, missing);
  test_support::expect_contains(test_support::error_of([&] { load(dir); }),
                                {"model.layers.3.mlp.experts.2.up_proj.weight"});
}
