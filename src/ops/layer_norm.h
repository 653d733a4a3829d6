// LayerNorm with weight and bias over the last dimension (the Qwen3-VL vision tower's norm1/norm2 and the
// patch mergers' norms; torch.nn.LayerNorm on bf16 tensors).
//
// layer_norm(x, weight, bias, eps, out), per row t of T (H values):
//   mean = sum_i x_i / H,  var = sum_i (x_i - mean)^2 / H      both in fp64, ascending i (two passes)
//   r    = float(1 / sqrt(var + eps))                           fp64, rounded once to fp32
//   y_i  = bf16(float(x_i - float(mean)) * r * w_i + b_i)      fp32 math, rounding point: the only one
//   x, out: bf16 [T, H], last stride 1 (row strides free); weight, bias: bf16 [H] contiguous; eps > 0.
//   out may alias x.
// torch computes the moments in fp32 (Welford) and rounds once at the end as well, so the difference to
// HF is the moments' rounding: tolerance 1 bf16 ulp of y (tests: |y - y_torch| <= 2^-7 |y| + 2^-9).
// CUDA: kiln::ops::cuda::layer_norm (ops/cuda/vision.cu): the same fp64 moments (another summation order),
// so at most 1 bf16 ulp from the CPU.
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out);

}  // namespace kiln::ops
