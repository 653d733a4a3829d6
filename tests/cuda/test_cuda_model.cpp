// Whole-model parity on the GPU: Qwen3Model with --device cuda against the same model on the CPU
// (random weights; prefill + decode steps, fp8 and bf16 caches) and against Hugging Face transformers on the
// tiny fixtures in tests/fixtures/hf (greedy tokens equal, log-prob drift bounded as in the CPU test).
#include <filesystem>

#include "common/model_steps.h"
#include "model/qwen3.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"

namespace kiln {
namespace {

ModelConfig tiny_config() {
  return test::tiny_model_config();
}

TEST(CudaModel, RandomWeightsOnTheGpuEqualTheHostFill) {
  KILN_REQUIRE_GPU();
  for (const WeightSpec& spec : {WeightSpec{"model.layers.3.mlp.down_proj.weight", {64, 1000}, false},
                                 WeightSpec{"model.norm.weight", {1024}, true}}) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<bf16_t> host(static_cast<size_t>(n));
    fill_random_weight(spec, 5, host.data());
    Buffer dev(size_t(n) * 2, Device::cuda());
    fill_random_weight_cuda(spec, 5, dev.data());
    const auto got = test::to_host<bf16_t>(dev, size_t(n));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, host[i].bits) << spec.name << " " << i;
  }
}

TEST(CudaModel, MatchesCpuModelOnRandomWeights) {
  KILN_REQUIRE_GPU();
  LoadOptions o;
  o.seed = 11;
  auto cpu = Qwen3Model::create(tiny_config(), nullptr, o);
  o.device = Device::cuda();
  auto gpu = Qwen3Model::create(tiny_config(), nullptr, o);
  std::vector<int32_t> prompt(77);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 131 + 7) % 1024);
  test::expect_gpu_matches_cpu(*cpu, *gpu, prompt, 12, "random weights");
}

// Issue 41 point 7: a generation model whose vocabulary is not a multiple of 8 (151,669, Qwen3-Embedding-
// 0.6B's, as an LM) loads, tunes and runs on the GPU: its LM head GEMM writes logits rows of 151,669 f32.
TEST(CudaModel, OddVocabularyLmMatchesCpuModel) {
  KILN_REQUIRE_GPU();
  for (const bool tied : {true, false}) {
    ModelConfig c = tiny_config();
    c.vocab_size = 151669;
    c.tie_word_embeddings = tied;
    LoadOptions o;
    o.seed = 12;
    auto cpu = Qwen3Model::create(c, nullptr, o);
    o.device = Device::cuda();
    auto gpu = Qwen3Model::create(c, nullptr, o);
    std::vector<int32_t> prompt(33);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 4099 + 151668) % 151669);
    test::expect_gpu_matches_cpu(*cpu, *gpu, prompt, 8, tied ? "vocab 151669, tied" : "vocab 151669, untied");
  }
}

void check_fixture(const std::string& name) {
  test::check_hf_fixture_model(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/" + name, Device::cuda());
}

TEST(CudaModelHf, Gqa4HeadDim64Tied) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_gqa4_d64_tied");
}
TEST(CudaModelHf, Gqa2HeadDim128Untied) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_gqa2_d128_untied");
}
TEST(CudaModelHf, Gqa3HeadDim32Tied) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_gqa3_d32_tied");
}
// YaRN (tests/fixtures/make_hf_yarn_fixture.py): the scaled rotary table through the fused prep kernel.
void check_yarn_fixture(const std::string& name) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/" + name;
  if (!std::filesystem::exists(dir + "/hf_reference.json"))
    GTEST_SKIP() << "fixture " << dir
                 << " is absent: generate it on the device machine with `python3 "
                    "tests/fixtures/make_hf_yarn_fixture.py --out tests/fixtures/hf` and commit it";
  test::check_hf_fixture_model(dir, Device::cuda());
}
TEST(CudaModelHf, YarnHeadDim64Factor4) {
  KILN_REQUIRE_GPU();
  check_yarn_fixture("qwen3_yarn_d64");
}
TEST(CudaModelHf, YarnHeadDim128NoTruncate) {
  KILN_REQUIRE_GPU();
  check_yarn_fixture("qwen3_yarn_d128_notrunc");
}

}  // namespace
}  // namespace kiln
