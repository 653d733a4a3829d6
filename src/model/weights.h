// Qwen3 weights on one device: loaded from a Hugging Face checkpoint (bf16 or block-FP8) or generated from a
// seed. At load, q/k/v are concatenated into one [Hq*D + 2*Hkv*D, hidden] matrix and gate/up into one
// [2*I, hidden] matrix (gate rows first), so each sublayer runs one GEMM. The four projections are
// ops::LinearWeight: bf16, or block-FP8 (e4m3 + 128x128 scales) where the checkpoint stores them so or
// --quantization fp8 asks for it (model/fp8_weights.h; the CUDA backend holds them dequantized to bf16).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"
#include "ops/moe.h"
#include "ops/fp8_linear.h"

namespace kiln {

struct LayerWeights {
  Tensor input_norm;          // bf16 [hidden]
  ops::LinearWeight qkv;      // [Hq*D + 2*Hkv*D, hidden]: q rows, then k, then v
  Tensor q_norm;              // bf16 [D]
  Tensor k_norm;              // bf16 [D]
  ops::LinearWeight o_proj;   // [hidden, Hq*D]
  Tensor post_norm;           // bf16 [hidden]
  ops::LinearWeight gate_up;  // [2*I, hidden]: gate rows, then up
  ops::LinearWeight down;     // [hidden, I]
  // Qwen3-MoE sparse layers (config.is_moe_layer; model/qwen3_moe.h): the router and experts, in place of
  // gate_up / down (left empty); moe.present() is false on dense layers.
  ops::MoeWeights moe;
};

struct Qwen3Weights {
  std::vector<Buffer> storage;  // owns every tensor below
  Tensor embed;                 // bf16 [vocab, hidden]
  Tensor lm_head;               // bf16 [vocab, hidden]; the embedding table when tied; empty for an
                                // embedding model (ModelArch::qwen3_embedding), which runs none
  Tensor final_norm;            // bf16 [hidden]
  std::vector<LayerWeights> layers;
};

// One checkpoint tensor: its Hugging Face name, shape and whether it is a norm weight (ones-like).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool norm = false;
};
// Every tensor a Qwen3 checkpoint of this config holds (lm_head.weight only when untied and not a
// Qwen3-Embedding model), in a fixed order.
std::vector<WeightSpec> qwen3_weight_specs(const ModelConfig& cfg);

// Deterministic random values for one tensor, independent per (seed, name) and of the thread count:
// matrices uniform with std 0.02 (|x| <= 0.02 * sqrt(3)), norm weights 1 + uniform in [-0.1, 0.1].
// out has numel(spec.shape) elements.
void fill_random_weight(const WeightSpec& spec, uint64_t seed, bf16_t* out);
// Elements [offset, offset + n) of fill_random_weight's values (a tensor-parallel rank's slice).
void fill_random_weight_range(const WeightSpec& spec, uint64_t seed, int64_t offset, int64_t n, bf16_t* out);
// fill_random_weight for every spec, in host memory, as NamedTensors the safetensors writer takes (named
// spec.name, row-major with spec.shape); `data` owns the values the tensors view.
struct RandomWeights {
  std::vector<std::vector<bf16_t>> data;
  std::vector<NamedTensor> tensors;
};
RandomWeights random_weights(const std::vector<WeightSpec>& specs, uint64_t seed);
// The same values written straight into device memory (model/cuda_weights.cpp; CUDA builds only).
void fill_random_weight_cuda(const WeightSpec& spec, uint64_t seed, void* device_out);
// fill_random_weight_range on the GPU, enqueued on the legacy stream (not synchronized).
void fill_random_weight_range_cuda(const WeightSpec& spec, uint64_t seed, int64_t offset, int64_t n,
                                   void* device_out);
// What fill_random_weight draws from: element i = bf16(center + (2u - 1) * half_width),
// u = (splitmix64(key + i) >> 40) / 2^24.
struct RandomWeightParams {
  uint64_t key;
  float center, half_width;
};
RandomWeightParams random_weight_params(const WeightSpec& spec, uint64_t seed);

// Loads every tensor from `ckpt` (bf16, exact shapes, or a block-FP8 linear as model/fp8_weights.h reads
// it; anything else is a kiln::Error naming the tensor), or generates them with fill_random_weight when ckpt
// is null, and places them on `device`. cfg.quant.fp8() quantizes bf16 linears at load (also random ones),
// except those modules_to_not_convert lists.
Qwen3Weights load_qwen3_weights(const ModelConfig& cfg, const Checkpoint* ckpt, uint64_t seed, Device device);

}  // namespace kiln
