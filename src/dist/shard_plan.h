// Which slice of a Qwen3 model one tensor-parallel rank holds (issue 14), as vLLM and SGLang shard it:
//   attention: the query heads split evenly; the KV heads split evenly when tp <= num_kv_heads, else each
//   rank
//     holds one KV head, replicated over tp / num_kv_heads ranks (the one its query heads use); q/k/v_proj
//     are column-parallel (rows of the HF [out, in] weights), o_proj row-parallel (its input columns), then
//     an all-reduce;
//   MLP: gate/up column-parallel over the intermediate size, down row-parallel, then an all-reduce;
//   embedding and LM head: vocab-parallel, ceil(vocab / tp) rows per rank (the last rank may hold fewer).
// Per-head norms (q_norm, k_norm) and the layer norms are replicated. A shape that does not divide is a clear
// error naming the field.
#pragma once

#include <cstdint>

#include "kiln/config.h"
#include "kiln/tensor.h"

namespace kiln::dist {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

struct ShardPlan {
  int tp = 1, rank = 0;
  Range q_heads, kv_heads;     // in heads
  int kv_replicas = 1;         // ranks holding each of this rank's KV heads
  Range intermediate;          // gate/up output rows, down input columns
  Range vocab;                 // embedding / LM head rows
  int64_t vocab_per_rank = 0;  // ceil(vocab / tp): rank r's rows start at r * vocab_per_rank
  // The HF weight slices, [out, in] row-major: q_proj rows, k_proj / v_proj rows, o_proj columns.
  Range q_rows(int64_t head_dim) const { return {q_heads.begin * head_dim, q_heads.end * head_dim}; }
  Range kv_rows(int64_t head_dim) const { return {kv_heads.begin * head_dim, kv_heads.end * head_dim}; }
};

ShardPlan make_shard_plan(const ModelConfig& c, int tp, int rank);

// Copies rows [r.begin, r.end) (a column-parallel slice) or columns [r.begin, r.end) (a row-parallel slice)
// of a 2-D row-major tensor (e.g. a view into the mapped safetensors file: only the slice's bytes are read)
// into dst, contiguous. Any dtype.
void copy_rows(const Tensor& src, Range r, void* dst);
void copy_cols(const Tensor& src, Range r, void* dst);

}  // namespace kiln::dist
