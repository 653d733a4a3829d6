// Qwen3-VL (dense) from a block-FP8 checkpoint on the CPU backend, laid out as Qwen's Qwen3-VL-*-FP8 ship it:
// the text decoder's q/k/v/o and gate/up/down F8_E4M3 with F32 weight_scale_inv under model.language_model.,
// the embedding, norms and the whole vision tower BF16, quantization_config at the top of config.json.
// Pinned down (docs/NUMERICS.md "Block-FP8 linear layers": the CPU runs path (a) on the checkpoint's e4m3
// bytes, so a checkpoint equals online quantization of its BF16 source bit for bit):
//   - the config parses as FP8 whether quantization_config sits at the top or in text_config;
//   - text logits (M-RoPE position rows) equal the BF16 source loaded with --quantization fp8 bit for bit,
//     and differ from the BF16 model's by about one e4m3 rounding;
//   - the vision tower is read as BF16 (its outputs equal the BF16 source's bit for bit), and an image prompt
//     through the engine gives the online-quantized model's tokens and log-probs exactly;
//   - an F8_E4M3 vision weight is refused, naming the tensor (the tower runs BF16 only).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model_steps.h"
#include "common/moe_checkpoints.h"
#include "common/test_support.h"
#include "engine_test_util.h"
#include "model/fp8_weights.h"
#include "model/qwen3.h"
#include "model/qwen3_vl_vision.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/qwen3_runner.h"
#include "vl_test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using test_support::error_of;
using test_support::expect_contains;

constexpr const char* kTag = "model_vl_fp8";

// tiny_vl_config_json (hidden 64, q 4 x 64, kv 2 x 64, intermediate 128: every stacked part fills whole
// 128-row blocks, K = 64 is one partial block) with Qwen's FP8 block; the listed vision modules are what
// online quantization would leave BF16 (the tower is BF16 either way).
json fp8_vl_json() {
  json j = test::tiny_vl_config_json();
  j["quantization_config"] = json::parse(fp8_quantization_config_json({"lm_head", "model.visual"}));
  return j;
}
json bf16_vl_json() {
  return test::tiny_vl_config_json();
}

bool is_text_linear(const std::string& n) {
  return n.rfind("model.language_model.layers.", 0) == 0 && n.size() > 12 &&
         n.compare(n.size() - 12, 12, "_proj.weight") == 0;
}

// One set of seeded random weights (decoder and tower), written as the BF16 source and as its FP8 checkpoint
// (the linears chosen by `quantize` block-FP8, F32 scales); each write returns its folder.
struct Checkpoints {
  RandomWeights text, vision;
  Fp8CheckpointStorage fp8_storage;
  explicit Checkpoints(uint64_t seed)
      : text(random_weights(qwen3_weight_specs(parse_model_config(bf16_vl_json().dump(), "bf16 VL")), seed)),
        vision(random_weights(
            qwen3_vl_vision_weight_specs(parse_model_config(bf16_vl_json().dump(), "bf16 VL")), seed + 1)) {}
  std::vector<NamedTensor> all() const {
    std::vector<NamedTensor> t = text.tensors;
    t.insert(t.end(), vision.tensors.begin(), vision.tensors.end());
    return t;
  }
  fs::path write_bf16(const std::string& name) const {
    return test::write_json_checkpoint(kTag, name, bf16_vl_json(), all());
  }
  fs::path write_fp8(const std::string& name, const std::function<bool(const std::string&)>& quantize) {
    return test::write_json_checkpoint(kTag, name, fp8_vl_json(),
                                       quantize_checkpoint_linears(all(), quantize, false, fp8_storage));
  }
};

std::unique_ptr<Qwen3Model> load(const fs::path& dir, const std::string& quantization = "") {
  LoadOptions o;
  o.device = Device::cpu();
  o.quantization = quantization;
  return Qwen3Model::load(dir.string(), o);
}

const std::vector<int32_t> kPrompt = {5, 17, 33, 48, 64, 3, 31, 250, 7, 99, 120, 400, 2, 77, 310};

