// An FP8 model end to end on the CPU backend as a user runs it: `kiln demo-model --quantization fp8` writes
// Qwen's -FP8 layout, `kiln inspect` reports it, `kiln generate --device cpu` runs it, and online
// quantization of the BF16 demo (`--quantization fp8`) generates the same tokens and log-probs bit for bit.
// The same for the Qwen3-VL demo (`--arch vl --quantization fp8`: decoder linears under model.language_model.
// block-FP8, the vision tower BF16), whose text generation also equals the plain FP8 demo's of the seed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/kiln_process.h"
#include "common/test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Result = kiln::test_support::KilnResult;
using kiln::test_support::kiln_bin;
using kiln::test_support::slurp;

// This process's scratch folder (removed at exit): the demo checkpoints and the subprocess output.
fs::path tmp_root() {
  return kiln::test_support::process_scratch_dir("cli_fp8");
}

class CliFp8 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kiln_bin())) return;
    ASSERT_EQ(kiln::test_support::run_kiln({"demo-model", (tmp_root() / "bf16").string(), "--seed", "4"},
                                           tmp_root())
                  .code,
              0);
    const Result r = kiln::test_support::run_kiln(
        {"demo-model", (tmp_root() / "fp8").string(), "--seed", "4", "--quantization", "fp8"}, tmp_root());
    ASSERT_EQ(r.code, 0) << r.err;
  }
  void SetUp() override {
    if (!fs::exists(kiln_bin())) GTEST_SKIP() << "kiln binary not built at " << kiln_bin();
  }
};

json generate(const std::string& model, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"generate",
                                   "--model",
                                   (tmp_root() / model).string(),
                                   "--json",
                                   "--device",
                                   "cpu",
                                   "--prompt-ids",
                                   "9707,11,1879,0",
                                   "--max-tokens",
                                   "6",
                                   "--ignore-eos"};
  args.insert(args.end(), extra.begin(), extra.end());
  const Result r = kiln::test_support::run_kiln(args, tmp_root());
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? json::parse(r.out) : json{};
}

}  // namespace

TEST_F(CliFp8, DemoCheckpointHasQwenFp8Layout) {
  const json cfg = json::parse(slurp(tmp_root() / "fp8" / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(cfg["quantization_config"]["weight_block_size"], json::array({128, 128}));
  const Result r = kiln::test_support::run_kiln(
      {"inspect", "--model", (tmp_root() / "fp8").string(), "--json"}, tmp_root());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["fp8_linears"], 4 * 7);  // 4 layers x q, k, v, o, gate, up, down
  EXPECT_NE(j["config"]["quantization"].get<std::string>().find("fp8"), std::string::npos);
  int scales = 0;
  for (const json& t : j["tensors"]) {
    const std::string n = t["name"];
    if (n == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(t["dtype"], "F8_E4M3");
    }
    if (n == "model.layers.0.self_attn.q_proj.weight_scale_inv") {
      EXPECT_EQ(t["shape"], json::array({4, 2}));
    }
    if (n == "model.embed_tokens.weight") {
      EXPECT_EQ(t["dtype"], "BF16");
    }
    if (n == "model.layers.0.self_attn.q_norm.weight") {
      EXPECT_EQ(t["dtype"], "BF16");
    }
    scales += n.find("weight_scale_inv") != std::string::npos;
  }
  EXPECT_EQ(scales, 4 * 7);
  const Result text =
      kiln::test_support::run_kiln({"inspect", "--model", (tmp_root() / "fp8").string()}, tmp_root());
  EXPECT_NE(text.out.find("quantization: fp8 (checkpoint"), std::string::npos) << text.out;
}

TEST_F(CliFp8, GeneratesOnTheCpuAndEqualsOnlineQuantization) {
  const json a = generate("fp8", {});
  const json b = generate("bf16", {"--quantization", "fp8"});
  const json c = generate("bf16", {});
  ASSERT_TRUE(a.contains("ids") && b.contains("ids") && c.contains("ids"));
  EXPECT_EQ(a["ids"].size(), 6u);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["logprobs"],
            b["logprobs"]);  // bitwise: the checkpoint is the online quantization of the same weights
  EXPECT_NE(a["logprobs"], c["logprobs"]);  // and FP8 is not BF16
}

