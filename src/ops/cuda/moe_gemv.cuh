// Device helpers of the MoE gather GEMVs (moe_gather_gemv.cu, moe_down_combine.cu): the fp32 dot of 8
// lanes' elements and the widening of 8 block-FP8 weights to the bf16 GEMV's operands.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/vec.cuh"
#include "ops/fp8.h"

namespace kiln::cuda {

__device__ __forceinline__ float dot8(const float (&a)[8], const float (&b)[8], float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(a[i], b[i], acc);
  return acc;
}

// Eight e4m3 weights (8 bytes, k order from the low byte) of one 128-K block times its scale s, as the
// bf16 GEMV's fp32 operands: bf16(f32(q) * s) each, path (c)'s value (ops/fp8_linear.h), so the FP8 GEMV
// is the bf16 one on dequantize_fp8's weights bitwise. e4m3 -> f16 (cvt, sm_89+) and f16 -> f32 are exact;
// older targets decode in integer arithmetic (ops/fp8.h): the same values.
__device__ __forceinline__ void widen8_e4m3(uint2 v, float s, float (&f)[8]) {
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const uint32_t word = h < 2 ? v.x : v.y, pair = (word >> (16 * (h % 2))) & 0xffffu;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(pair)));
    const float lo = __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
    const float hi = __half2float(__ushort_as_half(uint16_t(h2 >> 16)));
#else
    const float lo = ::kiln::e4m3_to_f32(uint8_t(pair & 0xffu)), hi = ::kiln::e4m3_to_f32(uint8_t(pair >> 8));
#endif
    f[2 * h] = round_bf16(__fmul_rn(lo, s));
    f[2 * h + 1] = round_bf16(__fmul_rn(hi, s));
  }
}

// One lane's 8 weights of a row as loaded (16 bytes of bf16, or 8 bytes of e4m3 and the block's scale),
// so a kernel can issue the loads of several chunks before it widens the first.
template <bool kFp8>
struct MoeWeightChunk {
  uint4 v;
};
template <>
struct MoeWeightChunk<true> {
  uint2 v;
  float s;
};

// Weight row `row` (of the whole [E * N_w, K] stack), elements kk .. kk + 7, loaded.
template <bool kFp8>
__device__ __forceinline__ MoeWeightChunk<kFp8> moe_load_weight_chunk(const MoeProductParams& p, int64_t row,
                                                                      int kk) {
  if constexpr (kFp8) {
    return {__ldg(reinterpret_cast<const uint2*>(p.w8 + row * p.K + kk)),
            __ldg(p.ws + (row / 128) * p.skb + kk / 128)};
  } else {
    return {__ldg(reinterpret_cast<const uint4*>(p.w + row * p.K + kk))};
  }
}

// A loaded chunk as fp32 GEMV operands: the bf16 values, or the e4m3 bytes widened with their block's scale.
template <bool kFp8>
__device__ __forceinline__ void moe_widen_weight_chunk(const MoeWeightChunk<kFp8>& c, float (&f)[8]) {
  if constexpr (kFp8) {
    widen8_e4m3(c.v, c.s, f);
  } else {
    unpack8(c.v, f);
  }
}

}  // namespace kiln::cuda
