// Block-FP8 checkpoints on the CPU backend (model/fp8_weights.h, docs/NUMERICS.md "Block-FP8 linear layers"):
// quantization_config parsing and refusals, the loader's checks on F8_E4M3 weights and their
// weight_scale_inv (each error names the tensor), F32 / BF16 scales, sharded files, modules_to_not_convert,
// and whole-model runs: an FP8 checkpoint equals online quantization of its BF16 source bit for bit and stays
// near the BF16 model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/qwen3.h"
#include "tiny_model_config.h"

using namespace kiln;
using kiln::test_support::error_of;
using kiln::test_support::expect_contains;
namespace fs = std::filesystem;

namespace {

// Ragged where the format allows it: hidden 200 (K of qkv and gate_up, N of o and down is not a multiple of
// 128); q (256 rows), k (128) and gate (256) fill whole blocks, as every Qwen3 shape does.
ModelConfig fp8_config(int64_t intermediate = 256) {
  ModelConfig c = test::tiny_cpu_config(true);
  c.hidden_size = 200;
  c.intermediate_size = intermediate;
  c.quant.method = "fp8";
  return c;
}

bool is_decoder_linear(const std::string& n) {
  return n.rfind("model.layers.", 0) == 0 && n.size() > 12 &&
         n.compare(n.size() - 12, 12, "_proj.weight") == 0;
}

using Mutate = std::function<void(std::vector<NamedTensor>&)>;

// Writes the seeded random weights of `cfg` into a fresh directory: the linears chosen by `quantize` as
// block-FP8 (F32 scales, or BF16), then `mutate` applied to the tensor list.
fs::path write_checkpoint(const std::string& name, const ModelConfig& cfg,
                          const std::function<bool(const std::string&)>& quantize, bool bf16_scales = false,
                          const Mutate& mutate = {}) {
  const fs::path dir = test_support::process_scratch_dir("fp8_model") / name;
  fs::create_directories(dir);
  static std::vector<RandomWeights> keep;  // the tensors view these for the test's life
  static std::vector<Fp8CheckpointStorage> keep_q;
  keep.push_back(random_weights(qwen3_weight_specs(cfg), 5));
  keep_q.emplace_back();
  std::vector<NamedTensor> t =
      quantize_checkpoint_linears(keep.back().tensors, quantize, bf16_scales, keep_q.back());
  if (mutate) mutate(t);
  write_safetensors((dir / "model.safetensors").string(), t);
  return dir;
}

std::vector<float> prefill_logits(Qwen3Model& m) {
  const int32_t T = 6;
  KvCache cache(m.config(), 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  BatchDesc b;
  b.page_size = 16;
  for (int32_t i = 0; i < T; ++i) {
    b.tokens.push_back((i * 53 + 11) % 301);
    b.positions.push_back(i);
    b.slot_mapping.push_back(16 + i);
  }
  b.cu_q = {0, T};
  b.kv_lens = {T};
  b.logit_rows = {0, T - 1};
  b.pages_stride = 1;
  b.page_table = {1};
  std::vector<float> logits(2 * size_t(m.config().vocab_size));
  m.forward(b, cache, Tensor(logits.data(), DType::f32, {2, m.config().vocab_size}));
  return logits;
}

std::unique_ptr<Qwen3Model> load(const fs::path& dir, ModelConfig cfg, const std::string& quantization = "") {
  const Checkpoint ck = Checkpoint::open(dir.string());
  LoadOptions o;
  o.quantization = quantization;
  return Qwen3Model::create(cfg, &ck, o);
}

std::string load_error(const fs::path& dir, const ModelConfig& cfg) {
  return error_of([&] { load(dir, cfg); });
}

ModelConfig without_quant(ModelConfig c) {
  c.quant = {};
  return c;
}

std::string config_json(const std::string& quant) {
  return R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 301, "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 32, "quantization_config": )" +
         quant + "}";
}

void replace(std::vector<NamedTensor>& t, const std::string& name, const Tensor& with) {
  for (NamedTensor& n : t)
    if (n.name == name) n.tensor = with;
}
void erase(std::vector<NamedTensor>& t, const std::string& name) {
  std::erase_if(t, [&](const NamedTensor& n) { return n.name == name; });
}

}  // namespace

TEST(Fp8Config, ParsesQwenFp8Block) {
  const ModelConfig c =
      parse_model_config(config_json(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "mlp.gate"]})"),
                         "config.json");
  EXPECT_EQ(c.quant.method, "fp8");
  EXPECT_TRUE(c.quant.fp8());
  EXPECT_EQ(c.quant.modules_to_not_convert, (std::vector<std::string>{"lm_head", "mlp.gate"}));
  EXPECT_NE(c.quant.describe().find("128x128"), std::string::npos);
  EXPECT_FALSE(parse_model_config(config_json("null"), "config.json").quant.fp8());
}

