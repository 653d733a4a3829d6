// RMSNorm over the hidden size, and the fused residual-add + RMSNorm (Hugging Face Qwen3 rounding).
//
// rms_norm(x, weight, eps, out), per row t of T:
//   s   = sum_i x[i]^2 in fp32, in the canonical order below
//   r   = 1 / sqrt(s / H + eps)      fp32; the division, the sqrt and the reciprocal each correctly
//                                    rounded (CUDA: __fdiv_rn, __fsqrt_rn, __frcp_rn / __fdiv_rn(1, .))
//   n_i = bf16(x_i * r)              rounding point 1 (HF: hidden_states.to(input_dtype))
//   y_i = bf16(n_i * w_i)            rounding point 2 (HF: weight * hidden_states, a bf16 product)
//   x, out: bf16 [T, H] (last stride 1, row strides free); weight: bf16 [H] contiguous; eps > 0, rounded
//   to fp32 as HF does (variance + eps in fp32). out may alias x.
// Canonical order of s (so a warp-per-row kernel with 16-byte loads can match bit for bit; for H <= 256
// it is the per-head order of attn_prep.h): 32 lane partials, lane l owns the 8-element chunks
// c = l, l + 32, l + 64, ... (elements 8c .. 8c + 7), p_l = fma(x_i, x_i, p_l) over its elements in
// ascending i (fp32 fma, p_l starts at +0); then an xor butterfly over offsets 16, 8, 4, 2, 1:
// p_l = p_l + p_(l ^ o); s = p_0.
//
// add_rms_norm(x, residual, weight, eps, out): the fused form used between sublayers.
//   residual_i = bf16(residual_i + x_i)   (HF: residual + hidden_states, a bf16 add; written back)
//   out        = rms_norm(residual)        as above
//   x, residual, out: bf16 [T, H]; out must not alias x or residual.
//
// CUDA: the dispatcher's CUDA branches are to call kiln::ops::cuda::rms_norm(x, weight, eps, out) and
// kiln::ops::cuda::add_rms_norm(x, residual, weight, eps, out).
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out);

// The canonical fp32 sum of squares above, for n contiguous values already widened to fp32.
float rms_sum_squares(const float* x, int64_t n);

}  // namespace kiln::ops