// Prefill then 5 greedy decode steps with three equal M-RoPE rows (the engine's text placement for
// Qwen3-VL); model_steps poisons the logits before each forward.
std::vector<std::vector<float>> text_steps(Qwen3Model& m) {
  return test::model_steps(m, kPrompt, 6, {}, DType::bf16, ops::KvLayout::nhd, 4,
                           [](BatchDesc& b) { b.set_text_mrope(); });
}

void expect_bitwise(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size());
    EXPECT_EQ(0, std::memcmp(got[s].data(), want[s].data(), want[s].size() * sizeof(float))) << "step " << s;
  }
}

bool bitwise_equal(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16_t)) == 0;
}

// Every token and log-prob of one greedy image request through the engine (vision tower, deepstack, M-RoPE
// image positions, the FP8 decoder).
struct ImageRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};
ImageRun run_image(const fs::path& dir, const std::string& quantization, const vision::ImagePatches& img) {
  auto runner = std::make_unique<Qwen3Runner>(load(dir, quantization), ops::KvLayout::nhd, DType::bf16);
  Engine engine(std::move(runner), test::small_opts(4096));
  Request r = test::greedy(test::vl_prompt({img}, 5, 2), 6);
  r.images = {img};
  r.sampling.ignore_eos = true;
  r.sampling.return_logprob = true;
  test::Sink sink;
  const RequestId id = engine.submit(r, sink.cb());
  sink.wait_finished(1);
  EXPECT_EQ(sink.last(id).finish_reason, "length") << sink.last(id).error;
  ImageRun out;
  out.tokens = sink.tokens(id);
  for (const TokenEvent& e : sink.events[id])
    out.logprobs.insert(out.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
  EXPECT_EQ(out.tokens.size(), 6u);
  EXPECT_EQ(out.logprobs.size(), 6u);
  test::expect_pool_clean(engine);
  return out;
}

}  // namespace

TEST(ConfigVlFp8, QuantizationConfigAtTheTopOrInTextConfig) {
  const ModelConfig top = parse_model_config(fp8_vl_json().dump(), "test config.json");
  EXPECT_EQ(top.arch, ModelArch::qwen3_vl_text);
  EXPECT_TRUE(top.has_vision);
  EXPECT_TRUE(top.quant.fp8());
  EXPECT_FALSE(top.quant.online);
  EXPECT_EQ(top.quant.modules_to_not_convert, (std::vector<std::string>{"lm_head", "model.visual"}));
  json nested = bf16_vl_json();
  nested["text_config"]["quantization_config"] = fp8_vl_json()["quantization_config"];
  EXPECT_TRUE(parse_model_config(nested.dump(), "test config.json").quant.fp8());
  EXPECT_FALSE(parse_model_config(bf16_vl_json().dump(), "test config.json").quant.fp8());
  // A refusal inside text_config names the nested field.
  nested["text_config"]["quantization_config"]["weight_block_size"] = {64, 64};
  expect_contains(error_of([&] { parse_model_config(nested.dump(), "test config.json"); }),
                  {"test config.json", "text_config.quantization_config.weight_block_size"});
}

