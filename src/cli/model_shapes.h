// Built-in Qwen3 model shapes for benchmarks and tuning without a checkpoint directory
// (`--shape qwen3-8b | qwen3-4b | qwen3-0.6b | qwen3-30b-a3b`): the config.json values of those models,
// random weights.
#pragma once

#include <string>

#include "kiln/config.h"
#include "kiln/error.h"

namespace kiln::cli {

inline ModelConfig builtin_qwen3_shape(const std::string& name) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 151936;
  c.head_dim = 128;
  c.num_kv_heads = 8;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  c.tie_word_embeddings = true;
  if (name == "qwen3-8b") {  // Qwen3-8B: the only one of the three with an untied LM head
    c.hidden_size = 4096, c.intermediate_size = 12288, c.num_layers = 36, c.num_heads = 32;
    c.tie_word_embeddings = false;
  } else if (name == "qwen3-4b") {
    c.hidden_size = 2560, c.intermediate_size = 9728, c.num_layers = 36, c.num_heads = 32;
  } else if (name == "qwen3-0.6b") {
    c.hidden_size = 1024, c.intermediate_size = 3072, c.num_layers = 28, c.num_heads = 16;
  } else if (name == "qwen3-30b-a3b") {  // Qwen3-30B-A3B: every layer sparse, 128 experts, top-8
    c.architecture = "Qwen3MoeForCausalLM";
    c.arch = ModelArch::qwen3_moe;
    c.hidden_size = 2048, c.intermediate_size = 6144, c.num_layers = 48, c.num_heads = 32;
    c.num_kv_heads = 4;
    c.tie_word_embeddings = false;
    c.moe.num_experts = 128, c.moe.num_experts_per_tok = 8, c.moe.moe_intermediate_size = 768;
    c.moe.norm_topk_prob = true;
  } else {
    KILN_FAIL("--shape: expected qwen3-8b, qwen3-4b, qwen3-0.6b or qwen3-30b-a3b, got '", name, "'");
  }
  return c;
}

}  // namespace kiln::cli
