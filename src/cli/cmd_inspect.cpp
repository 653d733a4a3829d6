// kiln inspect --model DIR [--json]: the parsed config.json and every tensor (dtype, shape, file) of a
// checkpoint, without loading the model. Exercises io end to end: a bad checkpoint is one clear error.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/config.h"
#include "kiln/safetensors.h"

namespace {

const char* arch_name(const kiln::ModelConfig& c) {
  switch (c.arch) {
    case kiln::ModelArch::qwen3:
      return "qwen3";
    case kiln::ModelArch::qwen3_vl_text:  // Qwen3-VL-MoE: the VL layout with sparse layers ("moe" below)
      return c.moe.num_experts > 0 ? "qwen3_vl_moe_text" : "qwen3_vl_text";
    case kiln::ModelArch::qwen3_embedding:
      return "qwen3_embedding";
    case kiln::ModelArch::qwen3_moe:
      return "qwen3_moe";
  }
  return "?";
}

nlohmann::json vision_json(const kiln::ModelConfig& c) {
  if (!c.has_vision) return nullptr;
  const kiln::VisionConfig& v = c.vision;
  return {{"depth", v.depth},
          {"hidden_size", v.hidden_size},
          {"hidden_act", v.hidden_act},
          {"intermediate_size", v.intermediate_size},
          {"num_heads", v.num_heads},
          {"patch_size", v.patch_size},
          {"temporal_patch_size", v.temporal_patch_size},
          {"spatial_merge_size", v.spatial_merge_size},
          {"out_hidden_size", v.out_hidden_size},
          {"num_position_embeddings", v.num_position_embeddings},
          {"deepstack_visual_indexes", v.deepstack_visual_indexes},
          {"image_token_id", v.image_token_id},
          {"vision_start_token_id", v.vision_start_token_id},
          {"vision_end_token_id", v.vision_end_token_id}};
}

// Qwen3-MoE: the experts and which layers are sparse.
nlohmann::json moe_json(const kiln::ModelConfig& c) {
  if (c.moe.num_experts == 0) return nullptr;
  std::vector<int64_t> sparse;
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l)) sparse.push_back(l);
  const kiln::MoeConfig& m = c.moe;
  return {{"num_experts", m.num_experts},
          {"num_experts_per_tok", m.num_experts_per_tok},
          {"moe_intermediate_size", m.moe_intermediate_size},
          {"norm_topk_prob", m.norm_topk_prob},
          {"decoder_sparse_step", m.decoder_sparse_step},
          {"mlp_only_layers", m.mlp_only_layers},
          {"sparse_layers", sparse}};
}

nlohmann::json config_json(const kiln::ModelConfig& c) {
  return {{"arch", arch_name(c)},
          {"vision", vision_json(c)},
          {"moe", moe_json(c)},
          {"architecture", c.architecture},
          {"weight_prefix", c.weight_prefix},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_layers", c.num_layers},
          {"num_heads", c.num_heads},
          {"num_kv_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"rotary_dim", c.rotary_dim()},
          {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta},
          {"rope_type", c.rope_type},
          {"partial_rotary_factor", c.partial_rotary_factor},
          {"mrope_section", c.mrope_section},
          {"mrope_interleaved", c.mrope_interleaved},
          {"rope_scaling_factor", c.rope_scaling.factor},
          {"rope_attention_factor", c.rope_scaling.attention_factor},
          {"max_position_embeddings", c.max_position_embeddings},
          {"max_context", c.max_context()},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"dtype", std::string(kiln::dtype_name(c.dtype))},
          {"eos_token_ids", c.eos_token_ids},
          {"bos_token_id", c.bos_token_id},
          {"quantization", c.quant.describe()}};
}

int run_inspect(const kiln::cli::Args& args) {
  const kiln::cli::Flags flags(args, {"model"}, {"json"});
  KILN_CHECK(flags.positional().empty(), "unexpected argument '", flags.positional()[0], "'");
  const std::string dir = flags.required("model");
  kiln::ModelConfig cfg = kiln::load_model_config(dir);
  const kiln::Checkpoint ck = kiln::Checkpoint::open(dir);
  const std::vector<std::string> names = ck.names();
  kiln::adapt_weight_prefix(cfg, names);

  uint64_t total = 0;
  int64_t fp8_linears = 0;  // F8_E4M3 tensors: the block-FP8 linears (each with its weight_scale_inv)
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& n : names) {
    const kiln::TensorEntry& e = ck.entry(n);
    total += e.end - e.begin;
    fp8_linears += e.dtype == kiln::DType::f8e4m3;
    tensors.push_back({{"name", n},
                       {"dtype", kiln::safetensors_dtype_name(e.dtype)},
                       {"shape", e.shape},
                       {"bytes", e.end - e.begin},
                       {"file", std::filesystem::path(ck.files()[size_t(e.file)]).filename().string()}});
  }
  if (flags.flag("json")) {
    const nlohmann::json out{{"model", dir},
                             {"config", config_json(cfg)},
                             {"files", ck.files()},
                             {"metadata", ck.metadata()},
                             {"fp8_linears", fp8_linears},
                             {"tensor_bytes", total},
                             {"tensors", tensors}};
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  const auto cj = config_json(cfg);
  std::printf("model %s\nconfig:\n", dir.c_str());
  for (const auto& [k, v] : cj.items()) std::printf("  %-24s %s\n", k.c_str(), v.dump().c_str());
  std::printf("files: %zu, tensors: %zu, %.3f MB\n", ck.files().size(), names.size(), double(total) / 1e6);
  if (cfg.quant.fp8())
    std::printf("quantization: %s; %lld linears stored F8_E4M3 with weight_scale_inv\n",
                cfg.quant.describe().c_str(), static_cast<long long>(fp8_linears));
  for (const auto& t : tensors) {
    std::printf("  %-56s %-8s %-18s %s\n", t["name"].get<std::string>().c_str(),
                t["dtype"].get<std::string>().c_str(), t["shape"].dump().c_str(),
                t["file"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace

KILN_COMMAND("inspect", "print a checkpoint's parsed config.json and its tensors (dtype, shape, file)",
             run_inspect);
