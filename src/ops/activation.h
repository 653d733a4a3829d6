// SiLU-and-multiply (the SwiGLU MLP's activation), Hugging Face rounding.
//
// silu_and_mul(gate_up, out): for each row m and i in [0, I):
//   g = gate_up[m, i], u = gate_up[m, I + i]        (gate half first, then up; one [M, 2I] GEMM output)
//   a = bf16(g / (1 + exp(-g)))                     fp32 math, rounding point 1 (HF: act_fn on bf16)
//   out[m, i] = bf16(a * u)                         rounding point 2 (a bf16 product)
//   gate_up: bf16 [M, 2I], last stride 1; out: bf16 [M, I], last stride 1; no aliasing.
// exp is the libm/CUDA expf (not bitwise across backends: tolerance 1 bf16 ulp on a).
// CUDA: the dispatcher's CUDA branch is to call kiln::ops::cuda::silu_and_mul(gate_up, out).
//
// gelu(x, out, approx): out = bf16(g(float(x))) elementwise, fp32 math, one rounding (torch's bf16 GELU):
//   GeluApprox::tanh: g(v) = 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))   (gelu_pytorch_tanh)
//   GeluApprox::none: g(v) = 0.5 v (1 + erf(v / sqrt(2)))                          (nn.GELU(), "gelu")
//   x, out: bf16 [M, N], last stride 1; out may alias x. tanh/erf are libm's: within 1 bf16 ulp of the exact
//   value, plus the fp32 cancellation in 1 + tanh / 1 + erf for negative x (|x| 2^-23), as in torch.
// CUDA: kiln::ops::cuda::gelu (ops/cuda/vision.cu): erff / tanhf, within 1 bf16 ulp of the CPU.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::ops {

void silu_and_mul(const Tensor& gate_up, const Tensor& out);

enum class GeluApprox : uint8_t { none, tanh };
void gelu(const Tensor& x, const Tensor& out, GeluApprox approx);

}  // namespace kiln::ops
