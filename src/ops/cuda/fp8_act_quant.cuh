// The activation quantizer's arithmetic (ops/fp8_linear.h: quantize_act_fp8), shared by the W8A8 GEMM's
// quantizer kernel (fp8_gemm.cu) and the W8A8 GEMV, which quantizes x inside each block (gemv_w8a8.h): one
// definition, so both are bitwise the CPU oracle by the same argument.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace kiln::cuda {

// One lane's 8 bf16 of a 128-column group, the group held by a half-warp (16 lanes x 8 consecutive columns,
// lanes 0-15 or 16-31): the group's amax by an xor butterfly 8, 4, 2, 1 (fmaxf: exact in any order, NaN
// ignored like std::fmax), a_s = max(amax, 1e-10) / 448 and the 8 codes e4m3_rn_sat(x / a_s), with correctly
// rounded divisions (__fdiv_rn) and the hardware's cvt.rn.satfinite.e4m3x2.f32 (exactly ops/fp8.h's encoder,
// NaN -> 0x7f included). Lanes past K pass zeros: they do not move the amax. Every lane of the warp calls it
// (the butterfly is warp-wide).
struct ActQuant8 {
  uint2 codes;  // the 8 e4m3 codes, column order, first in the low byte
  float scale;  // a_s of the lane's group
};
__device__ __forceinline__ ActQuant8 quantize_act8(uint4 raw) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  float v[8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int off = 8; off >= 1; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float s = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
  uint32_t pairs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    pairs[i] = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v[2 * i], s), __fdiv_rn(v[2 * i + 1], s)),
                                        __NV_SATFINITE, __NV_E4M3);
  return {make_uint2(pairs[0] | pairs[1] << 16, pairs[2] | pairs[3] << 16), s};
}

}  // namespace kiln::cuda
