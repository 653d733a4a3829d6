// Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration) on the CPU backend: a tiny VL-MoE checkpoint whose text
// decoder holds the weights of a Qwen3-MoE checkpoint (one set of random weights, written twice) gives the
// Qwen3-MoE logits bit for bit on a text prompt, whichever expert layout it stores (the hub's fused and
// transposed one, transformers 5's fused one, per expert). Text tokens get three equal M-RoPE rows, which
// rotate exactly as plain RoPE does (the dense VL tests' argument, test_model_vl.cpp), and transformers'
// Qwen3-VL-MoE router always renormalizes, as Qwen3-MoE's with norm_topk_prob true does. An image prompt runs
// through the engine; tensor parallelism slices the fused experts as it slices per-expert ones; bad
// checkpoints and configs are refused naming the tensor or field.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/model_steps.h"
#include "common/moe_checkpoints.h"
#include "common/test_support.h"
#include "engine_test_util.h"
#include "model/qwen3.h"
#include "model/qwen3_moe.h"
#include "model/qwen3_vl_vision.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_runner.h"
#include "vl_test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using test_support::error_of;
using test_support::expect_contains;

constexpr int64_t kExperts = 4, kTopK = 2, kWidth = 24, kHidden = 64;

// tiny_vl_config_json's decoder with Qwen3-MoE's sparse MLP: layer 0 dense, layer 1 sparse.
json vl_moe_json() {
  json j = test::tiny_vl_config_json();
  j["architectures"] = {"Qwen3VLMoeForConditionalGeneration"};
  j["model_type"] = "qwen3_vl_moe";
  json& t = j["text_config"];
  t["model_type"] = "qwen3_vl_moe_text";
  t["num_experts"] = kExperts;
  t["num_experts_per_tok"] = kTopK;
  t["moe_intermediate_size"] = kWidth;
  t["decoder_sparse_step"] = 1;
  t["mlp_only_layers"] = {0};
  return j;
}

// The same decoder as a Qwen3MoeForCausalLM config (plain RoPE, renormalized top-k).
json moe_json() {
  json t = vl_moe_json()["text_config"];
  t.erase("rope_parameters");
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000.0}};
  t["tie_word_embeddings"] = true;
  return test::moe_config_json(t, kExperts, kTopK, kWidth, true, json{0});
}

ModelConfig parse(const json& j) {
  return parse_model_config(j.dump(), "test config.json");
}

// One set of random weights, as a Qwen3-MoE checkpoint (per expert, "model.") and as a Qwen3-VL-MoE one
// ("model.language_model.", the experts in `layout`, plus a vision tower).
struct Checkpoints {
  RandomWeights text, vision;
  std::deque<std::vector<bf16_t>> fused;
  explicit Checkpoints(uint64_t seed)
      : text(random_weights(qwen3_weight_specs(parse(moe_json())), seed)),
        vision(random_weights(qwen3_vl_vision_weight_specs(parse(vl_moe_json())), seed)) {}

  std::vector<NamedTensor> vl_moe(ExpertLayout layout) {
    std::vector<NamedTensor> t =
        layout == ExpertLayout::per_expert
            ? text.tensors
            : fuse_checkpoint_experts(parse(moe_json()), text.tensors, layout, fused);
    for (NamedTensor& n : t)
      if (n.name.rfind("model.", 0) == 0) n.name = "model.language_model." + n.name.substr(6);
    t.insert(t.end(), vision.tensors.begin(), vision.tensors.end());
    return t;
  }
};

fs::path write(const std::string& name, const json& cfg, const std::vector<NamedTensor>& tensors) {
  return test::write_json_checkpoint("model_vl_moe", name, cfg, tensors);
}

std::unique_ptr<Qwen3Model> load(const fs::path& dir) {
  return Qwen3Model::load(dir.string(), LoadOptions{});
}

