// `kiln demo-model --arch moe`, `kiln inspect` and `kiln generate --device cpu` on a Qwen3-MoE checkpoint, as
// a user runs them: the binary as a subprocess on a demo checkpoint written into a temp dir of this process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/kiln_process.h"
#include "common/model_steps.h"
#include "common/test_support.h"
#include "model/qwen3.h"

namespace fs = std::filesystem;
using kiln::test_support::kiln_bin;
using kiln::test_support::slurp;
using nlohmann::json;

namespace {

fs::path scratch() {
  return kiln::test_support::process_scratch_dir("cli_moe");
}

kiln::test_support::KilnResult run_kiln(const std::vector<std::string>& args) {
  return kiln::test_support::run_kiln(args, scratch());
}

class CliMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kiln_bin())) GTEST_SKIP() << "kiln binary not built at " << kiln_bin();
    dir_ = scratch() / "demo_moe";
    const auto r = run_kiln({"demo-model", dir_.string(), "--arch", "moe", "--seed", "4"});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(CliMoe, DemoCheckpointIsShardedInTheHubLayout) {
  const json cfg = json::parse(slurp(dir_ / "config.json"));
  EXPECT_EQ(cfg["architectures"], json{"Qwen3MoeForCausalLM"});
  EXPECT_EQ(cfg["model_type"], "qwen3_moe");
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  const json index = json::parse(slurp(dir_ / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_EQ(files,
            (std::set<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
  EXPECT_TRUE(index["weight_map"].contains("model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(index["weight_map"].contains("model.layers.3.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(index["weight_map"].contains("model.layers.0.mlp.gate_proj.weight"));  // layer 0 is dense
  EXPECT_FALSE(index["weight_map"].contains("model.layers.0.mlp.gate.weight"));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(dir_ / f)) << f;
}

TEST_F(CliMoe, InspectShowsTheExperts) {
  const auto r = run_kiln({"inspect", "--model", dir_.string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["config"]["arch"], "qwen3_moe");
  const json& moe = j["config"]["moe"];
  EXPECT_EQ(moe["num_experts"], 8);
  EXPECT_EQ(moe["num_experts_per_tok"], 2);
  EXPECT_EQ(moe["moe_intermediate_size"], 128);
  EXPECT_EQ(moe["norm_topk_prob"], true);
  EXPECT_EQ(moe["sparse_layers"], (json{1, 2, 3}));
  EXPECT_EQ(j["files"].size(), 2u);
  bool expert = false;
  for (const json& t : j["tensors"])
    expert |= t["name"] == "model.layers.2.mlp.experts.5.up_proj.weight" && t["shape"] == json{128, 256};
  EXPECT_TRUE(expert) << "expert 5's up_proj of layer 2 not listed as [128, 256]";
  const auto text = run_kiln({"inspect", "--model", dir_.string()});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("\"num_experts\":8"), std::string::npos) << text.out.substr(0, 2000);
}

// kiln generate --device cpu: the greedy ids and log-probs of the model stepped in-process.
TEST_F(CliMoe, GenerateOnTheCpuMatchesTheModelInProcess) {
  const auto r = run_kiln({"generate", "--model", dir_.string(), "--prompt-ids", "9707,11,1879,374",
                           "--max-tokens", "6", "--json", "--device", "cpu", "--ignore-eos"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  const auto lps = j["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(ids.size(), 6u);
  auto m = kiln::Qwen3Model::load(dir_.string(), kiln::LoadOptions{});
  const auto logits = kiln::test::model_steps(*m, {9707, 11, 1879, 374}, 6, {}, kiln::DType::bf16,
                                              kiln::ops::KvLayout::hnd, 16);
  for (size_t s = 0; s < ids.size(); ++s) {
    EXPECT_EQ(ids[s], kiln::test::argmax(logits[s])) << "step " << s;
    const auto lp = kiln::test_support::log_softmax(logits[s].data(), int64_t(logits[s].size()));
    EXPECT_NEAR(lps[s], lp[size_t(ids[s])], 1e-4) << "step " << s;
  }
}

// Tensor parallelism of MoE layers runs on the CPU (ops/moe.h: split intermediate): the same greedy ids as
// --tp 1; with --quantization fp8 the demo's 64-row slices (its KV heads, each expert's 128-row
// intermediate halved) would cut the 128 x 128 FP8 blocks, and that is refused, naming the block.
TEST_F(CliMoe, TensorParallelismOnTheCpuGeneratesAsOneRank) {
  std::vector<std::vector<int32_t>> ids;
  for (const char* tp : {"1", "2"}) {
    const auto r = run_kiln({"generate", "--model", dir_.string(), "--prompt-ids", "1,2,3", "--max-tokens",
                             "4", "--device", "cpu", "--tp", tp, "--json", "--ignore-eos"});
    ASSERT_EQ(r.code, 0) << r.err;
    ids.push_back(json::parse(r.out)["ids"].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(ids[0], ids[1]);
  const auto r = run_kiln({"generate", "--model", dir_.string(), "--prompt-ids", "1,2,3", "--max-tokens", "2",
                           "--device", "cpu", "--tp", "2", "--quantization", "fp8"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("128 x 128 FP8 block"), std::string::npos) << r.err;
}

// --quantization fp8: Qwen3-30B-A3B-FP8's layout (each expert projection F8_E4M3 with its weight_scale_inv,
// the router bf16), which `kiln generate` runs on the CPU exactly as the model in process does.
TEST_F(CliMoe, Fp8DemoCheckpointHasFp8ExpertsAndGenerates) {
  const fs::path dir = scratch() / "demo_moe_fp8";
  const auto made =
      run_kiln({"demo-model", dir.string(), "--arch", "moe", "--seed", "4", "--quantization", "fp8"});
  ASSERT_EQ(made.code, 0) << made.err;
  const json index = json::parse(slurp(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(index["weight_map"].contains("model.layers.3.mlp.experts.7.down_proj.weight_scale_inv"));
  EXPECT_FALSE(index["weight_map"].contains("model.layers.3.mlp.gate.weight_scale_inv"));
  auto m = kiln::Qwen3Model::load(dir.string(), kiln::LoadOptions{});
  const kiln::ops::MoeWeights& w = m->weights().layers[1].moe;
  ASSERT_TRUE(w.is_fp8());
  EXPECT_EQ(w.router.dtype, kiln::DType::bf16);
  const auto r = run_kiln({"generate", "--model", dir.string(), "--prompt-ids", "9707,11,1879",
                           "--max-tokens", "3", "--json", "--device", "cpu", "--ignore-eos"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto ids = json::parse(r.out)["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 3u);
  const auto logits =
      kiln::test::model_steps(*m, {9707, 11, 1879}, 3, {}, kiln::DType::bf16, kiln::ops::KvLayout::hnd, 16);
  for (size_t s = 0; s < ids.size(); ++s) EXPECT_EQ(ids[s], kiln::test::argmax(logits[s])) << "step " << s;
}

// `kiln demo-model --arch vl-moe`: the same decoder as --arch moe's (same seed) inside a
// Qwen3VLMoeForConditionalGeneration checkpoint, its experts fused and transposed as the hub ships
// Qwen3-VL-30B-A3B-Instruct; `kiln inspect` shows it as VL + MoE and `kiln generate` gives --arch moe's ids
// and log-probs exactly (text tokens: M-RoPE rows equal plain RoPE), also with --quantization fp8 (the fused
// experts quantized at load into the blocks the per-expert ones get).
TEST_F(CliMoe, VlMoeDemoHoldsTheMoeDecoderAndGeneratesAsIt) {
  const fs::path dir = scratch() / "demo_vl_moe";
  const auto made = run_kiln({"demo-model", dir.string(), "--arch", "vl-moe", "--seed", "4"});
  ASSERT_EQ(made.code, 0) << made.err;
  const json cfg = json::parse(slurp(dir / "config.json"));
  EXPECT_EQ(cfg["architectures"], json{"Qwen3VLMoeForConditionalGeneration"});
  EXPECT_EQ(cfg["model_type"], "qwen3_vl_moe");
  EXPECT_EQ(cfg["text_config"]["model_type"], "qwen3_vl_moe_text");
  EXPECT_EQ(cfg["text_config"]["num_experts"], 8);
  EXPECT_TRUE(fs::exists(dir / "preprocessor_config.json"));
  const json index = json::parse(slurp(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(index["weight_map"].contains("model.language_model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(index["weight_map"].contains("model.language_model.layers.1.mlp.experts.0.up_proj.weight"));
  EXPECT_TRUE(index["weight_map"].contains("model.visual.patch_embed.proj.weight"));

  const auto ins = run_kiln({"inspect", "--model", dir.string(), "--json"});
  ASSERT_EQ(ins.code, 0) << ins.err;
  const json j = json::parse(ins.out);
  EXPECT_EQ(j["config"]["arch"], "qwen3_vl_moe_text");
  EXPECT_EQ(j["config"]["moe"]["sparse_layers"], (json{1, 2, 3}));
  EXPECT_EQ(j["config"]["vision"]["depth"], 3);
  bool gate_up = false, down = false;  // [E, H, 2I] and [E, I, H]: H = 256, I = 128
  for (const json& t : j["tensors"]) {
    gate_up |= t["name"] == "model.language_model.layers.2.mlp.experts.gate_up_proj" &&
               t["shape"] == json{8, 256, 256};
    down |=
        t["name"] == "model.language_model.layers.2.mlp.experts.down_proj" && t["shape"] == json{8, 128, 256};
  }
  EXPECT_TRUE(gate_up && down) << "layer 2's fused experts not listed as [8, 256, 256] and [8, 128, 256]";

  for (const std::string quant : {"none", "fp8"}) {
    SCOPED_TRACE("--quantization " + quant);
    std::vector<json> out;
    for (const fs::path& d : {dir_, dir}) {
      const auto r =
          run_kiln({"generate", "--model", d.string(), "--prompt-ids", "9707,11,1879,374", "--max-tokens",
                    "5", "--json", "--device", "cpu", "--ignore-eos", "--quantization", quant});
      ASSERT_EQ(r.code, 0) << r.err;
      out.push_back(json::parse(r.out));
    }
    EXPECT_EQ(out[1]["ids"], out[0]["ids"]);
    EXPECT_EQ(out[1]["logprobs"], out[0]["logprobs"]);
  }
}
