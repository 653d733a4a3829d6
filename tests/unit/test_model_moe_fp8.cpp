// Block-FP8 Qwen3-MoE on the CPU backend (ops/moe.h "Block-FP8 experts", model/qwen3_moe.h): the hub
// layout's F8_E4M3 experts with weight_scale_inv load as e4m3 + per-expert block scales (the router bf16),
// equal online quantization of the BF16 source bit for bit, stay near the BF16 model, run each expert by path
// (a) exactly as the dense FP8 model runs its MLP, and off-grid widths are refused naming the sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/fp8_checkpoints.h"
#include "common/model_steps.h"
#include "common/moe_checkpoints.h"
#include "common/test_support.h"
#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/qwen3.h"
#include "model/weights.h"

using namespace kiln;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// hidden 128 and moe_intermediate 128: each expert's gate, up and down fill whole 128-row blocks.
json dense_json(int64_t intermediate = 256) {
  json j = json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 301, "hidden_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "max_position_embeddings": 256, "tie_word_embeddings": false, "dtype": "bfloat16",
    "eos_token_id": 300})");
  j["intermediate_size"] = intermediate;
  return j;
}

json moe_json(int64_t experts, int64_t top_k, int64_t width, const json& only) {
  return test::moe_config_json(dense_json(), experts, top_k, width, true, only);
}

json with_fp8(json j) {
  j["quantization_config"] = json::parse(fp8_quantization_config_json());
  return j;
}

fs::path write_checkpoint(const std::string& name, const json& cfg, const std::vector<NamedTensor>& tensors) {
  return test::write_json_checkpoint("model_moe_fp8", name, cfg, tensors);
}

// Seeded random weights of `cfg` (hub layout), the decoder linears optionally block-FP8.
struct Ckpt {
  RandomWeights w;
  Fp8CheckpointStorage q;
  std::vector<NamedTensor> tensors;
  Ckpt(const json& cfg, uint64_t seed, bool fp8)
      : w(random_weights(qwen3_weight_specs(parse_model_config(cfg.dump(), "test config")), seed)) {
    tensors = fp8 ? quantize_checkpoint_linears(w.tensors, test::is_decoder_linear, false, q) : w.tensors;
  }
};

std::unique_ptr<Qwen3Model> load(const fs::path& dir, const std::string& quantization = "") {
  LoadOptions o;
  o.quantization = quantization;
  return Qwen3Model::load(dir.string(), o);
}

std::vector<std::vector<float>> greedy_logits(Qwen3Model& m, int steps) {
  const std::vector<int32_t> prompt = {5, 17, 33, 48, 64, 3, 31, 250, 7, 99, 120};
  return test::model_steps(m, prompt, steps, {}, DType::bf16, ops::KvLayout::nhd, 4);
}

void expect_bitwise(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s)
    EXPECT_EQ(0, std::memcmp(got[s].data(), want[s].data(), want[s].size() * 4)) << "step " << s;
}

}  // namespace

TEST(Qwen3MoeFp8, CheckpointEqualsOnlineQuantizationAndStaysNearBf16) {
  const json j = moe_json(4, 2, 128, json{0});
  const Ckpt fp8(j, 21, true), bf16(j, 21, false);
  auto m = load(write_checkpoint("fp8", with_fp8(j), fp8.tensors));
  const ops::MoeWeights& w = m->weights().layers[1].moe;
  ASSERT_TRUE(w.present());
  EXPECT_EQ(w.router.dtype, DType::bf16);
  ASSERT_TRUE(w.is_fp8());
  EXPECT_EQ(w.down.dtype, DType::f8e4m3);
  // gate and up: one 128-row block each; down one.
  EXPECT_EQ(w.gate_up_scale.ndim, 3);
  EXPECT_EQ(w.gate_up_scale.shape[0], 4);
  EXPECT_EQ(w.gate_up_scale.shape[1], 2);
  EXPECT_EQ(w.gate_up_scale.shape[2], 1);
  EXPECT_EQ(w.down_scale.shape[1], 1);
  // Expert 3's up_proj scale: the checkpoint's weight_scale_inv, in its block row of the stack.
  const Checkpoint ck =
      Checkpoint::open((test_support::process_scratch_dir("model_moe_fp8") / "fp8").string());
  const Tensor s = ck.get("model.layers.1.mlp.experts.3.up_proj.weight_scale_inv");
  EXPECT_EQ(w.gate_up_scale.ptr<float>()[3 * 2 + 1], s.ptr<float>()[0]);

  const auto got = greedy_logits(*m, 5);
  const fs::path bf16_dir = write_checkpoint("bf16", j, bf16.tensors);
  expect_bitwise(greedy_logits(*load(bf16_dir, "fp8"), 5), got);
  const auto base = greedy_logits(*load(bf16_dir), 5);
  double num = 0, den = 0;
  for (size_t i = 0; i < got[0].size(); ++i) {  // the prefill step: both saw the same tokens
    num += (double(got[0][i]) - base[0][i]) * (double(got[0][i]) - base[0][i]);
    den += double(base[0][i]) * base[0][i];
  }
  // e4m3 weights and activations move the logits about one e4m3 rounding (the dense FP8 model's bound,
  // test_model_fp8.cpp), not more, and not zero (the experts did run in FP8).
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.15);
}

