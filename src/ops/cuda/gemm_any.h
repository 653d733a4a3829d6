// A GEMM for any shape, stride and alignment: GemmEngine::run's fallback where cuBLASLt's bf16 kernels cannot
// take the operands (K or an input row stride not a multiple of 8, an input not 16-byte aligned).
//
// Contract: out[M, N] = x[M, K] · W[N, K]^T; x, W bf16 row-major with row strides ldx >= K, ldw >= K (any
// value, any alignment); out bf16 (rounded once, to nearest even) or f32 (unrounded), row stride ldo >= N.
// Products of bf16 values are exact in fp32; the sum is accumulated in fp32 in ascending k. Tolerance against
// an fp64 reference: gemm.h's (relative Frobenius error <= 2^-8 for bf16 output, <= 1e-5 for f32).
// Correct first: one smem-tiled FMA kernel, no tensor cores; no Qwen3 checkpoint has such a shape (their
// hidden and intermediate sizes are multiples of 8), so speed is not its job.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;  // the same declaration as CUDA's driver_types.h

namespace kiln::cuda {

void gemm_any(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
              int64_t n, int64_t k, bool out_f32, cudaStream_t stream, bool pdl);

}  // namespace kiln::cuda
