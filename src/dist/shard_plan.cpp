#include "dist/shard_plan.h"

#include <algorithm>
#include <cstring>

#include "kiln/error.h"

namespace kiln::dist {

ShardPlan make_shard_plan(const ModelConfig& c, int tp, int rank, bool expert_parallel) {
  KILN_CHECK(tp >= 1, "--tp must be >= 1, got ", tp);
  KILN_CHECK(rank >= 0 && rank < tp, "tensor-parallel rank ", rank, " out of range (tp ", tp, ")");
  KILN_CHECK(c.num_heads % tp == 0, "num_attention_heads (", c.num_heads, ") must be divisible by --tp ", tp);
  KILN_CHECK(c.intermediate_size % tp == 0, "intermediate_size (", c.intermediate_size,
             ") must be divisible by --tp ", tp);
  const int64_t hkv = c.num_kv_heads;
  KILN_CHECK(hkv >= 1 && c.num_heads % hkv == 0, "num_key_value_heads (", hkv,
             ") must divide num_attention_heads (", c.num_heads, ")");
  ShardPlan p;
  p.tp = tp;
  p.rank = rank;
  const int64_t q_per = c.num_heads / tp;
  p.q_heads = {rank * q_per, (rank + 1) * q_per};
  if (tp <= hkv) {
    KILN_CHECK(hkv % tp == 0, "num_key_value_heads (", hkv, ") must be divisible by --tp ", tp,
               " (or --tp a multiple of it)");
    const int64_t kv_per = hkv / tp;
    p.kv_heads = {rank * kv_per, (rank + 1) * kv_per};
  } else {
    KILN_CHECK(tp % hkv == 0, "--tp ", tp, " above num_key_value_heads (", hkv, ") must be a multiple of it");
    p.kv_replicas = int(tp / hkv);
    const int64_t h = rank / p.kv_replicas;
    p.kv_heads = {h, h + 1};
  }
  const int64_t i_per = c.intermediate_size / tp;
  p.intermediate = {rank * i_per, (rank + 1) * i_per};
  p.expert_parallel = expert_parallel;
  const int64_t E = c.moe.num_experts, mi = c.moe.moe_intermediate_size;
  p.experts = {0, E};
  p.moe_intermediate = {0, mi};
  if (c.has_moe_layers() && expert_parallel) {
    KILN_CHECK(E % tp == 0, "num_experts (", E, ") must be divisible by --tp ", tp,
               " for expert parallelism");
    p.experts = {rank * (E / tp), (rank + 1) * (E / tp)};
  } else if (c.has_moe_layers()) {
    KILN_CHECK(mi % tp == 0, "moe_intermediate_size (", mi, ") must be divisible by --tp ", tp,
               " (or use --enable-expert-parallel)");
    p.moe_intermediate = {rank * (mi / tp), (rank + 1) * (mi / tp)};
  }
  KILN_CHECK(!expert_parallel || c.has_moe_layers(),
             "--enable-expert-parallel needs a mixture-of-experts model (this one has no sparse MLP layers)");
  const int64_t v_per = (c.vocab_size + tp - 1) / tp;
  p.vocab_per_rank = v_per;
  p.vocab = {std::min(c.vocab_size, rank * v_per), std::min(c.vocab_size, (rank + 1) * v_per)};
  return p;
}

namespace {
void check_2d(const Tensor& src, Range r, int64_t extent, const char* what) {
  KILN_CHECK(src.ndim == 2 && src.stride[1] == 1, what, ": needs a 2-D tensor with unit inner stride");
  KILN_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= extent, what, ": range [", r.begin, ", ", r.end,
             ") outside [0, ", extent, ")");
}
}  // namespace

void copy_rows(const Tensor& src, Range r, void* dst) {
  check_2d(src, r, src.shape[0], "copy_rows");
  const size_t esz = size_t(dtype_size(src.dtype)), row = size_t(src.shape[1]) * esz;
  const auto* base = static_cast<const unsigned char*>(src.data);
  for (int64_t i = r.begin; i < r.end; ++i)
    std::memcpy(static_cast<unsigned char*>(dst) + size_t(i - r.begin) * row,
                base + size_t(i) * size_t(src.stride[0]) * esz, row);
}

void copy_cols(const Tensor& src, Range r, void* dst) {
  check_2d(src, r, src.shape[1], "copy_cols");
  const size_t esz = size_t(dtype_size(src.dtype)), n = size_t(r.size()) * esz;
  const auto* base = static_cast<const unsigned char*>(src.data);
  for (int64_t i = 0; i < src.shape[0]; ++i)
    std::memcpy(static_cast<unsigned char*>(dst) + size_t(i) * n,
                base + (size_t(i) * size_t(src.stride[0]) + size_t(r.begin)) * esz, n);
}

}  // namespace kiln::dist