TEST(ModelVlFp8, TextLogitsEqualOnlineQuantizationOfTheBf16SourceBitwise) {
  Checkpoints ck(21);
  const fs::path fp8 = ck.write_fp8("fp8", is_text_linear), bf16 = ck.write_bf16("bf16");
  auto m = load(fp8);
  ASSERT_TRUE(m->config().quant.fp8());
  EXPECT_EQ(m->config().weight_prefix, "model.language_model.");
  ASSERT_NE(m->vision(), nullptr);
  for (const LayerWeights& l : m->weights().layers) {
    ASSERT_TRUE(l.qkv.is_fp8() && l.o_proj.is_fp8() && l.gate_up.is_fp8() && l.down.is_fp8());
    EXPECT_EQ(l.qkv.scale.shape[0], 4);  // (256 + 128 + 128) / 128
    EXPECT_EQ(l.qkv.scale.shape[1], 1);  // ceil(64 / 128)
    EXPECT_EQ(l.o_proj.scale.shape[1], 2);
  }
  EXPECT_EQ(m->weights().embed.dtype, DType::bf16);

  const auto got = text_steps(*m);
  auto online = load(bf16, "fp8");
  ASSERT_TRUE(online->config().quant.online);
  ASSERT_TRUE(online->weights().layers[0].qkv.is_fp8());
  expect_bitwise(got, text_steps(*online));

  // Against the BF16 model: FP8 weights and activations move the logits (the comparison above is not of two
  // BF16 runs), by about one e4m3 rounding per operand, no more.
  const auto base = text_steps(*load(bf16));
  double num = 0, den = 0;
  for (size_t v = 0; v < base[0].size(); ++v) {  // the prefill step: both ran the same prompt
    num += (double(got[0][v]) - base[0][v]) * (double(got[0][v]) - base[0][v]);
    den += double(base[0][v]) * base[0][v];
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.15);  // test_model_fp8.cpp's bound; measured 0.056 here
}

TEST(ModelVlFp8, VisionTowerStaysBf16AndImagePromptEqualsOnlineQuantization) {
  Checkpoints ck(22);
  const fs::path fp8 = ck.write_fp8("fp8_image", is_text_linear), bf16 = ck.write_bf16("bf16_image");
  const vision::ImagePatches img = test::test_image(8, 12, 3);

  // The towers of the FP8 checkpoint and its BF16 source read the same BF16 tensors.
  auto m8 = load(fp8), m16 = load(bf16);
  ASSERT_NE(m8->vision(), nullptr);
  ASSERT_NE(m16->vision(), nullptr);
  EXPECT_EQ(m8->vision()->weights().blocks[0].qkv.w.dtype, DType::bf16);
  const std::vector<VisionOutput> a = m8->vision()->encode({&img}), b = m16->vision()->encode({&img});
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].tokens, 24);  // 8 x 12 patches merged 2 x 2
  EXPECT_TRUE(bitwise_equal(a[0].embeds, b[0].embeds));
  ASSERT_EQ(a[0].deepstack.size(), 2u);
  for (size_t l = 0; l < a[0].deepstack.size(); ++l)
    EXPECT_TRUE(bitwise_equal(a[0].deepstack[l], b[0].deepstack[l])) << l;

  // An image prompt end to end: the FP8 checkpoint gives online quantization's tokens and log-probs exactly,
  // and not the BF16 model's log-probs; another image changes them.
  const ImageRun got = run_image(fp8, "", img);
  const ImageRun online = run_image(bf16, "fp8", img);
  EXPECT_EQ(got.tokens, online.tokens);
  EXPECT_EQ(got.logprobs, online.logprobs);
  EXPECT_NE(got.logprobs, run_image(bf16, "", img).logprobs);
  EXPECT_NE(got.logprobs, run_image(fp8, "", test::test_image(8, 12, 4)).logprobs);
}

TEST(ModelVlFp8, Fp8VisionWeightsAreRefusedNamingTheTensor) {
  Checkpoints ck(23);
  const std::vector<std::string> names = {"model.visual.blocks.0.attn.qkv.weight",
                                          "model.visual.merger.linear_fc2.weight",
                                          "model.visual.deepstack_merger_list.1.linear_fc1.weight"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    SCOPED_TRACE(name);
    const fs::path dir = ck.write_fp8("fp8_visual_" + std::to_string(i),
                                      [&](const std::string& n) { return is_text_linear(n) || n == name; });
    const Checkpoint c = Checkpoint::open(dir.string());
    ASSERT_TRUE(c.has(name + "_scale_inv"));  // written as Qwen's format would store it
    ASSERT_EQ(c.get(name).dtype, DType::f8e4m3);
    expect_contains(error_of([&] { load(dir); }), {"'" + name + "'", "must be bf16"});
  }
}

}  // namespace kiln
