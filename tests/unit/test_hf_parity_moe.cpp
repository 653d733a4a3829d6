// Qwen3-MoE against Hugging Face transformers: tests/fixtures/make_hf_moe_fixture.py (run on the device
// machine) saved tiny Qwen3MoeForCausalLM checkpoints in the hub layout (norm_topk_prob on and off,
// mlp_only_layers, decoder_sparse_step 2, GQA 4:1 / 2:1 / 3:1, tied and untied heads; plus the first one in
// transformers 5's fused expert layout when its save_pretrained can write it) with transformers' greedy paths
// and per-step log-probs in bf16 and fp32 (hf_reference.json). Checked: `kiln generate --json --device cpu`
// on each, greedy tokens and log-probs within common/hf_parity.h's bound, which is derived from transformers'
// own bf16-vs-fp32 drift on the case (routing flips included).
// Until the fixtures are generated and committed, each test SKIPS and says how to make them.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/hf_parity.h"
#include "kiln/config.h"

namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf";
constexpr size_t kCases = 3;  // prompts of 1, 9 and 40 tokens

#define SKIP_WITHOUT_MOE_FIXTURE(dir)                                            \
  if (!fs::exists((dir) / "hf_reference.json"))                                  \
  GTEST_SKIP() << "fixture " << (dir).string()                                   \
               << " is absent: generate it on the device machine with `python3 " \
                  "tests/fixtures/make_hf_moe_fixture.py --out tests/fixtures/hf` and commit it"

void check_fixture(const std::string& name, bool norm_topk_prob) {
  const fs::path dir = kFixtures / name;
  SKIP_WITHOUT_MOE_FIXTURE(dir);
  const kiln::ModelConfig cfg = kiln::load_model_config(dir.string());
  ASSERT_EQ(cfg.arch, kiln::ModelArch::qwen3_moe);
  EXPECT_EQ(cfg.moe.norm_topk_prob, norm_topk_prob);
  const nlohmann::json ref = kiln::test_support::load_hf_reference(dir);
  std::vector<int64_t> sparse;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    if (cfg.is_moe_layer(l)) sparse.push_back(l);
  EXPECT_EQ(sparse, ref["moe"]["sparse_layers"].get<std::vector<int64_t>>())
      << "kiln's sparse layers differ from transformers' modules";
  kiln::test_support::check_hf_fixture_cli(dir, kCases);
}

}  // namespace

TEST(HfParityMoe, NormTopkGqa4Tied) {
  check_fixture("qwen3_moe_norm_gqa4_tied", true);
}
TEST(HfParityMoe, NoNormMlpOnlyLayerGqa2Untied) {
  check_fixture("qwen3_moe_nonorm_gqa2_untied", false);
}
TEST(HfParityMoe, SparseStep2Gqa3Untied) {
  check_fixture("qwen3_moe_step2_gqa3_untied", true);
}
TEST(HfParityMoe, FusedExpertLayout) {
  check_fixture("qwen3_moe_norm_gqa4_tied_fused", true);
}