TEST(Fp8Config, RefusesOtherSchemesNamingThem) {
  for (const char* m : {"awq", "gptq", "compressed-tensors", "bitsandbytes", "fbgemm_fp8"}) {
    const std::string q = std::string(R"({"quant_method": ")") + m + R"(", "bits": 4})";
    expect_contains(error_of([&] { parse_model_config(config_json(q), "config.json"); }),
                    {"config.json", "quantization_config.quant_method", m});
  }
  const std::pair<const char*, const char*> bad[] = {
      {R"({"quant_method": "fp8", "weight_block_size": [64, 64]})", "weight_block_size"},
      {R"({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"})",
       "static"},
      {R"({"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"})", "e5m2"},
      {R"({"quant_method": "fp8"})", "weight_block_size"},
      {R"({"weight_block_size": [128, 128]})", "quant_method"},
      {R"("fp8")", "must be an object"},
  };
  for (const auto& [q, want] : bad)
    expect_contains(error_of([&] { parse_model_config(config_json(q), "config.json"); }),
                    {"config.json", want});
}

TEST(Fp8Model, CheckpointEqualsOnlineQuantizationOfItsSourceBitwise) {
  const ModelConfig cfg = fp8_config();
  const fs::path fp8 = write_checkpoint("fp8", cfg, is_decoder_linear);
  const fs::path bf16 = write_checkpoint("bf16", cfg, [](const std::string&) { return false; });
  auto m = load(fp8, cfg);
  const LayerWeights& l0 = m->weights().layers[0];
  ASSERT_TRUE(l0.qkv.is_fp8() && l0.o_proj.is_fp8() && l0.gate_up.is_fp8() && l0.down.is_fp8());
  EXPECT_EQ(l0.qkv.scale.shape[0], 4);  // (256 + 128 + 128) / 128
  EXPECT_EQ(l0.qkv.scale.shape[1], 2);  // ceil(200 / 128)
  EXPECT_EQ(l0.o_proj.scale.shape[0], 2);
  EXPECT_FALSE(m->weights().embed.dtype == DType::f8e4m3);
  const std::vector<float> a = prefill_logits(*m);
  const std::vector<float> online = prefill_logits(*load(bf16, without_quant(cfg), "fp8"));
  const std::vector<float> base = prefill_logits(*load(bf16, without_quant(cfg)));
  ASSERT_EQ(a.size(), online.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], online[i]) << i;
    num += (double(a[i]) - base[i]) * (double(a[i]) - base[i]);
    den += double(base[i]) * base[i];
  }
  // FP8 weights and activations (e4m3: <= 2^-4 relative per element, ~2^-5.5 rms) against the BF16 model: the
  // logits move (the test can fail both ways), by about that much, not more.
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.15);  // measured 0.068 (2026-12-06): about one e4m3 rounding per operand, over 2 layers
}

