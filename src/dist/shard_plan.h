// Which slice of a Qwen3 model one tensor-parallel rank holds (issue 14), as vLLM and SGLang shard it:
//   attention: the query heads split evenly; the KV heads split evenly when tp <= num_kv_heads, else each
//   rank
//     holds one KV head, replicated over tp / num_kv_heads ranks (the one its query heads use); q/k/v_proj
//     are column-parallel (rows of the HF [out, in] weights), o_proj row-parallel (its input columns), then
//     an all-reduce;
//   MLP: gate/up column-parallel over the intermediate size, down row-parallel, then an all-reduce;
//   embedding and LM head: vocab-parallel, ceil(vocab / tp) rows per rank (the last rank may hold fewer).
//   sparse MLP (Qwen3-MoE): the router replicated (every rank routes every token alike); then either
//     tensor parallelism (the default, vLLM's and SGLang's): every expert held by every rank, its gate/up
//     rows and down columns split over moe_intermediate_size;
//     or expert parallelism (expert_parallel; vLLM's --enable-expert-parallel): whole experts, num_experts /
//     tp consecutive ones per rank.
//   Either way a rank's MoE output is a partial sum, all-reduced as the dense MLP's.
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
  Range q_heads, kv_heads;  // in heads
  int kv_replicas = 1;      // ranks holding each of this rank's KV heads
  Range intermediate;       // gate/up output rows, down input columns
  Range vocab;              // embedding / LM head rows
  Range experts;            // MoE: the experts held (all of them without expert parallelism)
  Range moe_intermediate;   // MoE: each held expert's gate/up rows, down columns (all with EP)
  bool expert_parallel = false;
  int64_t vocab_per_rank = 0;  // ceil(vocab / tp): rank r's rows start at r * vocab_per_rank
  // The HF weight slices, [out, in] row-major: q_proj rows, k_proj / v_proj rows, o_proj columns.
  Range q_rows(int64_t head_dim) const { return {q_heads.begin * head_dim, q_heads.end * head_dim}; }
  Range kv_rows(int64_t head_dim) const { return {kv_heads.begin * head_dim, kv_heads.end * head_dim}; }
};

ShardPlan make_shard_plan(const ModelConfig& c, int tp, int rank, bool expert_parallel = false);

// Copies rows [r.begin, r.end) (a column-parallel slice) or columns [r.begin, r.end) (a row-parallel slice)
// of a 2-D row-major tensor (e.g. a view into the mapped safetensors file: only the slice's bytes are read)
// into dst, contiguous. Any dtype.
void copy_rows(const Tensor& src, Range r, void* dst);
void copy_cols(const Tensor& src, Range r, void* dst);

}  // namespace kiln::dist