const std::vector<int32_t> kPrompt = {5, 17, 33, 48, 64, 3, 31, 250, 7, 99, 120, 400, 2};

std::vector<std::vector<float>> steps(Qwen3Model& m, bool mrope) {
  test::BatchEdit edit;
  if (mrope) edit = [](BatchDesc& b) { b.set_text_mrope(); };
  return test::model_steps(m, kPrompt, 5, {}, DType::bf16, ops::KvLayout::nhd, 4, edit);
}

void expect_bitwise(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size());
    EXPECT_EQ(0, std::memcmp(got[s].data(), want[s].data(), want[s].size() * sizeof(float))) << "step " << s;
  }
}

}  // namespace

TEST(ConfigVlMoe, ParsedAsTheVlLayoutWithQwen3MoeExperts) {
  json j = vl_moe_json();
  j["text_config"]["norm_topk_prob"] = false;  // transformers' Qwen3-VL-MoE router ignores it
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, ModelArch::qwen3_vl_text);
  EXPECT_EQ(c.architecture, "Qwen3VLMoeForConditionalGeneration");
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_TRUE(c.has_vision);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{12, 10, 10}));
  EXPECT_EQ(c.moe.num_experts, kExperts);
  EXPECT_EQ(c.moe.num_experts_per_tok, kTopK);
  EXPECT_EQ(c.moe.moe_intermediate_size, kWidth);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  json by_type = vl_moe_json();  // model_type alone names it too
  by_type.erase("architectures");
  EXPECT_EQ(parse(by_type).architecture, "Qwen3VLMoeForConditionalGeneration");
  // The dense Qwen3-VL keeps ignoring MoE-looking fields.
  json dense = vl_moe_json();
  dense["architectures"] = {"Qwen3VLForConditionalGeneration"};
  EXPECT_EQ(parse(dense).moe.num_experts, 0);
}

TEST(ConfigVlMoe, RejectionsNameTheField) {
  const auto error_with = [](const char* key, const json& value) {
    json j = vl_moe_json();
    if (value.is_null())
      j["text_config"].erase(key);
    else
      j["text_config"][key] = value;
    return error_of([&] { parse(j); });
  };
  expect_contains(error_with("num_experts_per_tok", kExperts + 1),
                  {"text_config.num_experts_per_tok", "exceeds num_experts (4)"});
  expect_contains(error_with("num_experts", nullptr), {"num_experts", "missing"});
  expect_contains(error_with("moe_intermediate_size", nullptr), {"text_config.moe_intermediate_size"});
  expect_contains(error_with("decoder_sparse_step", 0), {"text_config.decoder_sparse_step", ">= 1"});
  expect_contains(error_with("mlp_only_layers", json{2}), {"text_config.mlp_only_layers", "holds 2"});
}

// (a) The VL-MoE text path equals Qwen3-MoE's bit for bit, for each expert layout a checkpoint may hold.
TEST(ModelVlMoe, TextLogitsEqualQwen3MoeBitwiseInEveryExpertLayout) {
  Checkpoints ck(3);
  auto moe = load(write("moe", moe_json(), ck.text.tensors));
  const auto want = steps(*moe, false);
  for (const ExpertLayout layout :
       {ExpertLayout::fused_transposed, ExpertLayout::fused, ExpertLayout::per_expert}) {
    SCOPED_TRACE("layout " + std::to_string(int(layout)));
    auto vl = load(write("vl_moe_" + std::to_string(int(layout)), vl_moe_json(), ck.vl_moe(layout)));
    ASSERT_TRUE(vl->config().has_vision);
    const ops::MoeWeights& w = vl->weights().layers[1].moe;
    ASSERT_TRUE(w.present());
    EXPECT_TRUE(w.norm_topk_prob);
    EXPECT_EQ(w.gate_up.shape[0], kExperts);
    EXPECT_EQ(w.gate_up.shape[1], 2 * kWidth);
    EXPECT_EQ(w.gate_up.shape[2], kHidden);
    EXPECT_FALSE(vl->weights().layers[0].moe.present());
    expect_bitwise(steps(*vl, true), want);
  }
}

