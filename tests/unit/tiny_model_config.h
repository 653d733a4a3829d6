// The tiny Qwen3 shape the CPU model tests run (test_model, test_tree_attention, test_runner_tree_ops;
// test_model_fp8 widens it): 2 layers, hidden 96, GQA 4 / 2 heads of 64, a 301-token vocabulary.
#pragma once

#include "kiln/config.h"

namespace kiln::test {

inline ModelConfig tiny_cpu_config(bool tied = true) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 301;
  c.hidden_size = 96;
  c.intermediate_size = 160;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  return c;
}

}  // namespace kiln::test
