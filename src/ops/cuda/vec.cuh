// 16-byte bf16 vectors for the memory-bound kernels: 8 bf16 in one uint4, widened to 8 floats.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}

__device__ __forceinline__ uint32_t f32_to_bf16_bits(float f) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
}

// v: 8 bf16 in a uint4 -> f[0..7].
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// f[0..7] -> 8 bf16 (round to nearest even) in a uint4.
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = f32_to_bf16_bits(f[2 * i]) | (f32_to_bf16_bits(f[2 * i + 1]) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Rounds to bf16 and back: the value a bf16 rounding point leaves.
__device__ __forceinline__ float round_bf16(float f) {
  return __bfloat162float(__float2bfloat16_rn(f));
}

// SiLU-and-mul of one element (ops/activation.h's rounding points): silu(g) = g / (1 + e^-g) correctly
// divided, rounded to bf16, times u; g and u are bf16 values. The silu_mul kernel and the GEMV's fused
// epilogue both call this, so fused and unfused results are bitwise equal.
__device__ __forceinline__ float silu_mul_f32(float g, float u) {
  return round_bf16(__fdiv_rn(g, 1.0f + expf(-g))) * u;
}

}  // namespace kiln::cuda
