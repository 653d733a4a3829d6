// YaRN against Hugging Face transformers: tests/fixtures/make_hf_yarn_fixture.py (run on the device machine)
// saved two tiny Qwen3 checkpoints whose rope block is YaRN, with HF's greedy paths and log-probs
// (hf_reference.json) and HF's own rotary inverse frequencies and attention scaling. Checked here:
//   - kiln's inverse frequencies and attention factor, from config.json alone, against HF's;
//   - `kiln generate --json --device cpu` against HF's greedy continuations (common/hf_parity.h bounds),
//     with config.json as transformers 5 wrote it and rewritten in the 4.x spelling (rope_scaling).
// Until the fixtures are generated and committed, each test SKIPS and says how to make them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/hf_parity.h"
#include "common/test_support.h"
#include "kiln/config.h"
#include "ops/rope_table.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf";
constexpr size_t kCases = 4;  // prompts of 1, 9, 40 and 150 tokens

#define SKIP_WITHOUT_FIXTURE(dir)                                                \
  if (!fs::exists((dir) / "hf_reference.json"))                                  \
  GTEST_SKIP() << "fixture " << (dir).string()                                   \
               << " is absent: generate it on the device machine with `python3 " \
                  "tests/fixtures/make_hf_yarn_fixture.py --out tests/fixtures/hf` and commit it"

void check_rope_against_hf(const fs::path& dir) {
  const json ref = kiln::test_support::load_hf_reference(dir);
  ASSERT_TRUE(ref.contains("rope")) << "hf_reference.json has no \"rope\"";
  const kiln::ModelConfig cfg = kiln::load_model_config(dir.string());
  ASSERT_EQ(cfg.rope_scaling.kind, kiln::RopeScalingKind::yarn);
  EXPECT_NEAR(cfg.rope_scaling.attention_factor, ref["rope"]["attention_scaling"].get<double>(), 1e-6);
  const auto hf = ref["rope"]["inv_freq"].get<std::vector<double>>();
  const auto got = kiln::ops::rope_inv_freq(int(cfg.rotary_dim()), cfg.rope_theta, cfg.rope_scaling);
  ASSERT_EQ(got.size(), hf.size());
  for (size_t i = 0; i < hf.size(); ++i)  // HF computes in float32: a few ulps of it
    EXPECT_NEAR(got[i], hf[i], 4e-7 * hf[i] + 1e-30) << "pair " << i;
}

// The fixture with config.json in transformers 4.x's spelling: top-level rope_theta, rope_scaling.
fs::path with_v4_spelling(const fs::path& dir) {
  const fs::path out = kiln::test_support::process_scratch_dir("hf_yarn_v4") / dir.filename();
  fs::remove_all(out);
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(dir)) fs::copy_file(e.path(), out / e.path().filename());
  std::ifstream in(dir / "config.json");
  json cfg = json::parse(in);
  json block = cfg.contains("rope_parameters") ? cfg["rope_parameters"] : cfg["rope_scaling"];
  cfg.erase("rope_parameters");
  cfg["rope_theta"] = block["rope_theta"];
  block.erase("rope_theta");
  cfg["rope_scaling"] = block;
  std::ofstream(out / "config.json", std::ios::trunc) << cfg.dump(2);
  return out;
}

void check_fixture(const std::string& name) {
  const fs::path dir = kFixtures / name;
  SKIP_WITHOUT_FIXTURE(dir);
  {
    SCOPED_TRACE("rotary table");
    check_rope_against_hf(dir);
  }
  {
    SCOPED_TRACE("config.json as saved (transformers 5)");
    kiln::test_support::check_hf_fixture_cli(dir, kCases);
  }
  {
    SCOPED_TRACE("config.json in the 4.x spelling");
    kiln::test_support::check_hf_fixture_cli(with_v4_spelling(dir), kCases);
  }
}

}  // namespace

TEST(HfParityYarn, HeadDim64Factor4) {
  check_fixture("qwen3_yarn_d64");
}
TEST(HfParityYarn, HeadDim128NoTruncateExplicitAttentionFactor) {
  check_fixture("qwen3_yarn_d128_notrunc");
}
