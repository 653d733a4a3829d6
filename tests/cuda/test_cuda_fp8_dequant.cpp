// Path (c) of the block-FP8 linear on the GPU (ops/cuda/fp8_dequant.h): the dequantization kernel is bitwise
// the CPU oracle on every e4m3 byte, ragged shapes and strided rows; and an FP8 checkpoint loaded on CUDA
// holds exactly the oracle's dequantized bf16 weights (model/fp8_weights.h place_fp8_linear).
#include <cuda_runtime_api.h>

#include <cstring>
#include <filesystem>

#include "common/fp8_checkpoints.h"
#include "common/model_steps.h"
#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/qwen3.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

TEST(CudaFp8Dequant, MatchesCpuBitwiseOnRaggedShapes) {
  KILN_REQUIRE_GPU();
  const int64_t shapes[][2] = {{1, 1}, {128, 128}, {129, 200}, {300, 257}, {2048, 64}, {77, 1000}};
  for (const auto& sh : shapes) {
    const int64_t N = sh[0], K = sh[1], ldq = K + 3;  // a row stride past K
    const int64_t Nb = ops::fp8_blocks(N), Kb = ops::fp8_blocks(K);
    std::vector<uint8_t> q(size_t(N * ldq));
    for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t((i * 131 + 7) % 256);  // every byte, NaNs included
    std::vector<float> s(size_t(Nb * Kb));
    for (size_t i = 0; i < s.size(); ++i) s[i] = std::ldexp(1.0f + float(i % 7) / 7.0f, int(i % 11) - 8);
    const ops::LinearWeight host(Tensor::strided(q.data(), DType::f8e4m3, {N, K}, {ldq, 1}),
                                 Tensor(s.data(), DType::f32, {Nb, Kb}));
    std::vector<bf16_t> ref(size_t(N * K));
    ops::dequantize_fp8(host, Tensor(ref.data(), DType::bf16, {N, K}));
    Buffer dq = to_device(q), ds = to_device(s), out(size_t(N * K) * 2, Device::cuda());
    KILN_CUDA_CHECK(cudaMemset(out.data(), 0xff, size_t(N * K) * 2));
    const ops::LinearWeight dev(Tensor::strided(dq.data(), DType::f8e4m3, {N, K}, {ldq, 1}, Device::cuda()),
                                Tensor(ds.data(), DType::f32, {Nb, Kb}, Device::cuda()));
    ops::dequantize_fp8(dev, Tensor(out.data(), DType::bf16, {N, K}, Device::cuda()));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<bf16_t>(out, size_t(N * K));
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i].bits, ref[i].bits) << N << "x" << K << " at " << i;
  }
}

TEST(CudaFp8Dequant, PlacedWeightsAreTheOraclesDequantization) {
  KILN_REQUIRE_GPU();
  // Two parts stacked (q 100 rows, k 60 rows: on CUDA no block alignment is needed), K = 200.
  const int64_t K = 200;
  std::vector<Fp8HostPart> parts;
  std::vector<std::string> names = {"q_proj.weight", "k_proj.weight"};
  for (int64_t rows : {100, 60}) {
    const auto w = test_support::random_bf16(size_t(rows * K), uint32_t(rows), -0.3f, 0.3f);
    parts.push_back(quantize_fp8_part(w.data(), rows, K, names[parts.size()]));
  }
  std::vector<Buffer> storage;
  const ops::LinearWeight placed = place_fp8_linear(parts, names, Device::cuda(), storage);
  ASSERT_EQ(placed.weight.dtype, DType::bf16);
  const auto got = to_host<bf16_t>(storage.back(), size_t(160 * K));
  int64_t row0 = 0;
  for (const Fp8HostPart& p : parts) {
    std::vector<float> s = p.scale;
    std::vector<bf16_t> ref(size_t(p.rows * K));
    ops::dequantize_fp8({Tensor(const_cast<uint8_t*>(p.q), DType::f8e4m3, {p.rows, K}),
                         Tensor(s.data(), DType::f32, {ops::fp8_blocks(p.rows), ops::fp8_blocks(K)})},
                        Tensor(ref.data(), DType::bf16, {p.rows, K}));
    for (int64_t i = 0; i < p.rows * K; ++i)
      ASSERT_EQ(got[size_t(row0 * K + i)].bits, ref[size_t(i)].bits) << i;
    row0 += p.rows;
  }
}

// A whole FP8 model on CUDA (path (c): dequantized at load) against the CPU model running the same
// dequantized weights in bf16: the bounds of CudaModel.MatchesCpuModelOnRandomWeights (the GPU holds bitwise
// the oracle's dequantized weights, so only the bf16 GEMM and attention tolerances remain).
TEST(CudaFp8Dequant, WholeModelMatchesCpuOnTheDequantizedWeights) {
  KILN_REQUIRE_GPU();
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 1024;
  c.hidden_size = 200;  // ragged blocks
  c.intermediate_size = 512;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  const test::Fp8ModelPair m = test::load_fp8_and_dequantized(c, 13, "cuda_fp8", Device::cuda());
  Qwen3Model &cpu = *m.cpu_bf16, &gpu = *m.fp8;
  std::vector<int32_t> prompt(61);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 131 + 7) % 1024);
  test::expect_gpu_matches_cpu(cpu, gpu, prompt, 12, "fp8 checkpoint, dequantized");
}

}  // namespace
}  // namespace kiln
