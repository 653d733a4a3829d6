// A block-FP8 checkpoint against its references (tests/fixtures/make_hf_fp8_fixture.py wrote
// tests/fixtures/hf/qwen3_fp8_tiny on the device machine; docs/NUMERICS.md "Block-FP8 linear layers"):
//   - kiln generate --device cpu (the W8A8 oracle) against the torch emulation of the W8A8 rounding points in
//     a bf16 transformers model: greedy path and per-step log-probs within 0.05 + 1.5 x transformers' own
//     bf16-vs-fp32 drift of that model (tests/common/hf_parity.h);
//   - the same run against the dequantized weights in an fp32 transformers model, within 0.05 + 1.5 x the
//     emulation's own distance to it (stored by the generator);
//   - --quantization fp8 of the fixture's bf16 source reproduces the checkpoint's e4m3 bytes and scales.
// Until the fixture is generated these tests skip and say how to make it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/hf_parity.h"
#include "common/kiln_process.h"
#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "model/qwen3.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf/qwen3_fp8_tiny";

bool fixture_missing() {
  return !fs::exists(kFixture / "hf_reference.json");
}
#define SKIP_WITHOUT_FIXTURE()                                                \
  if (fixture_missing())                                                      \
  GTEST_SKIP() << kFixture.string()                                           \
               << " is not generated yet: on the device machine run python3 " \
                  "tests/fixtures/make_hf_fp8_fixture.py --out tests/fixtures/hf"

}  // namespace

TEST(HfParityFp8, W8A8MatchesTheTransformersEmulation) {
  SKIP_WITHOUT_FIXTURE();
  kiln::test_support::check_hf_fixture_cli(kFixture, 3);
}

TEST(HfParityFp8, NearTheDequantizedWeightsInFp32) {
  SKIP_WITHOUT_FIXTURE();
  const json ref = kiln::test_support::load_hf_reference(kFixture);
  const fs::path scratch = fs::temp_directory_path() / ("kiln_hf_fp8_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  for (const json& c : ref["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int>>();
    const auto want = c["greedy_ids"].get<std::vector<int>>();
    const auto deq = c["dequant_fp32"]["logprobs_on_w8a8_path"].get<std::vector<double>>();
    const double bound = 0.05 + 1.5 * c["dequant_fp32"]["max_abs_diff"].get<double>();
    std::string ids;
    for (size_t i = 0; i < prompt.size(); ++i) ids += (i ? "," : "") + std::to_string(prompt[i]);
    const auto r = kiln::test_support::run_kiln(
        {"generate", "--model", kFixture.string(), "--prompt-ids", ids, "--max-tokens",
         std::to_string(want.size()), "--json", "--device", "cpu"},
        scratch);
    ASSERT_EQ(r.code, 0) << r.err;
    const json got = json::parse(r.out);
    const auto got_ids = got["ids"].get<std::vector<int>>();
    const auto got_lp = got["logprobs"].get<std::vector<double>>();
    for (size_t i = 0; i < got_ids.size() && i < want.size() && got_ids[i] == want[i]; ++i)
      EXPECT_LE(std::fabs(got_lp[i] - deq[i]), bound)
          << "step " << i << " of a " << prompt.size() << "-token prompt";
  }
  fs::remove_all(scratch);
}

TEST(HfParityFp8, OnlineQuantizationReproducesTheCheckpoint) {
  SKIP_WITHOUT_FIXTURE();
  kiln::LoadOptions o;
  auto fp8 = kiln::Qwen3Model::load(kFixture.string(), o);
  o.quantization = "fp8";
  auto online = kiln::Qwen3Model::load((kFixture / "bf16_source").string(), o);
  const auto& a = fp8->weights().layers;
  const auto& b = online->weights().layers;
  ASSERT_EQ(a.size(), b.size());
  for (size_t l = 0; l < a.size(); ++l) {
    const kiln::ops::LinearWeight* pa[] = {&a[l].qkv, &a[l].o_proj, &a[l].gate_up, &a[l].down};
    const kiln::ops::LinearWeight* pb[] = {&b[l].qkv, &b[l].o_proj, &b[l].gate_up, &b[l].down};
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(pa[i]->is_fp8() && pb[i]->is_fp8());
      ASSERT_EQ(pa[i]->weight.nbytes(), pb[i]->weight.nbytes());
      EXPECT_EQ(std::memcmp(pa[i]->weight.data, pb[i]->weight.data, size_t(pa[i]->weight.nbytes())), 0)
          << "layer " << l << " projection " << i << ": e4m3 bytes differ";
      EXPECT_EQ(std::memcmp(pa[i]->scale.data, pb[i]->scale.data, size_t(pa[i]->scale.nbytes())), 0)
          << "layer " << l << " projection " << i << ": scales differ";
    }
  }
}
