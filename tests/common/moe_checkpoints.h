// Test checkpoints of tiny Qwen3-MoE models: a dense config.json turned into a MoE one, and a folder with
// config.json and model.safetensors written into this process's scratch.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "kiln/safetensors.h"

namespace kiln::test {

// `dense` (a Qwen3ForCausalLM config.json) as Qwen3MoeForCausalLM with these expert settings.
inline nlohmann::json moe_config_json(nlohmann::json dense, int64_t experts, int64_t top_k, int64_t width,
                                      bool norm, const nlohmann::json& only = nlohmann::json::array(),
                                      int64_t step = 1) {
  dense["architectures"] = {"Qwen3MoeForCausalLM"};
  dense["model_type"] = "qwen3_moe";
  dense["num_experts"] = experts;
  dense["num_experts_per_tok"] = top_k;
  dense["moe_intermediate_size"] = width;
  dense["norm_topk_prob"] = norm;
  dense["mlp_only_layers"] = only;
  dense["decoder_sparse_step"] = step;
  return dense;
}

// Writes config.json and the tensors into a fresh folder `name` under this process's scratch dir `tag`.
inline std::filesystem::path write_json_checkpoint(const std::string& tag, const std::string& name,
                                                   const nlohmann::json& cfg,
                                                   const std::vector<NamedTensor>& tensors) {
  const std::filesystem::path dir = test_support::process_scratch_dir(tag) / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  write_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  return dir;
}

}  // namespace kiln::test
