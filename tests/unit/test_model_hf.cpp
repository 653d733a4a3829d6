// Qwen3Model (CPU) against Hugging Face transformers (bf16, eager) on the tiny fixtures in
// tests/fixtures/hf: the greedy continuation must match token for token, and each step's log-softmax
// row must stay within the bounds of tests/common/model_steps.h (teacher-forced on HF's greedy path).
#include <gtest/gtest.h>

#include <string>

#include "common/model_steps.h"

namespace {

void check_fixture(const std::string& name) {
  kiln::test::check_hf_fixture_model(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/" + name,
                                     kiln::Device::cpu());
}

}  // namespace

TEST(Qwen3ModelHf, Gqa4HeadDim64Tied) {
  check_fixture("qwen3_gqa4_d64_tied");
}
TEST(Qwen3ModelHf, Gqa2HeadDim128Untied) {
  check_fixture("qwen3_gqa2_d128_untied");
}
TEST(Qwen3ModelHf, Gqa3HeadDim32Tied) {
  check_fixture("qwen3_gqa3_d32_tied");
}
