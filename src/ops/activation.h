// SiLU-and-multiply (the SwiGLU MLP's activation), Hugging Face rounding.
//
// silu_and_mul(gate_up, out): for each row m and i in [0, I):
//   g = gate_up[m, i], u = gate_up[m, I + i]        (gate half first, then up; one [M, 2I] GEMM output)
//   a = bf16(g / (1 + exp(-g)))                     fp32 math, rounding point 1 (HF: act_fn on bf16)
//   out[m, i] = bf16(a * u)                         rounding point 2 (a bf16 product)
//   gate_up: bf16 [M, 2I], last stride 1; out: bf16 [M, I], last stride 1; no aliasing.
// exp is the libm/CUDA expf (not bitwise across backends: tolerance 1 bf16 ulp on a).
// CUDA: the dispatcher's CUDA branch is to call kiln::ops::cuda::silu_and_mul(gate_up, out).
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

void silu_and_mul(const Tensor& gate_up, const Tensor& out);

}  // namespace kiln::ops
