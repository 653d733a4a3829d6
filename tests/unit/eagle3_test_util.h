// A random EAGLE-3 draft checkpoint (LlamaForCausalLMEagle3, bf16) for tests: the CPU reference's tests
// (test_eagle3_draft), the engine's (test_eagle3_engine), the runner's (test_runner_tree_ops) and the CUDA
// draft's (tests/cuda); and one-sequence batches over given slots for the draft passes and KV moves they run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kiln/batch.h"
#include "kiln/dtype.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"
#include "ops/argmax.h"

namespace kiln::test {

// ops::topk_rows (the CPU oracle) over host rows: logits [rows, Dv], d2t [Dv]; tokens and logprobs [rows, k].
inline void host_topk(const float* logits, int64_t rows, int64_t Dv, int k, const int64_t* d2t,
                      int32_t* tokens, float* logprobs) {
  const Device cpu = Device::cpu();
  ops::topk_rows(Tensor(const_cast<float*>(logits), DType::f32, {rows, Dv}, cpu),
                 Tensor(const_cast<int64_t*>(d2t), DType::i64, {Dv}, cpu), k,
                 Tensor(tokens, DType::i32, {rows, k}, cpu), Tensor(logprobs, DType::f32, {rows, k}, cpu));
}

struct Eagle3Shape {
  int64_t hidden = 32, target_hidden = 24, intermediate = 40, heads = 4, kv_heads = 2, head_dim = 8;
  int64_t vocab = 50, draft_vocab = 20;
  std::string aux_layers = "[1, 4, 6]";  // eagle_aux_hidden_state_layer_ids; "" leaves the field out
  bool own_embeddings = true;            // embed_tokens.weight in the file (else the target's are shared)
  float scale = 0.15f;                   // standard deviation of the random weights
};

// The small draft the CPU runner and engine tests write (test_runner_tree_ops, eagle3_engine_util.h): hidden
// 64, 4 / 2 heads of 16, intermediate 96, weights of standard deviation 0.3, over a target of hidden
// `target_hidden` and `vocab` tokens, reading the target layers `aux_layers`.
inline Eagle3Shape small_draft_shape(int64_t target_hidden, int64_t vocab, int64_t draft_vocab,
                                     const std::string& aux_layers, bool own_embeddings) {
  return {.hidden = 64,
          .target_hidden = target_hidden,
          .intermediate = 96,
          .heads = 4,
          .kv_heads = 2,
          .head_dim = 16,
          .vocab = vocab,
          .draft_vocab = draft_vocab,
          .aux_layers = aux_layers,
          .own_embeddings = own_embeddings,
          .scale = 0.3f};
}

inline std::string eagle3_config_json(const Eagle3Shape& s,
                                      const std::string& arch = "LlamaForCausalLMEagle3") {
  const auto n = [](int64_t v) { return std::to_string(v); };
  std::string j = R"({"architectures": [")" + arch + R"("], "hidden_size": )" + n(s.hidden) +
                  R"(, "intermediate_size": )" + n(s.intermediate) + R"(, "num_attention_heads": )" +
                  n(s.heads) + R"(, "num_key_value_heads": )" + n(s.kv_heads) + R"(, "head_dim": )" +
                  n(s.head_dim) + R"(, "vocab_size": )" + n(s.vocab) + R"(, "draft_vocab_size": )" +
                  n(s.draft_vocab) + R"(, "target_hidden_size": )" + n(s.target_hidden) +
                  R"(, "rms_norm_eps": 1e-6, "rope_theta": 10000.0)";
  if (!s.aux_layers.empty())
    j += R"(, "eagle_config": {"eagle_aux_hidden_state_layer_ids": )" + s.aux_layers + "}";
  return j + "}";
}

// Writes config.json and model.safetensors into `dir`. skip: a tensor left out; d2t: target id of each draft
// id (empty: draft id i -> 2 i + 1); seed: the weights' generator.
inline void write_eagle3_draft(const std::filesystem::path& dir, const Eagle3Shape& s,
                               const std::string& skip = "", std::vector<int64_t> target_ids = {},
                               uint32_t seed = 5, const std::string& arch = "LlamaForCausalLMEagle3") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << eagle3_config_json(s, arch);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, s.scale);
  std::vector<std::vector<bf16_t>> keep;
  std::vector<NamedTensor> ts;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float base = 0.0f) {
    if (name == skip) return;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    keep.emplace_back(size_t(n));
    for (auto& x : keep.back()) x = f32_to_bf16(base + nd(rng));
    void* p = keep.back().data();
    ts.push_back({name, shape.size() == 1 ? Tensor(p, DType::bf16, {shape[0]}, Device::cpu())
                                          : Tensor(p, DType::bf16, {shape[0], shape[1]}, Device::cpu())});
  };
  const int64_t H = s.hidden, qd = s.heads * s.head_dim, kd = s.kv_heads * s.head_dim;
  add("fc.weight", {H, 3 * s.target_hidden});
  add("midlayer.input_layernorm.weight", {H}, 1.0f);
  add("midlayer.hidden_norm.weight", {H}, 1.0f);
  add("midlayer.self_attn.q_proj.weight", {qd, 2 * H});
  add("midlayer.self_attn.k_proj.weight", {kd, 2 * H});
  add("midlayer.self_attn.v_proj.weight", {kd, 2 * H});
  add("midlayer.self_attn.o_proj.weight", {H, qd});
  add("midlayer.post_attention_layernorm.weight", {H}, 1.0f);
  add("midlayer.mlp.gate_proj.weight", {s.intermediate, H});
  add("midlayer.mlp.up_proj.weight", {s.intermediate, H});
  add("midlayer.mlp.down_proj.weight", {H, s.intermediate});
  add("norm.weight", {H}, 1.0f);
  add("lm_head.weight", {s.draft_vocab, H});
  if (s.own_embeddings) add("embed_tokens.weight", {s.vocab, H});
  if (target_ids.empty())
    for (int64_t i = 0; i < s.draft_vocab; ++i) target_ids.push_back(2 * i + 1);
  std::vector<int64_t> d2t(size_t(s.draft_vocab));
  for (int64_t i = 0; i < s.draft_vocab; ++i) d2t[size_t(i)] = target_ids[size_t(i)] - i;
  if (skip != "d2t") ts.push_back({"d2t", Tensor(d2t.data(), DType::i64, {s.draft_vocab}, Device::cpu())});
  write_safetensors((dir / "model.safetensors").string(), ts, {{"format", "pt"}});
}

