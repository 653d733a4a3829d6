// The tiny Qwen3 shapes of the CUDA tests: the CUDA-graph tests' (test_cuda_graph, test_cuda_verify_graph: 2
// layers, hidden 256, GQA 8 / 2 heads of 64, a 512-token vocabulary, tied embeddings) and the whole-model
// ones'.
#pragma once

#include "../unit/tiny_model_config.h"
#include "kiln/config.h"

namespace kiln::test {

inline ModelConfig tiny_graph_config() {
  return tiny_qwen3({.vocab = 512,
                     .hidden = 256,
                     .intermediate = 384,
                     .layers = 2,
                     .heads = 8,
                     .kv_heads = 2,
                     .head_dim = 64,
                     .max_positions = 256});
}

// The shape test_cuda_model and test_cuda_tree_attention run the whole model at: 3 layers, hidden 256, GQA
// 8 / 2 heads of 128, a 1024-token vocabulary, tied embeddings.
inline ModelConfig tiny_model_config() {
  return tiny_qwen3({.vocab = 1024,
                     .hidden = 256,
                     .intermediate = 512,
                     .layers = 3,
                     .heads = 8,
                     .kv_heads = 2,
                     .head_dim = 128,
                     .max_positions = 512});
}

}  // namespace kiln::test
