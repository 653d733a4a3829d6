// Memory-bound kernels of the Qwen3 forward pass: embedding gather, fused residual-add + RMSNorm,
// SiLU-and-multiply, bf16 -> f32 widening, and seeded random fills for `--load-format random`.
// Raw device pointers, row-major contiguous; each launcher validates its arguments once and enqueues on
// `stream`. `pdl` launches the kernel with programmatic dependent launch (it waits for its predecessor's
// writes before reading, so it is always safe; it only helps inside a chain of PDL-aware kernels).
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// out[t, :] = table[tokens[t], :].  tokens: int32 [T] (device); table: bf16 [V, H], row stride
// table_stride; out: bf16 (out_f32 false) or f32 (the exact widening) [T, H], row stride out_stride.
// H and the strides are multiples of 8. A token outside [0, V) (the caller validates on the host)
// yields a zero row, never a fault.
void embedding_gather(const int32_t* tokens, const void* table, int64_t table_stride, void* out,
                      int64_t out_stride, bool out_f32, int64_t T, int64_t V, int64_t H, cudaStream_t stream,
                      bool pdl = false);

// RMSNorm over rows of H, optionally fused with the residual add (ops/rms_norm.h, HF Qwen3 rounding):
//   add:    r = bf16(float(residual) + float(x));  residual <- r          (rounding point 1)
//   no add: r = x;  residual unused (may be null)
//   ss  = sum of float(r)^2 in the canonical order below (fp32 fmaf)
//   inv = 1 / sqrt(ss / H + eps)  with correctly rounded fdiv/fsqrt (no rsqrtf)
//   out = bf16(float(bf16(float(r) * inv)) * float(w))                   (rounding points 2 and 3)
// Canonical order (ops::rms_sum_squares): 32 lanes; lane l owns the 8-element chunks l, l+32, l+64, ...
// and accumulates acc = fmaf(v, v, acc) through its chunks in order, 8 elements each in order; then an
// xor butterfly 16, 8, 4, 2, 1. One warp per row, so the result is bitwise the CPU oracle's.
// x, residual, out: bf16 [T, H] with row strides (elements, multiples of 8); w: bf16 [H]. H % 8 == 0.
// out must not alias x or residual when add (it may alias x without add).
void rms_norm(const void* x, int64_t x_stride, void* residual, int64_t r_stride, const void* w, void* out,
              int64_t o_stride, int64_t T, int64_t H, float eps, bool add, cudaStream_t stream,
              bool pdl = false);

// out[t, i] = bf16(float(bf16(g / (1 + expf(-g)))) * float(u)) with g = in[t, i], u = in[t, I + i]
// (gate and up halves of the fused gate_up GEMM output). in: bf16 [T, 2I], out: bf16 [T, I], row
// strides in_stride / out_stride (multiples of 8); I % 8 == 0. expf differs from a correctly rounded
// exp by <= 2 ulp in fp32, so against the CPU oracle a is within 1 bf16 ulp (nearly always bitwise).
void silu_mul(const void* in, int64_t in_stride, void* out, int64_t out_stride, int64_t T, int64_t I,
              cudaStream_t stream, bool pdl = false);

// x[r, c] = float(bf16(x[r, c])) in place, for r < rows, c < cols, row stride ld (f32 elements): the bf16
// rounding point of the LM head's logits after an fp32-output GEMM.
void round_f32_to_bf16(float* x, int64_t rows, int64_t cols, int64_t ld, cudaStream_t stream,
                       bool pdl = false);

// out[i] = float(in[i]) (exact). in: bf16 [n]; out: f32 [n].
void bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t stream);

// dst[i] = bf16(offset + scale * u) with u uniform in [-1, 1) from a counter hash of (seed, i):
// reproducible for a seed whatever the launch shape. dst: bf16 [n].
void fill_random_bf16(void* dst, int64_t n, uint64_t seed, float scale, float offset, cudaStream_t stream);

// dst[i] = bf16(center + (2u - 1) * half_width), u = (splitmix64(key + i) >> 40) / 2^24, with each
// operation rounded separately (no fma): bitwise the host's model/weights.cpp fill_random_weight for the
// same key, so a model with random weights is the same on the CPU and the GPU. dst: bf16 [n].
void fill_uniform_splitmix_bf16(void* dst, int64_t n, uint64_t key, float center, float half_width,
                                cudaStream_t stream);

}  // namespace kiln::cuda
