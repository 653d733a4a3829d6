// The tiny Qwen3 shape the CUDA-graph tests run (test_cuda_graph, test_cuda_verify_graph): 2 layers, hidden
// 256, GQA 8 / 2 heads of 64, a 512-token vocabulary, tied embeddings.
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

}  // namespace kiln::test