// The hub's layout converted at load: expert e's gate rows are gate_up_proj[e][:, :I] transposed, its up
// rows gate_up_proj[e][:, I:], its down matrix down_proj[e] transposed.
TEST(ModelVlMoe, FusedTransposedExpertsAreTransposedAtLoad) {
  Checkpoints ck(4);
  auto vl = load(write("layout", vl_moe_json(), ck.vl_moe(ExpertLayout::fused_transposed)));
  const ops::MoeWeights& w = vl->weights().layers[1].moe;
  const auto* gu = w.gate_up.ptr<bf16_t>();
  const auto* dn = w.down.ptr<bf16_t>();
  const int64_t E = kExperts, I = kWidth, H = kHidden;
  for (const NamedTensor& t : ck.text.tensors) {
    const std::string p = "model.layers.1.mlp.experts.";
    if (t.name.rfind(p, 0) != 0) continue;
    const std::string rest = t.name.substr(p.size());
    const int64_t e = std::stoll(rest.substr(0, rest.find('.')));
    ASSERT_LT(e, E);
    const auto* src = t.tensor.ptr<bf16_t>();
    const bool gate = rest.find("gate_proj") != std::string::npos,
               up = rest.find("up_proj") != std::string::npos;
    const int64_t n = gate || up ? I * H : H * I;
    const bf16_t* dst = gate ? gu + e * 2 * I * H : up ? gu + e * 2 * I * H + I * H : dn + e * H * I;
    EXPECT_EQ(0, std::memcmp(src, dst, size_t(n) * sizeof(bf16_t))) << t.name;
  }
}

// (b) An image prompt through the engine (vision tower, deepstack, M-RoPE image positions, sparse layers):
// every request finishes, the same image gives the same tokens and log-probs, another image other ones.
TEST(EngineVlMoe, ImagePromptRunsEndToEnd) {
  Checkpoints ck(5);
  const fs::path dir = write("engine", vl_moe_json(), ck.vl_moe(ExpertLayout::fused_transposed));
  LoadOptions lo;
  lo.device = Device::cpu();
  auto runner =
      std::make_unique<Qwen3Runner>(Qwen3Model::load(dir.string(), lo), ops::KvLayout::nhd, DType::bf16);
  Engine engine(std::move(runner), test::small_opts(4096));
  const std::vector<vision::ImagePatches> a = {test::test_image(8, 12, 1)}, b = {test::test_image(8, 12, 2)};
  const auto request = [](const std::vector<vision::ImagePatches>& imgs) {
    Request r = test::greedy(test::vl_prompt(imgs, 6, 1), 6);
    r.images = imgs;
    r.sampling.ignore_eos = true;
    r.sampling.return_logprob = true;
    return r;
  };
  const auto out = test::run_requests(engine, {request(a), request(a), request(b)});
  for (const test::Finished& f : out) {
    EXPECT_EQ(f.last.finish_reason, "length") << f.last.error;
    EXPECT_EQ(f.tokens.size(), 6u);
  }
  EXPECT_EQ(out[0].tokens, out[1].tokens);
  EXPECT_EQ(out[0].last.logprobs, out[1].last.logprobs);
  EXPECT_NE(out[0].last.logprobs, out[2].last.logprobs);
  test::expect_pool_clean(engine);
}

