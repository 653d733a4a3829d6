// The CPU fixtures of the runner-level EAGLE tree-drafting tests (test_runner_move_kv.cpp,
// test_runner_tree_ops.cpp): a tiny Qwen3 (3 layers, vocabulary 301, width 96), its random EAGLE-3 draft,
// runners holding either, context slots, tokens, bit comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "eagle3_test_util.h"
#include "kiln/error.h"
#include "model/eagle3_model.h"
#include "model/qwen3.h"
#include "runtime/qwen3_runner.h"
#include "tiny_model_config.h"

namespace kiln::tree_ops {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 301, kHidden = 96, kDraftVocab = 40;

inline fs::path scratch() {
  return test_support::process_scratch_dir("runner_tree_ops");
}

// head_dim 64: an fp8 cache works too.
inline ModelConfig tiny_config() {  // test_model's shape, 3 layers, this vocabulary and width
  ModelConfig c = test::tiny_cpu_config(true);
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.num_layers = 3;
  return c;
}

inline std::unique_ptr<Qwen3Model> tiny_model() {
  LoadOptions o;
  o.seed = 7;
  return Qwen3Model::create(tiny_config(), nullptr, o);
}

// A random draft for the tiny target, written once per process (draft_vocab 40 here; d2t: id -> 2 id + 1).
inline std::string draft_dir(int64_t draft_vocab = kDraftVocab) {
  const fs::path d = scratch() / ("draft_" + std::to_string(draft_vocab));
  if (!fs::exists(d / "model.safetensors")) {
    test::write_eagle3_draft(d, test::small_draft_shape(kHidden, kVocab, draft_vocab, "[0, 1, 2]", true));
  }
  return d.string();
}

inline std::unique_ptr<Qwen3Runner> make_runner(DType kv, ops::KvLayout layout, bool draft,
                                                int32_t pages = 64, int32_t page_size = 1) {
  auto model = tiny_model();
  std::unique_ptr<Eagle3Model> d = draft ? Eagle3Model::load(draft_dir(), *model) : nullptr;
  auto r = std::make_unique<Qwen3Runner>(std::move(model), layout, kv);
  if (d) r->set_draft(std::move(d));
  r->allocate_kv(pages, page_size);
  return r;
}

using test::seq_step;

// Positions 0 .. n - 1 in place: position p at slot 1 + p (slot 0 is the pool's null page, which FakeRunner
// refuses to read).
inline std::vector<int64_t> plain_ctx(int64_t n) {
  return test::consecutive_slots(n, 1);
}

inline std::vector<int32_t> some_tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((seed * 37 + i * 101 + 5) % kVocab));
  return t;
}

using test_support::error_of;

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kiln::tree_ops
