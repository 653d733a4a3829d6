// Device helpers shared by the attention-preparation kernels (fused and unfused): act-dtype conversion
// with the contract's rounding, position and slot reads, the M-RoPE axis map and FP8 block quantisation.
// Every function here implements one numbered step of ops/attn_prep.h exactly as the CPU reference does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kiln/dtype.h"
#include "ops/cuda/attn_prep_params.h"
#include "ops/cuda/common.cuh"
#include "ops/fp8.h"

namespace kiln::cuda::attn {

template <ActKind A>
__device__ __forceinline__ float act_widen(uint16_t b) {
  if constexpr (A == ActKind::bf16) {
    return __uint_as_float(uint32_t(b) << 16);
  } else {
    return __half2float(__ushort_as_half(b));
  }
}

// act(): round to nearest even. The hardware cvt turns every NaN into 0x7fff, the contract's canonical
// NaN (tests/cuda/test_attn_prep_convert.cu checks this against the CPU's rule on every input class).
template <ActKind A>
__device__ __forceinline__ uint16_t act_round(float v) {
  if constexpr (A == ActKind::bf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
}

// Two act() roundings packed into one word (lo in bits 0..15): one cvt instruction for both.
template <ActKind A>
__device__ __forceinline__ uint32_t act_round2(float lo, float hi) {
  if constexpr (A == ActKind::bf16) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

template <ActKind A>
__device__ __forceinline__ void unpack8(const uint4& r, float (&x)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (A == ActKind::bf16) {
      x[2 * k] = __uint_as_float(w[k] << 16);
      x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
      x[2 * k] = act_widen<A>(uint16_t(w[k] & 0xffffu));
      x[2 * k + 1] = act_widen<A>(uint16_t(w[k] >> 16));
    }
  }
}

template <ActKind A>
__device__ __forceinline__ uint4 round_pack8(const float (&v)[8]) {
  return make_uint4(act_round2<A>(v[0], v[1]), act_round2<A>(v[2], v[3]), act_round2<A>(v[4], v[5]),
                    act_round2<A>(v[6], v[7]));
}

__device__ __forceinline__ uint4 pack8(const uint16_t (&b)[8]) {
  return make_uint4(uint32_t(b[0]) | uint32_t(b[1]) << 16, uint32_t(b[2]) | uint32_t(b[3]) << 16,
                    uint32_t(b[4]) | uint32_t(b[5]) << 16, uint32_t(b[6]) | uint32_t(b[7]) << 16);
}

// f32 -> E4M3 pairs by the hardware (cvt.rn.satfinite.e4m3x2.f32): RNE, saturating to +-448, +-Inf -> +-448,
// NaN -> 0x7f: exactly fp8.h's f32_to_e4m3 (checked in tests/cuda/test_attn_prep_convert.cu). lo in bits
// 0..7.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

template <bool kVec>
__device__ __forceinline__ void store8x16(uint16_t* dst, const uint4& v) {
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(dst) = v;
  } else {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    for (int k = 0; k < 4; ++k) {
      dst[2 * k] = uint16_t(w[k] & 0xffffu);
      dst[2 * k + 1] = uint16_t(w[k] >> 16);
    }
  }
}

// Position of token t on axis ax, clamped into the table (the device cannot raise; see attn_prep.h).
__device__ __forceinline__ int64_t load_position(const AttnPrepParams& p, int ax, int t) {
  const int64_t off = int64_t(ax) * p.pos_axis + int64_t(t) * p.pos_t;
  int64_t v = p.pos_i64 ? __ldg(static_cast<const long long*>(p.pos) + off)
                        : int64_t(__ldg(static_cast<const int*>(p.pos) + off));
  v = v < 0 ? 0 : v;
  return v >= p.max_pos ? p.max_pos - 1 : v;
}

// Cache slot of token t, or -1 when the token is not written (slot < 0 or outside the cache).
__device__ __forceinline__ int64_t load_slot(const AttnPrepParams& p, int t) {
  const int64_t s = __ldg(reinterpret_cast<const long long*>(p.slots) + int64_t(t) * p.slot_stride);
  return s < p.num_slots ? s : -1;
}

// Frequency i's axis (0 = t, 1 = h, 2 = w) under the M-RoPE axis map (attn_prep.h step 2).
__device__ __forceinline__ int mrope_axis(const AttnPrepParams& p, int i) {
  if (p.mrope == MRopeMode::interleaved) {
    if (i % 3 == 1 && i < 3 * p.section[1]) return 1;
    if (i % 3 == 2 && i < 3 * p.section[2]) return 2;
    return 0;
  }
  if (p.mrope == MRopeMode::sectioned) return i < p.section[0] ? 0 : i < p.section[0] + p.section[1] ? 1 : 2;
  return 0;
}

// 16-bit act value -> 16-bit cache value of the other type: widen, round once (NaN -> 0x7fff, as the CPU).
template <ActKind A>
__device__ __forceinline__ uint16_t act_to_other16(uint16_t b) {
  constexpr ActKind O = A == ActKind::bf16 ? ActKind::f16 : ActKind::bf16;
  return act_round<O>(act_widen<A>(b));
}

// FP8 quantisation of 8 values per lane; 8 consecutive lanes (xor 4, 2, 1 within `mask`) form one 64-element
// block. Returns the 8 E4M3 bytes (little-endian in a uint2) and the block's UE8M0 byte.
__device__ __forceinline__ uint2 fp8_quant8(const float (&v)[8], unsigned mask, uint8_t& scale_byte) {
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float f = fabsf(v[j]);
    a = (isfinite(f) && f > a) ? f : a;
  }
#pragma unroll
  for (int o = 4; o >= 1; o /= 2) a = fmaxf(a, __shfl_xor_sync(mask, a, o));
  const int e = e4m3_block_exponent(a);
  const float inv = exp2_neg(e);
  float s[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j] = __fmul_rn(v[j], inv);
  const uint32_t lo = e4m3x2(s[0], s[1]) | e4m3x2(s[2], s[3]) << 16;
  const uint32_t hi = e4m3x2(s[4], s[5]) | e4m3x2(s[6], s[7]) << 16;
  scale_byte = ue8m0_from_exponent(e);
  return make_uint2(lo, hi);
}