// Tensor parallelism (each expert's intermediate split, or whole experts per rank) reads the fused and
// transposed experts as it reads per-expert ones: the same bits. (It serves the text decoder alone: a
// checkpoint without vision_config; kiln's TP does not shard the vision tower.)
TEST(TpVlMoe, FusedTransposedExpertsShardAsPerExpertOnes) {
  Checkpoints ck(6);
  json text_only = vl_moe_json();
  text_only.erase("vision_config");
  const fs::path per_expert = write("tp_per_expert", text_only, ck.vl_moe(ExpertLayout::per_expert));
  const fs::path fused = write("tp_fused", text_only, ck.vl_moe(ExpertLayout::fused_transposed));
  BatchDesc batch;
  batch.page_size = 16;
  for (size_t i = 0; i < kPrompt.size(); ++i) {
    batch.tokens.push_back(kPrompt[i]);
    batch.positions.push_back(int32_t(i));
    batch.slot_mapping.push_back(int64_t(i));
  }
  batch.cu_q = {0, int32_t(kPrompt.size())};
  batch.kv_lens = {int32_t(kPrompt.size())};
  batch.pages_stride = 1;
  batch.page_table = {0};
  batch.logit_rows = {int32_t(kPrompt.size()) - 1};
  batch.set_text_mrope();
  for (const bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "expert parallel" : "intermediate split");
    std::vector<std::vector<float>> logits;
    for (const fs::path& dir : {per_expert, fused}) {
      EngineOptions o;
      o.model_dir = dir.string();
      o.device = "cpu";
      TpRunnerOptions to;
      to.tp = 2;
      to.expert_parallel = ep;
      TpRunner tp(o, to);
      tp.allocate_kv(1, 16);
      logits.emplace_back();
      tp.forward(batch, &logits.back(), nullptr);
    }
    ASSERT_EQ(logits[0].size(), size_t(512));
    EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)));
  }
}

// (c) Checkpoints whose fused experts are missing, misshapen or not bf16 are refused naming the tensor.
TEST(ModelVlMoe, BadFusedExpertsAreRefusedNamingTheTensor) {
  Checkpoints ck(7);
  const std::string L = "model.language_model.layers.1.mlp.experts.";
  const auto edited = [&](const std::string& drop, const NamedTensor* add) {
    std::vector<NamedTensor> t;
    for (const NamedTensor& n : ck.vl_moe(ExpertLayout::fused_transposed))
      if (n.name != drop) t.push_back(n);
    if (add) t.push_back(*add);
    return t;
  };
  const auto refusal = [&](const std::string& name, const std::vector<NamedTensor>& t) {
    const fs::path dir = write(name, vl_moe_json(), t);
    return error_of([&] { load(dir); });
  };
  expect_contains(refusal("no_down", edited(L + "down_proj", nullptr)),
                  {L + "down_proj", L + "gate_up_proj", "no"});
  std::vector<bf16_t> buf(size_t(kExperts * kHidden * 2 * kWidth * 2));
  const NamedTensor bad_gate_up{L + "gate_up_proj", Tensor(buf.data(), DType::bf16, {kExperts, kHidden, 50})};
  expect_contains(refusal("bad_gate_up", edited(L + "gate_up_proj", &bad_gate_up)),
                  {L + "gate_up_proj", "[4, 64, 50]", "[4, 64, 48]"});
  const NamedTensor bad_down{L + "down_proj",
                             Tensor(buf.data(), DType::bf16, {kExperts, kWidth, kHidden + 1})};
  expect_contains(refusal("bad_down", edited(L + "down_proj", &bad_down)), {L + "down_proj", "[4, 24, 65]"});
  const NamedTensor f32_down{L + "down_proj", Tensor(buf.data(), DType::f32, {kExperts, kWidth, kHidden})};
  expect_contains(refusal("f32_down", edited(L + "down_proj", &f32_down)), {L + "down_proj", "bf16 only"});
  // A per-expert checkpoint missing one expert's tensor names it (Qwen3-MoE's path).
  std::vector<NamedTensor> missing;
  for (const NamedTensor& n : ck.vl_moe(ExpertLayout::per_expert))
    if (n.name != L + "2.up_proj.weight") missing.push_back(n);
  expect_contains(refusal("missing_expert", missing), {L + "2.up_proj.weight"});
}

}  // namespace kiln
