// The CPU reference ops (the oracle). Called only through the dispatchers in src/ops/*.cpp, which
// validate shapes, dtypes and devices first; see each op's header for its contract.
#pragma once

#include <functional>

#include "kiln/tensor.h"
#include "ops/attention.h"

namespace kiln::ops::cpu {

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out);
void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out);
void topk_rows(const Tensor& logits, const Tensor& offsets, int k, const Tensor& tokens,
               const Tensor& logprobs);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out);
void linear(const Tensor& x, const Tensor& weight, const Tensor& out);
void linear_f32(const Tensor& x, const Tensor& weight, const Tensor& out);
void lm_head(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& logits);
// linear / lm_head run an AVX2 build of their kernel where the CPU has AVX2, else the x86-64 baseline
// build; both give bitwise equal results. Tests force the baseline to check that.
bool linear_uses_avx2();
void linear_force_baseline(bool on);
void silu_and_mul(const Tensor& gate_up, const Tensor& out);
void paged_attention(const PagedAttentionArgs& args);
void linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
// Vision tower ops (ops/layer_norm.h, activation.h, rows.h, vision_attention.h).
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out);
void gelu(const Tensor& x, const Tensor& out, bool tanh_approx);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scatter_rows(const Tensor& dst, const Tensor& rows, const Tensor& src, bool accumulate);
void rope_2d(const Tensor& qkv, const Tensor& pos, const Tensor& table, int num_heads);
void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      const Tensor& out, float scale, const std::function<bool()>& stop = {});
// ops/vision_pos_embed.h.
// side: the table's grid side (table rows = side * side).
void pos_embed_interpolate(const Tensor& table, const Tensor& lin, int64_t side, int64_t grid_t,
                           int64_t grid_h, int64_t grid_w, int64_t merge, const Tensor& out);
void cast_to_bf16(const Tensor& in, const Tensor& out);

}  // namespace kiln::ops::cpu
