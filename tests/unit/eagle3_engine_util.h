// The CPU EAGLE-3 engine tests' target, draft and run helpers (test_eagle3_engine.cpp, test_eagle3_tree.cpp):
// a random Qwen3 (6 layers, hidden 64, a 256-token vocabulary) written once per process, drafts over its
// frequent tokens, mixed prompts, and an engine run that collects every request's tokens and counters.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "eagle3_test_util.h"
#include "engine_test_util.h"
#include "kiln/safetensors.h"
#include "model/weights.h"
#include "runtime/engine.h"

namespace kiln::test {

namespace fs = std::filesystem;

constexpr int64_t kHidden = 64, kVocab = 256;

inline fs::path scratch() {
  return test_support::process_scratch_dir("eagle3_engine");
}

// A random Qwen3 with 6 layers, hidden 64, a 256-token vocabulary.
inline std::string target_dir() {
  static const std::string dir = [] {
    const char* config = R"({
      "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "eos_token_id": 255, "head_dim": 16,
      "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 2048,
      "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 6, "num_key_value_heads": 2,
      "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
      "tie_word_embeddings": false, "vocab_size": 256})";
    const fs::path d = scratch() / "target";
    fs::create_directories(d);
    std::ofstream(d / "config.json") << config;
    const ModelConfig cfg = parse_model_config(config, "target config");
    write_safetensors((d / "model.safetensors").string(), random_weights(qwen3_weight_specs(cfg), 7).tensors,
                      {{"format", "pt"}});
    return d.string();
  }();
  return dir;
}

inline Eagle3Shape draft_shape(int64_t draft_vocab, bool own_embeddings) {
  return small_draft_shape(kHidden, kVocab, draft_vocab, "[1, 3, 4]", own_embeddings);
}

// Prompts of mixed lengths; prompts 4 and 5 share their first 12 tokens with prompt 0 (prefix-cache hits when
// prompt 0 ran first).
inline std::vector<std::vector<int32_t>> mixed_prompts() {
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 3 + (i * 7) % 29; ++j) p.push_back(int32_t(rng() % 250));
    out.push_back(p);
  }
  out[0].resize(20, 7);
  for (int i : {4, 5}) {
    std::vector<int32_t> p(out[0].begin(), out[0].begin() + 12);
    p.insert(p.end(), out[size_t(i)].begin(), out[size_t(i)].end());
    out[size_t(i)] = p;
  }
  return out;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<spec::SpecRequestStats> spec;
  std::vector<int> cached;
  EngineStats stats;
};

// temperature > 0: request i samples with seed 100 + i.
// edit (if set): changes request i's parameters before it is submitted.
inline Outputs run(std::unique_ptr<Engine> e, const std::vector<std::vector<int32_t>>& prompts, int n,
                   bool one_at_a_time, float temperature = 0.0f,
                   const std::function<void(size_t, Request&)>& edit = {}) {
  Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r = greedy(p, n);
    r.sampling.ignore_eos = true;  // every request decodes n tokens (DraftsAreTheReferenceChains counts them)
    if (temperature > 0.0f) {
      r.sampling.temperature = temperature;
      r.sampling.seed = int64_t(100 + ids.size());
    }
    if (edit) edit(ids.size(), r);
    ids.push_back(e->submit(r, sink.cb()));
    if (one_at_a_time) sink.wait_finished(int(ids.size()));
  }
  sink.wait_finished(int(prompts.size()));
  sink.expect_one_finish_each();
  Outputs out;
  for (RequestId id : ids) {
    out.tokens.push_back(sink.tokens(id));
    out.spec.push_back(sink.last(id).spec);
    out.cached.push_back(sink.last(id).cached_tokens);
  }
  expect_pool_clean(*e);
  out.stats = e->stats();
  return out;
}

inline EngineOptions base_opts() {
  EngineOptions o = small_opts(4096, 4, 16);
  o.model_dir = target_dir();
  o.device = "cpu";
  return o;
}

inline EngineOptions with_eagle(EngineOptions o, const fs::path& draft, int k, bool off_switch) {
  o.speculative.algorithm = spec::SpecAlgorithm::eagle3;
  o.speculative.draft_model_path = draft.string();
  o.speculative.num_draft_tokens = k;
  o.speculative.off_switch = off_switch;
  return o;
}

// A draft over the target's `n` most frequent greedy tokens: it agrees with the target often, not always.
inline fs::path draft_over_frequent_tokens(const std::vector<std::vector<int32_t>>& outputs, int n) {
  const std::vector<int64_t> ids = frequent_tokens(outputs, n);
  const fs::path dir = scratch() / ("draft_top" + std::to_string(n));
  write_eagle3_draft(dir, draft_shape(int64_t(ids.size()), false), "", ids, 11);
  return dir;
}

// The engine-wide spec counters are the sums of the requests' own.
inline void expect_request_sums(const Outputs& got, const std::string& mode) {
  int64_t drafted = 0, accepted = 0, rows = 0;
  for (const spec::SpecRequestStats& r : got.spec) {
    drafted += r.draft_tokens;
    accepted += r.accepted_tokens;
    rows += r.verify_rows;
  }
  EXPECT_EQ(drafted, got.stats.spec.draft_tokens) << mode;
  EXPECT_EQ(accepted, got.stats.spec.accepted_tokens) << mode;
  EXPECT_EQ(rows, got.stats.spec.drafts) << mode;
}

}  // namespace kiln::test