TEST(Fp8Model, Bf16ScalesWidenExactly) {
  const ModelConfig cfg = fp8_config();
  const fs::path dir = write_checkpoint("bf16_scales", cfg, is_decoder_linear, /*bf16_scales=*/true);
  auto m = load(dir, cfg);
  const Checkpoint ck = Checkpoint::open(dir.string());
  const Tensor s = ck.get("model.layers.1.mlp.down_proj.weight_scale_inv");
  ASSERT_EQ(s.dtype, DType::bf16);
  const ops::LinearWeight& down = m->weights().layers[1].down;
  for (int64_t i = 0; i < s.numel(); ++i)
    EXPECT_EQ(down.scale.ptr<float>()[i], bf16_to_f32(s.ptr<bf16_t>()[i]));
  for (float v : prefill_logits(*m)) ASSERT_TRUE(std::isfinite(v));
}

TEST(Fp8Model, ShardedCheckpointLoadsTheSame) {
  const ModelConfig cfg = fp8_config();
  const fs::path one = write_checkpoint("unsharded", cfg, is_decoder_linear);
  const Checkpoint ck = Checkpoint::open(one.string());
  // Two shards: every weight_scale_inv in the second file, away from its weight.
  const fs::path dir = test_support::process_scratch_dir("fp8_model") / "sharded";
  fs::create_directories(dir);
  std::vector<NamedTensor> a, b;
  nlohmann::json map;
  for (const std::string& n : ck.names()) {
    const bool second = n.find("weight_scale_inv") != std::string::npos;
    (second ? b : a).push_back({n, ck.get(n)});
    map[n] = second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  }
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), a);
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), b);
  std::ofstream(dir / "model.safetensors.index.json")
      << nlohmann::json{{"metadata", {}}, {"weight_map", map}}.dump();
  EXPECT_EQ(prefill_logits(*load(dir, cfg)), prefill_logits(*load(one, cfg)));
}

TEST(Fp8Model, LoaderRefusesBadTensorsNamingThem) {
  const ModelConfig cfg = fp8_config();
  const std::string o_scale = "model.layers.1.self_attn.o_proj.weight_scale_inv";
  static std::vector<float> wrong(64, 1.f);
  static std::vector<int32_t> ints(4, 1);
  static std::vector<uint8_t> bytes(512 * 200, 0x38);
  // A scale of the wrong shape.
  expect_contains(load_error(write_checkpoint("bad_shape", cfg, is_decoder_linear, false,
                                              [&](auto& t) {
                                                replace(t, o_scale, Tensor(wrong.data(), DType::f32, {1, 2}));
                                              }),
                             cfg),
                  {o_scale, "[2, 2]", "[1, 2]"});
  // A scale of the wrong dtype.
  expect_contains(load_error(write_checkpoint("bad_dtype", cfg, is_decoder_linear, false,
                                              [&](auto& t) {
                                                replace(t, o_scale, Tensor(ints.data(), DType::i32, {2, 2}));
                                              }),
                             cfg),
                  {o_scale, "F32 or BF16", "i32"});
  // A missing scale.
  expect_contains(load_error(write_checkpoint("no_scale", cfg, is_decoder_linear, false,
                                              [&](auto& t) { erase(t, o_scale); }),
                             cfg),
                  {"model.layers.1.self_attn.o_proj.weight", o_scale, "missing"});
  // An FP8 weight of the wrong shape.
  expect_contains(load_error(write_checkpoint("bad_weight", cfg, is_decoder_linear, false,
                                              [&](auto& t) {
                                                replace(t, "model.layers.0.self_attn.q_proj.weight",
                                                        Tensor(bytes.data(), DType::f8e4m3, {200, 256}));
                                              }),
                             cfg),
                  {"model.layers.0.self_attn.q_proj.weight", "[256, 200]", "[200, 256]"});
  // FP8 tensors without quantization_config.
  expect_contains(load_error(write_checkpoint("no_config", cfg, is_decoder_linear), without_quant(cfg)),
                  {"model.layers.0.self_attn.q_proj.weight", "quantization_config"});
  // A scale beside a bf16 weight.
  expect_contains(load_error(write_checkpoint(
                                 "stray_scale", cfg, [](const std::string&) { return false; }, false,
                                 [&](auto& t) {
                                   t.push_back({"model.layers.0.mlp.down_proj.weight_scale_inv",
                                                Tensor(wrong.data(), DType::f32, {2, 2})});
                                 }),
                             cfg),
                  {"model.layers.0.mlp.down_proj.weight_scale_inv", "F8_E4M3"});
  // q stored FP8, k and v bf16: one stacked matrix cannot mix them.
  expect_contains(
      load_error(write_checkpoint("mixed", cfg,
                                  [](const std::string& n) { return n.find("q_proj") != std::string::npos; }),
                 cfg),
      {"model.layers.0.self_attn.q_proj.weight", "stacked"});
  // An f16 linear in an FP8 checkpoint: the bf16 read names it.
  static std::vector<uint16_t> halves(size_t(200 * 256), 0x3c00);
  expect_contains(load_error(write_checkpoint(
                                 "f16", cfg, [](const std::string&) { return false; }, false,
                                 [&](auto& t) {
                                   replace(t, "model.layers.1.mlp.down_proj.weight",
                                           Tensor(halves.data(), DType::f16, {200, 256}));
                                 }),
                             cfg),
                  {"model.layers.1.mlp.down_proj.weight", "f16"});
}

