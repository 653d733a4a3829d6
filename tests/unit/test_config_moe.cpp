// Qwen3-MoE config.json -> ModelConfig: the hub's Qwen3-30B-A3B and -235B-A22B configs, which layers are
// sparse (mlp_only_layers, decoder_sparse_step), and every rejection naming its field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "kiln/config.h"

using namespace kiln;
using json = nlohmann::json;

namespace {

using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

// Qwen3-30B-A3B's config.json as the hub ships it (transformers 4.51 layout).
json qwen3_30b_a3b() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

ModelConfig parse(const json& j) {
  return parse_model_config(j.dump(), "test/config.json");
}

std::string error_with(const char* key, const json& value) {
  json j = qwen3_30b_a3b();
  if (value.is_discarded())
    j.erase(key);
  else
    j[key] = value;
  return error_of([&] { parse(j); });
}

}  // namespace

TEST(ConfigMoe, Qwen3_30B_A3B) {
  const ModelConfig c = parse(qwen3_30b_a3b());
  EXPECT_EQ(c.arch, ModelArch::qwen3_moe);
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe.moe_intermediate_size, 768);
  EXPECT_EQ(c.moe.decoder_sparse_step, 1);
  EXPECT_TRUE(c.moe.mlp_only_layers.empty());
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.tie_word_embeddings);
  for (int64_t l = 0; l < 48; ++l) EXPECT_TRUE(c.is_moe_layer(l)) << l;
  EXPECT_TRUE(c.has_moe_layers());
}

TEST(ConfigMoe, Qwen3_235B_A22BShape) {
  json j = qwen3_30b_a3b();
  j["hidden_size"] = 4096;
  j["num_hidden_layers"] = 94;
  j["num_attention_heads"] = 64;
  j["moe_intermediate_size"] = 1536;
  j["intermediate_size"] = 12288;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.moe.moe_intermediate_size, 1536);
  EXPECT_EQ(c.num_heads / c.num_kv_heads, 16);
  EXPECT_TRUE(c.is_moe_layer(93));
}

TEST(ConfigMoe, ModelTypeAloneAndTransformers5Spellings) {
  json j = qwen3_30b_a3b();
  j.erase("architectures");
  EXPECT_EQ(parse(j).arch, ModelArch::qwen3_moe);
  // transformers 5: rope_parameters, dtype, num_local_experts (Qwen3MoeConfig's attribute_map), defaults
  // for the optional fields (norm_topk_prob false, step 1, mlp_only_layers null).
  json v5 = qwen3_30b_a3b();
  for (const char* k :
       {"rope_scaling", "rope_theta", "torch_dtype", "num_experts", "norm_topk_prob", "decoder_sparse_step"})
    v5.erase(k);
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  v5["dtype"] = "bfloat16";
  v5["num_local_experts"] = 64;
  v5["mlp_only_layers"] = nullptr;
  const ModelConfig c = parse(v5);
  EXPECT_EQ(c.moe.num_experts, 64);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.decoder_sparse_step, 1);
  EXPECT_TRUE(c.moe.mlp_only_layers.empty());
}

// transformers' rule: sparse iff l not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
TEST(ConfigMoe, SparseLayersFollowStepAndMlpOnlyLayers) {
  json j = qwen3_30b_a3b();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 4};
  const ModelConfig c = parse(j);
  const bool want[6] = {false, true, false, false, false, true};
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(c.is_moe_layer(l), want[l]) << "layer " << l;
  j["mlp_only_layers"] = {1, 3, 5};
  EXPECT_FALSE(parse(j).has_moe_layers());
  // Dense Qwen3 configs have no sparse layer whatever they carry.
  json dense = qwen3_30b_a3b();
  dense["architectures"] = {"Qwen3ForCausalLM"};
  EXPECT_FALSE(parse(dense).has_moe_layers());
  EXPECT_EQ(parse(dense).moe.num_experts, 0);
}

TEST(ConfigMoe, RejectionsNameTheField) {
  expect_contains(error_with("num_experts_per_tok", 129),
                  {"test/config.json", "'num_experts_per_tok'", "exceeds num_experts (128)"});
  expect_contains(error_with("num_experts_per_tok", 0), {"'num_experts_per_tok'", "positive"});
  expect_contains(error_with("num_experts_per_tok", json::value_t::discarded),
                  {"'num_experts_per_tok'", "missing"});
  expect_contains(error_with("num_experts", 0), {"'num_experts'", "positive"});
  expect_contains(error_with("num_experts", json::value_t::discarded), {"'num_experts'", "missing"});
  expect_contains(error_with("moe_intermediate_size", -768), {"'moe_intermediate_size'", "positive"});
  expect_contains(error_with("decoder_sparse_step", 0), {"'decoder_sparse_step'", ">= 1", "got 0"});
  expect_contains(error_with("decoder_sparse_step", "2"), {"'decoder_sparse_step'", "integer"});
  expect_contains(error_with("mlp_only_layers", json{0, 48}),
                  {"'mlp_only_layers'", "48", "[0, num_hidden_layers = 48)"});
  expect_contains(error_with("mlp_only_layers", json{-1}), {"'mlp_only_layers'", "-1"});
  expect_contains(error_with("mlp_only_layers", json{"0"}), {"'mlp_only_layers'", "\"0\""});
  expect_contains(error_with("mlp_only_layers", 3), {"'mlp_only_layers'", "must be a list"});
  expect_contains(error_with("norm_topk_prob", 1), {"'norm_topk_prob'", "true or false"});
  expect_contains(error_with("num_local_experts", 64),
                  {"'num_local_experts'", "disagrees with num_experts (128)"});
  expect_contains(error_with("shared_expert_intermediate_size", 512),
                  {"'shared_expert_intermediate_size'", "no shared expert"});
  // router_aux_loss_coef and output_router_logits are training-only: any value is accepted and ignored.
  EXPECT_NO_THROW(parse([] {
    json j = qwen3_30b_a3b();
    j["router_aux_loss_coef"] = 0.5;
    j["output_router_logits"] = true;
    return j;
  }()));
}
