// config.json -> ModelConfig: the transformers 4.x and 5.x layouts, Qwen3 / Qwen3-Embedding / Qwen3-VL text,
// and every rejection naming its field.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "kiln/config.h"
#include "kiln/error.h"

using namespace kiln;
using json = nlohmann::json;

namespace {

using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

// Qwen3-4B's config.json as transformers 4.51 wrote it.
json qwen3_4b_v4() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

// The same model as transformers 5.x writes it.
json qwen3_4b_v5() {
  json j = qwen3_4b_v4();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000.0}};
  j["dtype"] = "float16";
  j["eos_token_id"] = {151645, 151643};
  j["tie_word_embeddings"] = false;
  return j;
}

// Qwen3-VL-4B-Instruct (transformers 4.57 layout): the decoder under text_config, M-RoPE in rope_scaling.
json qwen3_vl_v4() {
  return json::parse(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655, "model_type": "qwen3_vl",
    "text_config": {
      "attention_bias": false, "bos_token_id": 151643, "dtype": "bfloat16", "eos_token_id": 151645,
      "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 9728,
      "max_position_embeddings": 262144, "model_type": "qwen3_vl_text", "num_attention_heads": 32,
      "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
      "rope_theta": 5000000, "use_cache": true, "vocab_size": 151936},
    "tie_word_embeddings": true, "transformers_version": "4.57.0",
    "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
      "hidden_size": 1024, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4096,
      "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2560,
      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "video_token_id": 151656, "vision_end_token_id": 151653, "vision_start_token_id": 151652})");
}

ModelConfig parse(const json& j) {
  return parse_model_config(j.dump(), "test/config.json");
}

}  // namespace

TEST(Config, Transformers4Layout) {
  const ModelConfig c = parse(qwen3_4b_v4());
  EXPECT_EQ(c.arch, ModelArch::qwen3);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.intermediate_size, 9728);
  EXPECT_EQ(c.num_layers, 36);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_size(), 4096);
  EXPECT_EQ(c.kv_size(), 1024);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::bf16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_TRUE(c.mrope_section.empty());
  EXPECT_EQ(c.weight_prefix, "model.");
}

TEST(Config, Transformers5Layout) {
  const ModelConfig c = parse(qwen3_4b_v5());
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.dtype, DType::f16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_kv_heads, 8);
}

TEST(Config, ReadsTheFixturesThatTransformers5Wrote) {
  const std::string root = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/";
  const ModelConfig a = load_model_config(root + "qwen3_gqa4_d64_tied");
  EXPECT_EQ(a.num_heads / a.num_kv_heads, 4);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.vocab_size, 512);
  EXPECT_EQ(a.num_layers, 2);
  EXPECT_DOUBLE_EQ(a.rope_theta, 1e6);
  EXPECT_EQ(a.eos_token_ids, (std::vector<int64_t>{511}));
  const ModelConfig b = load_model_config(root + "qwen3_gqa2_d128_untied");
  EXPECT_EQ(b.num_heads / b.num_kv_heads, 2);
  EXPECT_EQ(b.head_dim, 128);
  EXPECT_FALSE(b.tie_word_embeddings);
  const ModelConfig c = load_model_config(root + "qwen3_gqa3_d32_tied");
  EXPECT_EQ(c.num_heads, 6);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e4);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{509, 511}));
  EXPECT_EQ(c.dtype, DType::bf16);
}

TEST(Config, Defaults) {
  json j = qwen3_4b_v4();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j.erase("eos_token_id");
  j.erase("torch_dtype");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.head_dim, 2560 / 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.dtype, DType::bf16);
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse(j).rotary_dim(), 40);
}

TEST(Config, EmbeddingModel) {
  json j = qwen3_4b_v4();
  j["architectures"] = {"Qwen3Model"};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, ModelArch::qwen3_embedding);
  EXPECT_EQ(c.weight_prefix, "");
}