TEST_F(CliFp8, BadQuantizationFlagIsOneClearError) {
  const Result r =
      kiln::test_support::run_kiln({"generate", "--model", (tmp_root() / "bf16").string(), "--device", "cpu",
                                    "--prompt-ids", "1,2", "--quantization", "awq"},
                                   tmp_root());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--quantization must be none or fp8, got 'awq'"), std::string::npos) << r.err;
}

TEST_F(CliFp8, VlDemoIsReportedAndGeneratesAsOnlineQuantization) {
  const fs::path vl8 = tmp_root() / "vl_fp8", vl = tmp_root() / "vl_bf16";
  for (const auto& [dir, quant] : {std::pair{vl8, "fp8"}, std::pair{vl, "none"}}) {
    const Result r = kiln::test_support::run_kiln(
        {"demo-model", dir.string(), "--arch", "vl", "--seed", "4", "--quantization", quant}, tmp_root());
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const json cfg = json::parse(slurp(vl8 / "config.json"));
  EXPECT_EQ(cfg["architectures"], json{"Qwen3VLForConditionalGeneration"});
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "fp8");

  const Result r = kiln::test_support::run_kiln({"inspect", "--model", vl8.string(), "--json"}, tmp_root());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["config"]["arch"], "qwen3_vl_text");
  EXPECT_EQ(j["config"]["vision"]["depth"], 3);
  EXPECT_NE(j["config"]["quantization"].get<std::string>().find("fp8 (checkpoint"), std::string::npos);
  EXPECT_EQ(j["fp8_linears"], 4 * 7);  // the decoder's; none of the tower's
  int scales = 0, visual = 0;
  for (const json& t : j["tensors"]) {
    const std::string n = t["name"];
    if (n == "model.language_model.layers.3.mlp.down_proj.weight") {
      EXPECT_EQ(t["dtype"], "F8_E4M3");
    }
    if (n == "model.language_model.layers.0.self_attn.q_proj.weight_scale_inv") {
      EXPECT_EQ(t["shape"], json::array({4, 2}));  // [512 / 128, 256 / 128]
    }
    if (n.rfind("model.visual.", 0) == 0) {
      ++visual;
      EXPECT_EQ(t["dtype"], "BF16") << n;
    }
    scales += n.find("weight_scale_inv") != std::string::npos;
  }
  EXPECT_EQ(scales, 4 * 7);
  EXPECT_GT(visual, 0);
  const Result text = kiln::test_support::run_kiln({"inspect", "--model", vl8.string()}, tmp_root());
  EXPECT_NE(text.out.find("quantization: fp8 (checkpoint"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("28 linears stored F8_E4M3"), std::string::npos) << text.out;

  const json a = generate("vl_fp8", {});
  const json online = generate("vl_bf16", {"--quantization", "fp8"});
  const json plain = generate("fp8", {});  // the same decoder weights (seed 4), plain RoPE
  const json bf16 = generate("vl_bf16", {});
  ASSERT_TRUE(a.contains("ids") && online.contains("ids") && plain.contains("ids") && bf16.contains("ids"));
  EXPECT_EQ(a["ids"].size(), 6u);
  EXPECT_EQ(a["ids"], online["ids"]);
  EXPECT_EQ(a["logprobs"], online["logprobs"]);  // bitwise: the checkpoint is online quantization's bytes
  EXPECT_EQ(a["ids"], plain["ids"]);
  EXPECT_EQ(a["logprobs"], plain["logprobs"]);  // three equal M-RoPE rows rotate as plain RoPE does
  EXPECT_NE(a["logprobs"], bf16["logprobs"]);
}
