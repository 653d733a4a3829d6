// `kiln demo-model --arch moe`: the demo decoder as a Qwen3-MoE checkpoint (Qwen3MoeForCausalLM), saved the
// way the hub ships Qwen3-30B-A3B: per-expert tensor names, sharded safetensors with an index.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/safetensors.h"

namespace kiln::cli {

// The demo's config.json turned into a Qwen3-MoE one: 8 experts, top-2 renormalized (norm_topk_prob, as
// Qwen3-30B-A3B), moe_intermediate_size 128, layer 0 dense (mlp_only_layers [0]) and the others sparse.
nlohmann::json demo_moe_config(const nlohmann::json& dense);

// Writes the tensors as `shards` files model-0000i-of-0000n.safetensors (whole tensors, in order, about
// equal bytes each) and model.safetensors.index.json (metadata.total_size, weight_map).
void write_sharded_safetensors(const std::filesystem::path& dir, const std::vector<NamedTensor>& tensors,
                               int shards);

}  // namespace kiln::cli