TEST(Fp8Model, StackedPartsMustFillWholeBlocks) {
  const ModelConfig cfg = fp8_config(/*intermediate=*/160);  // gate_proj: 160 rows, then up_proj
  expect_contains(load_error(write_checkpoint("ragged_gate", cfg, is_decoder_linear), cfg),
                  {"model.layers.0.mlp.gate_proj.weight", "160 rows", "multiple of 128"});
}

TEST(Fp8Model, ModulesToNotConvertStayBf16) {
  ModelConfig cfg = fp8_config();
  cfg.quant.modules_to_not_convert = {"down_proj"};
  const auto not_down = [](const std::string& n) {
    return is_decoder_linear(n) && n.find("down_proj") == std::string::npos;
  };
  auto m = load(write_checkpoint("keep_down", cfg, not_down), cfg);
  EXPECT_TRUE(m->weights().layers[0].gate_up.is_fp8());
  EXPECT_FALSE(m->weights().layers[0].down.is_fp8());
  // Listed but stored F8_E4M3 with its scales: the storage decides (FP8).
  EXPECT_TRUE(
      load(write_checkpoint("listed_fp8", cfg, is_decoder_linear), cfg)->weights().layers[0].down.is_fp8());
  // Entries match whole dotted components only.
  QuantConfig q;
  q.modules_to_not_convert = {"mlp.gate", "layers.1"};
  EXPECT_FALSE(fp8_module_excluded(q, "model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(fp8_module_excluded(q, "model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(fp8_module_excluded(q, "model.layers.11.mlp.up_proj.weight"));
  EXPECT_TRUE(fp8_module_excluded(q, "model.layers.1.mlp.up_proj.weight"));
  // Random weights for such a config: quantized at load, the listed module kept bf16.
  LoadOptions o;
  auto r = Qwen3Model::create(cfg, nullptr, o);
  EXPECT_TRUE(r->weights().layers[1].qkv.is_fp8());
  EXPECT_FALSE(r->weights().layers[1].down.is_fp8());
}

TEST(Fp8Model, QuantizationOptionIsChecked) {
  const ModelConfig cfg = without_quant(fp8_config());
  LoadOptions o;
  o.quantization = "int4";
  expect_contains(error_of([&] { Qwen3Model::create(cfg, nullptr, o); }), {"--quantization", "int4"});
  o.quantization = "none";
  EXPECT_FALSE(Qwen3Model::create(cfg, nullptr, o)->weights().layers[0].qkv.is_fp8());
  o.quantization = "fp8";
  EXPECT_TRUE(Qwen3Model::create(cfg, nullptr, o)->weights().layers[0].qkv.is_fp8());
}
