// The `kiln` binary against Hugging Face transformers on a Qwen3-VL checkpoint, text-only prompts, through
// the CLI only: tests/fixtures/hf/qwen3_vl_tiny (tests/fixtures/make_hf_vl_fixture.py: a tiny
// Qwen3VLForConditionalGeneration, interleaved M-RoPE 12/10/10, a vision tower kiln must ignore) must give
// HF's greedy continuation and log-probs, with the bounds of the Qwen3 fixtures (tests/common/hf_parity.h).
// The fixture is generated on the device machine, where transformers is, and committed.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/hf_parity.h"
#include "common/kiln_process.h"

namespace fs = std::filesystem;
using kiln::test_support::kiln_bin;
using nlohmann::json;

namespace {

const fs::path kFixture = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf/qwen3_vl_tiny";

TEST(HfParityVl, FixtureIsReadAsQwen3VlText) {
  ASSERT_TRUE(fs::exists(kiln_bin())) << kiln_bin() << " does not exist: build the `kiln` target first";
  const fs::path scratch = fs::temp_directory_path() / ("kiln_hf_parity_vl_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  const auto r = kiln::test_support::run_kiln({"inspect", "--model", kFixture.string(), "--json"}, scratch);
  fs::remove_all(scratch);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  // The VL path, not plain Qwen3: otherwise the parity below would not test M-RoPE.
  EXPECT_EQ(j["config"]["arch"], "qwen3_vl_text");
  EXPECT_EQ(j["config"]["weight_prefix"], "model.language_model.");
  EXPECT_EQ(j["config"]["mrope_section"], json({12, 10, 10}));
  EXPECT_EQ(j["config"]["mrope_interleaved"], true);
  bool visual = false;
  for (const json& t : j["tensors"])
    visual = visual || t["name"].get<std::string>().rfind("model.visual.", 0) == 0;
  EXPECT_TRUE(visual) << "the fixture should carry a vision tower for kiln to ignore";
}

TEST(HfParityVl, TextPathMatchesTransformers) {
  kiln::test_support::check_hf_fixture_cli(kFixture, 3);
}

}  // namespace
