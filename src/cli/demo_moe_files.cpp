#include "cli/demo_moe_files.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "kiln/error.h"

namespace kiln::cli {

nlohmann::json demo_moe_config(const nlohmann::json& dense) {
  nlohmann::json c = dense;
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  c["model_type"] = "qwen3_moe";
  c["num_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["moe_intermediate_size"] = 128;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = {0};
  c["norm_topk_prob"] = true;
  c["router_aux_loss_coef"] = 0.001;
  c["output_router_logits"] = false;
  return c;
}

void write_sharded_safetensors(const std::filesystem::path& dir, const std::vector<NamedTensor>& tensors,
                               int shards) {
  KILN_CHECK(shards >= 1 && size_t(shards) <= tensors.size(), "cannot write ", tensors.size(), " tensors as ",
             shards, " shards");
  uint64_t total = 0;
  for (const NamedTensor& t : tensors) total += uint64_t(t.tensor.nbytes());
  nlohmann::json weight_map = nlohmann::json::object();
  size_t next = 0;
  uint64_t written = 0;
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    // Shard s takes tensors until its cumulative share of the bytes is reached, leaving one per later shard.
    const uint64_t until = total * uint64_t(s + 1) / uint64_t(shards);
    std::vector<NamedTensor> part;
    while (next < tensors.size() && tensors.size() - next > size_t(shards - s - 1) &&
           (part.empty() || s + 1 == shards || written < until)) {
      written += uint64_t(tensors[next].tensor.nbytes());
      weight_map[tensors[next].name] = name;
      part.push_back(tensors[next++]);
    }
    write_safetensors((dir / name).string(), part, {{"format", "pt"}});
  }
  const nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream f(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
  f << index.dump(2) << "\n";
  f.close();
  KILN_CHECK(f.good(), "cannot write ", (dir / "model.safetensors.index.json").string());
}

}  // namespace kiln::cli
