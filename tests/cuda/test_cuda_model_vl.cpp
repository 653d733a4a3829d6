// The Qwen3-VL text decoder on the GPU: Qwen3Model with --device cuda against the same model on the CPU (the
// oracle) with M-RoPE positions -- three equal rows as text tokens get them (BatchDesc::set_text_mrope), and
// three different rows so the interleaved and sectioned axis maps are exercised -- over a prefill and decode
// steps, bf16 and fp8 caches, with the bounds of CudaModel.MatchesCpuModelOnRandomWeights; equal rows must
// rotate exactly as plain RoPE does (bitwise on the GPU, as on the CPU); and, once
// tests/fixtures/hf/qwen3_vl_tiny exists (tests/fixtures/make_hf_vl_fixture.py), against transformers.
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/model_steps.h"
#include "kiln/config.h"
#include "model/qwen3.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::BatchEdit;
using test::model_steps;

// A Qwen3-VL config as transformers writes one, through the loader's parser: text_config with M-RoPE
// sections 24/20/20 (Qwen3-VL's, for head_dim 128), the shape of CudaModel's tiny_config.
ModelConfig vl_config(bool interleaved) {
  const nlohmann::json text = {
      {"model_type", "qwen3_vl_text"},
      {"vocab_size", 1024},
      {"hidden_size", 256},
      {"intermediate_size", 512},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 2},
      {"head_dim", 128},
      {"max_position_embeddings", 512},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 5000000.0},
      {"rope_scaling",
       {{"rope_type", "default"}, {"mrope_section", {24, 20, 20}}, {"mrope_interleaved", interleaved}}},
      {"tie_word_embeddings", true},
      {"dtype", "bfloat16"}};
  const nlohmann::json cfg = {{"architectures", {"Qwen3VLForConditionalGeneration"}},
                              {"model_type", "qwen3_vl"},
                              {"text_config", text},
                              {"tie_word_embeddings", true}};
  ModelConfig c = parse_model_config(cfg.dump(), "test Qwen3-VL config");
  EXPECT_EQ(c.arch, ModelArch::qwen3_vl_text);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{24, 20, 20}));
  return c;
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> p(77);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 131 + 7) % 1024);
  return p;
}

const BatchEdit kTextMrope = [](BatchDesc& b) { b.set_text_mrope(); };

// Three different rows (as an image block's h/w coordinates would be): t = p, h = p + p % 5, w = p + 2 (p %
// 3).
const BatchEdit kSkewedMrope = [](BatchDesc& b) {
  const size_t T = b.tokens.size();
  const std::vector<int32_t> p = b.positions;
  b.positions.resize(3 * T);
  for (size_t t = 0; t < T; ++t) {
    b.positions[T + t] = p[t] + p[t] % 5;
    b.positions[2 * T + t] = p[t] + 2 * (p[t] % 3);
  }
  b.mrope = true;
};

struct Pair {
  std::unique_ptr<Qwen3Model> cpu, gpu;
};
Pair make_pair_of_models(bool interleaved) {
  LoadOptions o;
  o.seed = 11;
  Pair p;
  p.cpu = Qwen3Model::create(vl_config(interleaved), nullptr, o);
  o.device = Device::cuda();
  p.gpu = Qwen3Model::create(vl_config(interleaved), nullptr, o);
  return p;
}

TEST(CudaModelVl, TextMropeMatchesCpu) {
  KILN_REQUIRE_GPU();
  for (bool interleaved : {true, false}) {
    Pair m = make_pair_of_models(interleaved);
    test::expect_gpu_matches_cpu(*m.cpu, *m.gpu, prompt(), 12,
                                 interleaved ? "VL text M-RoPE, interleaved" : "VL text M-RoPE, sectioned",
                                 kTextMrope);
  }
}

TEST(CudaModelVl, DistinctMropeRowsMatchCpu) {
  KILN_REQUIRE_GPU();
  for (bool interleaved : {true, false}) {
    Pair m = make_pair_of_models(interleaved);
    // The rows must matter, or this would only repeat the text test.
    const auto text = model_steps(*m.cpu, prompt(), 1, {}, DType::bf16, ops::KvLayout::nhd, 16, kTextMrope);
    const auto skew = model_steps(*m.cpu, prompt(), 1, {}, DType::bf16, ops::KvLayout::nhd, 16, kSkewedMrope);
    ASSERT_NE(std::memcmp(text[0].data(), skew[0].data(), text[0].size() * sizeof(float)), 0)
        << "different h/w rows left the logits unchanged";
    test::expect_gpu_matches_cpu(
        *m.cpu, *m.gpu, prompt(), 12,
        interleaved ? "VL skewed M-RoPE, interleaved" : "VL skewed M-RoPE, sectioned", kSkewedMrope);
  }
}

TEST(CudaModelVl, EqualRowsAreBitwisePlainRopeOnTheGpu) {
  KILN_REQUIRE_GPU();
  LoadOptions o;
  o.seed = 11;
  o.device = Device::cuda();
  auto gpu = Qwen3Model::create(vl_config(true), nullptr, o);
  model_steps(*gpu, prompt(), 2, {}, DType::bf16, ops::KvLayout::hnd, 32);  // warm-up: GEMM tactics settled
  const auto plain = model_steps(*gpu, prompt(), 6, {}, DType::bf16, ops::KvLayout::hnd, 32);
  std::vector<int32_t> forced;
  for (const auto& l : plain) forced.push_back(test::argmax(l));
  const auto vl = model_steps(*gpu, prompt(), 6, forced, DType::bf16, ops::KvLayout::hnd, 32, kTextMrope);
  for (size_t s = 0; s < plain.size(); ++s) {
    EXPECT_EQ(test::argmax(vl[s]), forced[s]) << "step " << s;
    EXPECT_EQ(std::memcmp(vl[s].data(), plain[s].data(), plain[s].size() * sizeof(float)), 0)
        << "step " << s << ": M-RoPE with three equal rows must equal plain RoPE bit for bit";
  }
}

TEST(CudaModelVl, FixtureMatchesTransformers) {
  KILN_REQUIRE_GPU();
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_vl_tiny";
  test::check_hf_fixture_model(dir, Device::cuda(), kTextMrope);
}

}  // namespace
}  // namespace kiln
