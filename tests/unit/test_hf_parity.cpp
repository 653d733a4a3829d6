// The `kiln` binary against Hugging Face transformers, through the CLI only (no internal APIs):
//   kiln generate --model tests/fixtures/hf/<name> --prompt-ids ... --max-tokens 20 --json
// must reproduce HF's greedy continuation and its log-probs (tests/fixtures/make_hf_fixtures.py made them:
// bf16 weights, attn_implementation="eager", CPU). Also `kiln inspect`, the CLI face of io.
// A missing binary or subcommand is a failure, not a skip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/hf_parity.h"
#include "common/kiln_process.h"

using json = nlohmann::json;
namespace fs = std::filesystem;
using kiln::test_support::KilnResult;
using kiln::test_support::run_kiln;

namespace {

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf";

void check_fixture(const std::string& name) {
  kiln::test_support::check_hf_fixture_cli(kFixtures / name, 3);
}

// A scratch directory for one test's subprocess output, removed at the end of the test.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("kiln_cli_inspect_" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

}  // namespace

TEST(HfParity, Gqa4HeadDim64Tied) {
  check_fixture("qwen3_gqa4_d64_tied");
}
TEST(HfParity, Gqa2HeadDim128Untied) {
  check_fixture("qwen3_gqa2_d128_untied");
}
TEST(HfParity, Gqa3HeadDim32Tied) {
  check_fixture("qwen3_gqa3_d32_tied");
}

TEST(CliInspect, ListsConfigAndTensors) {
  const Scratch s;
  const std::string fixture = (kFixtures / "qwen3_gqa2_d128_untied").string();
  const KilnResult r = run_kiln({"inspect", "--model", fixture, "--json"}, s.dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["config"]["arch"], "qwen3");
  EXPECT_EQ(j["config"]["num_heads"], 4);
  EXPECT_EQ(j["config"]["num_kv_heads"], 2);
  EXPECT_EQ(j["config"]["head_dim"], 128);
  EXPECT_EQ(j["config"]["tie_word_embeddings"], false);
  EXPECT_EQ(j["tensors"].size(), 2u * 11u + 3u);  // 11 per layer, embed, final norm, lm_head
  bool found = false;
  for (const json& t : j["tensors"]) {
    if (t["name"] == "model.layers.1.self_attn.k_proj.weight") {
      found = true;
      EXPECT_EQ(t["dtype"], "BF16");
      EXPECT_EQ(t["shape"], json::array({256, 64}));
      EXPECT_EQ(t["bytes"], 256 * 64 * 2);
      EXPECT_EQ(t["file"], "model.safetensors");
    }
  }
  EXPECT_TRUE(found);
  // Plain text lists the same tensors.
  const KilnResult t = run_kiln({"inspect", "--model", fixture}, s.dir);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos);
  EXPECT_NE(t.out.find("[256,64]"), std::string::npos);
}

TEST(CliInspect, BadCheckpointIsOneClearError) {
  const Scratch s;
  const fs::path dir = s.dir / "ckpt";
  fs::create_directories(dir);
  fs::copy_file(kFixtures / "qwen3_gqa4_d64_tied/config.json", dir / "config.json");
  // A safetensors file cut short: its header promises more data than there is.
  std::ifstream in(kFixtures / "qwen3_gqa4_d64_tied/model.safetensors", std::ios::binary);
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  bytes.resize(bytes.size() / 2);
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      .write(bytes.data(), std::streamsize(bytes.size()));
  const KilnResult r = run_kiln({"inspect", "--model", dir.string()}, s.dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("out of range"), std::string::npos) << r.err;
  const KilnResult m = run_kiln({"inspect", "--model", (dir / "nope").string()}, s.dir);
  EXPECT_EQ(m.code, 1);
  EXPECT_NE(m.err.find("config.json"), std::string::npos) << m.err;
}