// One sequence's rows at positions begin .. begin + n - 1 with these tokens, in pages 1, 2, ... of page_size
// (page 0 is the pool's null page), logits at `logit_rows`.
inline BatchDesc one_sequence_batch(const std::vector<int32_t>& tokens, int32_t begin,
                                    std::vector<int32_t> logit_rows, int32_t page_size) {
  BatchDesc b;
  b.page_size = page_size;
  b.cu_q = {0, int32_t(tokens.size())};
  const int32_t end = begin + int32_t(tokens.size());
  for (int32_t j = 0; j < int32_t(tokens.size()); ++j) {
    const int32_t pos = begin + j;
    b.tokens.push_back(tokens[size_t(j)]);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(int64_t(1 + pos / page_size) * page_size + pos % page_size);
  }
  b.kv_lens = {end};
  b.seq_ids = {1};
  b.pages_stride = (end + page_size - 1) / page_size;
  for (int32_t p = 0; p < b.pages_stride; ++p) b.page_table.push_back(1 + p);
  b.logit_rows = std::move(logit_rows);
  return b;
}

// One sequence's step over `tokens` at positions begin .. begin + n - 1 with page size 1: position p's slot
// (and page) is ctx[p]; logits at the last row. The KV-move tests (test_runner_tree_ops,
// tests/cuda/test_cuda_kv_move) write a path at some slots with it and read it back at others.
inline BatchDesc seq_step(const std::vector<int32_t>& tokens, int32_t begin,
                          const std::vector<int64_t>& ctx) {
  BatchDesc b;
  b.page_size = 1;
  const int32_t n = int32_t(tokens.size()), end = begin + n;
  for (int32_t j = 0; j < n; ++j) {
    b.tokens.push_back(tokens[size_t(j)]);
    b.positions.push_back(begin + j);
    b.slot_mapping.push_back(ctx[size_t(begin + j)]);
  }
  b.cu_q = {0, n};
  b.kv_lens = {end};
  b.pages_stride = end;
  for (int32_t p = 0; p < end; ++p) b.page_table.push_back(int32_t(ctx[size_t(p)]));
  b.logit_rows = {n - 1};
  b.seq_ids = {1};
  return b;
}

// A seq_step context in place: position p at slot first + p.
inline std::vector<int64_t> consecutive_slots(int64_t n, int64_t first) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The n most frequent tokens of some outputs, ascending: a draft vocabulary over them agrees with the target
// often, not always (the engine tests need drafts both kept and rejected).
inline std::vector<int64_t> frequent_tokens(const std::vector<std::vector<int32_t>>& outputs, int n) {
  std::map<int32_t, int> count;
  for (const auto& t : outputs)
    for (int32_t x : t) ++count[x];
  std::vector<std::pair<int, int32_t>> by_count;
  for (auto [tok, c] : count) by_count.push_back({-c, tok});
  std::sort(by_count.begin(), by_count.end());
  std::vector<int64_t> ids;
  for (int i = 0; i < n && i < int(by_count.size()); ++i) ids.push_back(by_count[size_t(i)].second);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace kiln::test
