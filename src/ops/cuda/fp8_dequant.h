// Path (c) of the block-FP8 linear (ops/fp8_linear.h): the weight dequantized to bf16 once, at load, for the
// bf16 GEMM (the portable CUDA path: sm_80, and Hopper until the W8A8 kernels land).
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// The raw form: out[n, k] (bf16, contiguous, row stride k) = bf16(f32(q[n, k]) * scale[n / 128, k / 128]) for
// q e4m3 with row stride ldq and scale f32 [ceil(n/128), ceil(k/128)] contiguous, on `stream`. GemmEngine's
// scratch path for block-FP8 weights (gemm.h) runs it before each bf16 GEMM.
void dequantize_fp8(const void* q, int64_t ldq, const float* scale, void* out, int64_t n, int64_t k,
                    cudaStream_t stream);

// A MoE layer's block-FP8 experts for the grouped GEMMs (moe.h, moe_experts_launch): for each local expert l
// of `experts`, out[l] = dequantize_fp8(q[l], scale[l]) bitwise, q e4m3 [experts, n, k] contiguous, scale f32
// [experts, n / 128, k / 128] contiguous, out bf16 [experts, n, k] contiguous (16-byte aligned); n and k
// multiples of 128. counts (i32, device, router-indexed): an expert l with counts[expert_begin + l] == 0 is
// skipped, its out left as it was (no host synchronisation: capturable); nullptr: all written.
void dequantize_fp8_experts(const void* q, const float* scale, void* out, int64_t experts, int64_t n,
                            int64_t k, const int32_t* counts, int64_t expert_begin, cudaStream_t stream);

}  // namespace kiln::cuda

namespace kiln::ops::cuda {

// out[n, k] = bf16(f32(q[n, k]) * scale[n / 128, k / 128]), bitwise the CPU oracle (one fp32 product, RNE).
//   weight: f8e4m3 [N, K], last stride 1;  scale: f32 [ceil(N/128), ceil(K/128)] contiguous;
//   out: bf16 [N, K] contiguous. All on the current device; enqueued on the current stream.
void dequantize_fp8(const Tensor& weight, const Tensor& scale, const Tensor& out);

}  // namespace kiln::ops::cuda