// Writes lane chunk c of one head (8 act values as bits) to the cache: `off` is the element offset of the
// chunk, `soff` the byte offset of its block's UE8M0 scale. For fp8, all lanes of each 8-lane block must
// call this together (the block max is a shuffle within `mask`). kVec: one 16-byte (8-byte for fp8)
// store, which needs aligned cache rows; else element stores.
template <ActKind A, CacheKind C, bool kVec = true>
__device__ __forceinline__ void store_cache_chunk(void* cache, uint8_t* scale, int64_t off, int64_t soff,
                                                  int c, const uint4& bits, unsigned mask) {
  if constexpr (C == CacheKind::fp8) {
    float v[8];
    unpack8<A>(bits, v);
    uint8_t sb;
    const uint2 q = fp8_quant8(v, mask, sb);
    if constexpr (kVec) {
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(cache) + off) = q;
    } else {
      for (int j = 0; j < 8; ++j)
        static_cast<uint8_t*>(cache)[off + j] = uint8_t((j < 4 ? q.x : q.y) >> (8 * (j % 4)));
    }
    if (c % 8 == 0) scale[soff] = sb;
  } else if constexpr ((C == CacheKind::bf16) == (A == ActKind::bf16)) {
    store8x16<kVec>(static_cast<uint16_t*>(cache) + off, bits);
  } else {
    uint16_t b[8];
    const uint32_t w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      b[2 * k] = act_to_other16<A>(uint16_t(w[k] & 0xffffu));
      b[2 * k + 1] = act_to_other16<A>(uint16_t(w[k] >> 16));
    }
    store8x16<kVec>(static_cast<uint16_t*>(cache) + off, pack8(b));
  }
}

}  // namespace kiln::cuda::attn
