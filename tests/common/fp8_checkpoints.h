// Test checkpoints of one model twice: its decoder linears block-FP8 (Qwen's -FP8 layout) and the same
// values dequantized to bf16 (path (c), ops/fp8_linear.h), so a run on the FP8 checkpoint can be held
// against a BF16 run of exactly the weights it decodes to.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/weights.h"
#include "ops/fp8_linear.h"

namespace kiln::test {

// Every "model.layers.*_proj.weight" (attention, dense MLP and MoE expert projections; not the router).
inline bool is_decoder_linear(const std::string& n) {
  return n.rfind("model.layers.", 0) == 0 && n.size() > 12 &&
         n.compare(n.size() - 12, 12, "_proj.weight") == 0;
}

// Writes cfg's seeded random weights as dir/fp8/model.safetensors (decoder linears block-FP8, F32 scales) and
// dir/deq/model.safetensors (those linears dequantized).
inline void write_fp8_and_dequantized(const ModelConfig& cfg, uint64_t seed,
                                      const std::filesystem::path& dir) {
  const RandomWeights w = random_weights(qwen3_weight_specs(cfg), seed);
  Fp8CheckpointStorage storage;
  const std::vector<NamedTensor> fp8 =
      quantize_checkpoint_linears(w.tensors, is_decoder_linear, false, storage);
  std::vector<NamedTensor> deq;
  std::vector<std::vector<bf16_t>> deq_data;
  deq_data.reserve(fp8.size());
  for (size_t i = 0; i < fp8.size(); ++i) {
    const NamedTensor& t = fp8[i];
    if (t.name.find("weight_scale_inv") != std::string::npos) continue;
    if (t.tensor.dtype != DType::f8e4m3) {
      deq.push_back(t);
      continue;
    }
    const int64_t N = t.tensor.shape[0], K = t.tensor.shape[1];
    std::vector<bf16_t>& d = deq_data.emplace_back(size_t(N * K));
    ops::dequantize_fp8({t.tensor, fp8[i + 1].tensor}, Tensor(d.data(), DType::bf16, {N, K}));
    deq.push_back({t.name, Tensor(d.data(), DType::bf16, {N, K})});
  }
  std::filesystem::create_directories(dir / "fp8");
  std::filesystem::create_directories(dir / "deq");
  write_safetensors((dir / "fp8" / "model.safetensors").string(), fp8);
  write_safetensors((dir / "deq" / "model.safetensors").string(), deq);
}

}  // namespace kiln::test