TEST(Config, Qwen3VLTextDecoder) {
  for (bool v5 : {false, true}) {
    SCOPED_TRACE(v5 ? "transformers 5.x layout" : "transformers 4.x layout");
    json j = qwen3_vl_v4();
    if (v5) {
      json& t = j["text_config"];
      t["rope_parameters"] = t["rope_scaling"];
      t["rope_parameters"]["rope_theta"] = 5000000.0;
      t.erase("rope_scaling");
      t.erase("rope_theta");
    }
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.arch, ModelArch::qwen3_vl_text);
    EXPECT_EQ(c.weight_prefix, "model.language_model.");
    EXPECT_EQ(c.mrope_section, (std::vector<int>{24, 20, 20}));
    EXPECT_TRUE(c.mrope_interleaved);
    EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
    EXPECT_EQ(c.rope_type, "default");
    EXPECT_TRUE(c.tie_word_embeddings);  // from the top level
    EXPECT_EQ(c.hidden_size, 2560);
    EXPECT_EQ(c.max_position_embeddings, 262144);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
    ASSERT_TRUE(c.has_vision);
    EXPECT_EQ(c.vision.depth, 24);
    EXPECT_EQ(c.vision.hidden_size, 1024);
    EXPECT_EQ(c.vision.head_dim(), 64);
    EXPECT_EQ(c.vision.patch_dim(), 1536);
    EXPECT_EQ(c.vision.grid_side(), 48);
    EXPECT_EQ(c.vision.out_hidden_size, 2560);
    EXPECT_EQ(c.vision.deepstack_visual_indexes, (std::vector<int64_t>{5, 11, 17}));
    EXPECT_EQ(c.vision.image_token_id, 151655);
    EXPECT_EQ(c.vision.vision_start_token_id, 151652);
  }
  // Qwen2-VL-era spelling: type "mrope", sectioned (not interleaved).
  json j = qwen3_vl_v4();
  j["text_config"]["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {16, 24, 24}}};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_FALSE(c.mrope_interleaved);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{16, 24, 24}));
}

TEST(Config, VisionConfigRejectionsNameTheField) {
  auto fails_with = [](json j, const std::string& needle) {
    try {
      parse(j);
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no error for " << needle;
  };
  json j = qwen3_vl_v4();
  j["vision_config"]["out_hidden_size"] = 4096;
  fails_with(j, "vision_config.out_hidden_size");
  j = qwen3_vl_v4();
  j["vision_config"]["hidden_act"] = "relu";
  fails_with(j, "vision_config.hidden_act");
  j = qwen3_vl_v4();
  j["vision_config"]["deepstack_visual_indexes"] = {5, 30};
  fails_with(j, "vision_config.deepstack_visual_indexes");
  j = qwen3_vl_v4();
  j["vision_config"]["num_position_embeddings"] = 2300;
  fails_with(j, "vision_config.num_position_embeddings");
  j = qwen3_vl_v4();
  j.erase("vision_config");
  EXPECT_FALSE(parse(j).has_vision) << "no vision_config: the text decoder alone";
  j = qwen3_vl_v4();
  j["image_token_id"] = -3;
  fails_with(j, "image_token_id");
  j = qwen3_vl_v4();
  j["image_token_id"] = 999999;  // outside the vocabulary: the text decoder alone
  EXPECT_FALSE(parse(j).has_vision);
}

TEST(Config, RejectionsNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["architectures"] = {"Qwen2MoeForCausalLM"}; },
       {"architectures", "Qwen2MoeForCausalLM"}},
      {[](json& j) { j["architectures"] = json::array(); }, {"architectures"}},
      {[](json& j) {
         j.erase("architectures");
         j["model_type"] = "llama";
       },
       {"model_type", "llama"}},
      {[](json& j) { j["num_key_value_heads"] = 5; }, {"num_attention_heads", "num_key_value_heads (5)"}},
      {[](json& j) { j["hidden_size"] = 0; }, {"hidden_size", "positive"}},
      {[](json& j) { j["num_hidden_layers"] = -2; }, {"num_hidden_layers", "positive"}},
      {[](json& j) { j["hidden_size"] = "2560"; }, {"hidden_size", "integer"}},
      {[](json& j) { j.erase("vocab_size"); }, {"vocab_size", "missing"}},
      {[](json& j) { j["head_dim"] = -128; }, {"head_dim", "positive"}},
      {[](json& j) {
         j.erase("head_dim");
         j["num_attention_heads"] = 24;
         j["num_key_value_heads"] = 8;
       },
       {"head_dim", "not a multiple"}},
      {[](json& j) {
         j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
       },
       {"rope_scaling.rope_type", "longrope"}},
      {[](json& j) { j["rope_theta"] = -1; }, {"rope_theta"}},
      {[](json& j) { j["rms_norm_eps"] = 0; }, {"rms_norm_eps"}},
      {[](json& j) { j["partial_rotary_factor"] = 1.5; }, {"partial_rotary_factor"}},
      {[](json& j) { j["torch_dtype"] = "float8_e4m3fn"; }, {"torch_dtype", "float8_e4m3fn"}},
      {[](json& j) { j["eos_token_id"] = "x"; }, {"eos_token_id"}},
      {[](json& j) {
         j["eos_token_id"] = {1, 200000};
       },
       {"eos_token_id", "200000"}},
      {[](json& j) { j["tie_word_embeddings"] = 1; }, {"tie_word_embeddings"}},
      // Lists that must match the layer count, and attention kiln does not implement.
      {[](json& j) {
         j["layer_types"] = json::array({"full_attention", "full_attention"});
       },
       {"'layer_types'", "has 2 entries", "num_hidden_layers is 36"}},
      {[](json& j) { j["layer_types"] = "full_attention"; }, {"'layer_types'", "list"}},
      {[](json& j) {
         j["layer_types"] = json::array();
         for (int i = 0; i < 36; ++i)
           j["layer_types"].push_back(i == 3 ? "linear_attention" : "full_attention");
       },
       {"'layer_types[3]'", "linear_attention"}},
      {[](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j["layer_types"] = json::array();
         for (int i = 0; i < 36; ++i)
           j["layer_types"].push_back(i >= 30 ? "sliding_attention" : "full_attention");
       },
       {"'layer_types[30]'", "sliding-window"}},
      {[](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j["max_window_layers"] = 20;
       },
       {"'use_sliding_window'", "max_window_layers (20)", "num_hidden_layers (36)", "sliding-window"}},
      {[](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j.erase("max_window_layers");  // Qwen3Config's default, 28, is below 36
       },
       {"'use_sliding_window'", "max_window_layers (28)"}},
      {[](json& j) { j["sliding_window"] = 0; }, {"'sliding_window'", "positive"}},
      {[](json& j) { j["use_sliding_window"] = "yes"; }, {"'use_sliding_window'", "true or false"}},
      {[](json& j) { j["attention_bias"] = true; }, {"'attention_bias'", "biases"}},
      {[](json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "gelu"}},
      {[](json& j) { j["num_key_value_heads"] = 64; }, {"num_attention_heads", "num_key_value_heads (64)"}},
      // Sizes past kiln's bounds: named, not a bare std::bad_alloc later (issue 41).
      {[](json& j) { j["max_position_embeddings"] = 1000000000000000; },
       {"'max_position_embeddings'", "1000000000000000", "limit of 4194304"}},
      {[](json& j) { j["vocab_size"] = 1000000000; }, {"'vocab_size'", "limit of 16777216"}},
      {[](json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 1e12}};
       },
       {"'rope_scaling.factor'", "gives a context of", "limit of 4194304"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    json j = qwen3_4b_v4();
    cases[i].edit(j);
    const std::string msg = error_of([&] { parse(j); });
    expect_contains(msg, {"test/config.json"});
    for (const auto& w : cases[i].want) expect_contains(msg, {w});
  }
}

