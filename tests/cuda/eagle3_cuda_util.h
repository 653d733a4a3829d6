// Shared by the EAGLE-3 CUDA tests (test_cuda_eagle3, test_cuda_eagle3_engine): the tiny 6-layer target (the
// draft reads its layers 1, 3 and 4), the draft's shape, a per-process scratch folder, bitwise comparison.
#pragma once

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../unit/eagle3_test_util.h"
#include "common/scoped_env.h"
#include "common/test_support.h"
#include "kiln/config.h"
#include "model/qwen3.h"
#include "tiny_qwen3_config.h"

namespace kiln::test {

inline ModelConfig eagle3_target_config() {
  ModelConfig c = tiny_graph_config();
  c.num_layers = 6;  // the draft reads layers 1, 3 and 4
  c.max_position_embeddings = 512;
  c.eos_token_ids = {511};
  return c;
}

inline std::unique_ptr<Qwen3Model> eagle3_target(Device d) {
  LoadOptions o;
  o.device = d;
  o.seed = 9;
  return Qwen3Model::create(eagle3_target_config(), nullptr, o);
}

inline Eagle3Shape eagle3_draft_shape(int64_t draft_vocab, bool own_embeddings) {
  Eagle3Shape s;
  s.hidden = 256;
  s.target_hidden = 256;
  s.intermediate = 384;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 512;
  s.draft_vocab = draft_vocab;
  s.aux_layers = "[1, 3, 4]";
  s.own_embeddings = own_embeddings;
  s.scale = 0.1f;
  return s;
}

inline std::filesystem::path eagle3_scratch() {
  return test_support::process_scratch_dir("cuda_eagle3");
}

// The runner's switches (KILN_EAGLE3_CUDA, KILN_EAGLE3_DRAFT_GRAPHS) are read when a draft is set and graphs
// prepared: set them for a scope.
using test_support::ScopedEnv;

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

}  // namespace kiln::test