// One expert, top-1 (routing weight exactly 1): the sparse layer is the dense FP8 MLP holding that expert's
// e4m3 weights and scales, bit for bit: the oracle runs each expert by the dense CPU model's path (a).
TEST(Qwen3MoeFp8, OneExpertEqualsTheDenseFp8ModelBitwise) {
  const json dense = dense_json(128);
  const Ckpt ck(dense, 3, true);
  auto d = load(write_checkpoint("dense", with_fp8(dense), ck.tensors));
  ASSERT_TRUE(d->weights().layers[1].gate_up.is_fp8());
  json moe = moe_json(1, 1, 128, json::array());
  std::vector<NamedTensor> renamed = ck.tensors;
  std::vector<bf16_t> router(128 * 3, f32_to_bf16(0.25f));
  for (NamedTensor& t : renamed) {
    const size_t at = t.name.find(".mlp.");
    if (at != std::string::npos) t.name.replace(at, 5, ".mlp.experts.0.");
  }
  for (int l = 0; l < 3; ++l)
    renamed.push_back({"model.layers." + std::to_string(l) + ".mlp.gate.weight",
                       Tensor(router.data() + 128 * l, DType::bf16, {1, 128})});
  auto m = load(write_checkpoint("one_expert", with_fp8(moe), renamed));
  ASSERT_TRUE(m->weights().layers[1].moe.is_fp8());
  expect_bitwise(greedy_logits(*m, 5), greedy_logits(*d, 5));
}

TEST(Qwen3MoeFp8, ExpertWidthsOffTheBlockGridAreRefused) {
  // moe_intermediate_size 96: gate and up would share a 128-row scale block.
  const json j = moe_json(2, 1, 96, json{0});
  const Ckpt ck(j, 4, false);
  const fs::path dir = write_checkpoint("off_grid", j, ck.tensors);
  test_support::expect_contains(test_support::error_of([&] { load(dir, "fp8"); }),
                                {"moe_intermediate_size (96)", "multiples of 128"});
}

TEST(Qwen3MoeFp8, MoeMlpChecksTheScales) {
  const json j = moe_json(2, 1, 128, json{0});
  const Ckpt ck(j, 6, true);
  auto m = load(write_checkpoint("scales", with_fp8(j), ck.tensors));
  ops::MoeWeights w = m->weights().layers[1].moe;
  std::vector<bf16_t> x(128, f32_to_bf16(0.5f)), out(128);
  const Tensor xt(x.data(), DType::bf16, {1, 128}), ot(out.data(), DType::bf16, {1, 128});
  ops::moe_mlp(xt, w, ot);  // as loaded: accepted
  w.down_scale = w.down_scale.reshape({2, 1, 1, 1});
  test_support::expect_contains(test_support::error_of([&] { ops::moe_mlp(xt, w, ot); }), {"down_scale"});
  w.down_scale = Tensor();
  w.down = m->weights().layers[1].moe.down;
  test_support::expect_contains(test_support::error_of([&] { ops::moe_mlp(xt, w, ot); }), {"down_scale"});
}