// Sliding-window fields that, by transformers' rule, leave every layer on full attention are accepted.
TEST(Config, SlidingWindowFieldsThatSlideNoLayerAreAccepted) {
  json j = qwen3_4b_v4();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 36;  // no layer index reaches it
  EXPECT_EQ(parse(j).num_layers, 36);
  j = qwen3_4b_v4();
  j["layer_types"] = json::array();
  for (int i = 0; i < 36; ++i) j["layer_types"].push_back(i % 2 ? "sliding_attention" : "full_attention");
  EXPECT_EQ(parse(j).num_layers, 36);  // use_sliding_window false: no window, full attention everywhere
  j["use_sliding_window"] = true;
  j.erase("sliding_window");  // null window: still full attention
  EXPECT_EQ(parse(j).num_layers, 36);
}

TEST(Config, VLRejections) {
  json j = qwen3_vl_v4();
  j["text_config"]["rope_scaling"]["mrope_section"] = {24, 20, 10};
  expect_contains(error_of([&] { parse(j); }),
                  {"text_config.rope_scaling.mrope_section", "sums to 54", "64"});
  j = qwen3_vl_v4();
  j["text_config"]["rope_scaling"]["mrope_section"] = {32, 32};
  expect_contains(error_of([&] { parse(j); }), {"mrope_section", "3 integers"});
  j = qwen3_vl_v4();
  j.erase("text_config");
  expect_contains(error_of([&] { parse(j); }), {"text_config"});
  j = qwen3_vl_v4();
  j["text_config"]["num_attention_heads"] = 7;
  expect_contains(error_of([&] { parse(j); }), {"text_config.num_attention_heads", "(7)"});
}

TEST(Config, FileErrors) {
  expect_contains(error_of([] { load_model_config("/nonexistent/model"); }),
                  {"/nonexistent/model/config.json"});
  expect_contains(error_of([] { parse_model_config("{", "x/config.json"); }),
                  {"x/config.json", "not valid JSON"});
  expect_contains(error_of([] { parse_model_config("[]", "x/config.json"); }), {"x/config.json", "object"});
}

TEST(Config, AdaptWeightPrefix) {
  ModelConfig c = parse(qwen3_4b_v4());
  adapt_weight_prefix(c, {"model.embed_tokens.weight", "lm_head.weight"});
  EXPECT_EQ(c.weight_prefix, "model.");
  adapt_weight_prefix(c, {"embed_tokens.weight", "norm.weight"});  // Qwen3-Embedding as shipped
  EXPECT_EQ(c.weight_prefix, "");
  adapt_weight_prefix(c, {"model.language_model.embed_tokens.weight"});
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  expect_contains(error_of([&] { adapt_weight_prefix(c, {"foo.weight"}); }), {"embed_tokens.weight"});
}
