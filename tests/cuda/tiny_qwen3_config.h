// The tiny Qwen3 shapes of the CUDA tests: the CUDA-graph tests' (test_cuda_graph, test_cuda_verify_graph: 2
// layers, hidden 256, GQA 8 / 2 heads of 64, a 512-token vocabulary, tied embeddings) and the whole-model
// ones'.
#pragma once

#include "kiln/config.h"

namespace kiln::test {

inline ModelConfig tiny_graph_config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 384;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  return c;
}

// The shape test_cuda_model and test_cuda_tree_attention run the whole model at: 3 layers, hidden 256, GQA
// 8 / 2 heads of 128, a 1024-token vocabulary, tied embeddings.
inline ModelConfig tiny_model_config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 1024;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  return c;
}

}  // namespace kiln::test
