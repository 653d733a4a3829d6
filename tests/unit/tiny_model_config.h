// The tiny Qwen3 shapes of the model tests: one builder, and the CPU model tests' shape (test_model,
// test_tree_attention, the runner tree tests; test_model_fp8 widens it): 2 layers, hidden 96, GQA 4 / 2 heads
// of 64, a 301-token vocabulary. The CUDA tests' shapes are in tests/cuda/tiny_qwen3_config.h.
#pragma once

#include <cstdint>

#include "kiln/config.h"

namespace kiln::test {

struct TinyQwen3Shape {
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t max_positions = 0;
  double rope_theta = 1e6;
  bool tied = true;
};

// A Qwen3ForCausalLM config of that shape (everything else ModelConfig's defaults).
inline ModelConfig tiny_qwen3(const TinyQwen3Shape& s) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.rope_theta = s.rope_theta;
  c.max_position_embeddings = s.max_positions;
  c.tie_word_embeddings = s.tied;
  return c;
}

inline ModelConfig tiny_cpu_config(bool tied = true) {
  return tiny_qwen3({.vocab = 301,
                     .hidden = 96,
                     .intermediate = 160,
                     .layers = 2,
                     .heads = 4,
                     .kv_heads = 2,
                     .head_dim = 64,
                     .max_positions = 128,
                     .rope_theta = 10000.0,
                     .tied = tied});
}

}  // namespace kiln::test
