// Test checkpoints of one model twice: its decoder linears block-FP8 (Qwen's -FP8 layout) and the same
// values dequantized to bf16 (path (c), ops/fp8_linear.h), so a run on the FP8 checkpoint can be held
// against a BF16 run of exactly the weights it decodes to.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/moe_checkpoints.h"
#include "common/test_support.h"
#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/qwen3.h"
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

// The two checkpoints of write_fp8_and_dequantized(cfg, seed, dir) loaded: the dequantized one on the CPU
// (bf16), the FP8 one on `fp8_device`.
struct Fp8ModelPair {
  Checkpoint fp8_ckpt, deq_ckpt;
  std::unique_ptr<Qwen3Model> cpu_bf16, fp8;
};
inline Fp8ModelPair load_fp8_and_dequantized(const ModelConfig& cfg, uint64_t seed, const std::string& tag,
                                             Device fp8_device) {
  const std::filesystem::path dir = test_support::process_scratch_dir(tag);
  write_fp8_and_dequantized(cfg, seed, dir);
  Fp8ModelPair m{Checkpoint::open((dir / "fp8").string()), Checkpoint::open((dir / "deq").string()), {}, {}};
  ModelConfig c8 = cfg;
  c8.quant.method = "fp8";
  LoadOptions o;
  m.cpu_bf16 = Qwen3Model::create(cfg, &m.deq_ckpt, o);
  o.device = fp8_device;
  m.fp8 = Qwen3Model::create(c8, &m.fp8_ckpt, o);
  return m;
}

// A Qwen3-MoE checkpoint whose experts alone are block-FP8 (Qwen's -FP8 layout; attention and the dense MLP
// bf16, so their head_dim-64 slices never cut an FP8 block): hidden 128, moe_intermediate_size 256 (two
// 128-row blocks: a split over 2 ranks falls on the grid, over 4 it would not), 4 experts top-2, layer 0
// dense, vocab 301. Written as folder "ckpt" under this process's scratch dir `tag`.
inline std::filesystem::path write_fp8_expert_moe_checkpoint(const std::string& tag) {
  const nlohmann::json dense = nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 301, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "max_position_embeddings": 256, "tie_word_embeddings": false, "dtype": "bfloat16",
    "eos_token_id": 300})");
  nlohmann::json cfg = moe_config_json(dense, 4, 2, 256, true, nlohmann::json{0});
  cfg["quantization_config"] = nlohmann::json::parse(fp8_quantization_config_json());
  const RandomWeights w =
      random_weights(qwen3_weight_specs(parse_model_config(cfg.dump(), "test config")), 31);
  Fp8CheckpointStorage q;
  const auto is_expert = [](const std::string& n) {
    return n.find(".mlp.experts.") != std::string::npos && is_decoder_linear(n);
  };
  return write_json_checkpoint(tag, "ckpt", cfg, quantize_checkpoint_linears(w.tensors, is_expert, false, q));
}

}  // namespace kiln::test
