// Path (c) of the block-FP8 linear (ops/fp8_linear.h): the weight dequantized to bf16 once, at load, for the
// bf16 GEMM (the portable CUDA path: sm_80, and Hopper until the W8A8 kernels land).
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops::cuda {

// out[n, k] = bf16(f32(q[n, k]) * scale[n / 128, k / 128]), bitwise the CPU oracle (one fp32 product, RNE).
//   weight: f8e4m3 [N, K], last stride 1;  scale: f32 [ceil(N/128), ceil(K/128)] contiguous;
//   out: bf16 [N, K] contiguous. All on the current device; enqueued on the current stream.
void dequantize_fp8(const Tensor& weight, const Tensor& scale, const Tensor& out);

}  // namespace kiln::ops::cuda
