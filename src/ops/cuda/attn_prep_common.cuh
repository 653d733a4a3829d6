// Device helpers shared by the attention-preparation kernels (fused and unfused): act-dtype conversion
// with the contract's rounding, position and slot reads, the M-RoPE axis map and FP8 block quantisation.
// Every function here implements one numbered step of ops/attn_prep.h exactly as the CPU reference does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// act(): round to nearest even; NaN -> the canonical NaN (bf16 0x7fc0, f16 0x7e00).
template <ActKind A>
__device__ __forceinline__ uint16_t act_round(float v) {
  if constexpr (A == ActKind::bf16) {
    return isnan(v) ? uint16_t(0x7fc0) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return isnan(v) ? uint16_t(0x7e00) : __half_as_ushort(__float2half_rn(v));
  }
}

template <ActKind A>
__device__ __forceinline__ void unpack8(const uint4& r, float (&x)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[2 * k] = act_widen<A>(uint16_t(w[k] & 0xffffu));
    x[2 * k + 1] = act_widen<A>(uint16_t(w[k] >> 16));
  }
}

__device__ __forceinline__ uint4 pack8(const uint16_t (&b)[8]) {
  return make_uint4(uint32_t(b[0]) | uint32_t(b[1]) << 16, uint32_t(b[2]) | uint32_t(b[3]) << 16,
                    uint32_t(b[4]) | uint32_t(b[5]) << 16, uint32_t(b[6]) | uint32_t(b[7]) << 16);
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

// 16-bit act value -> 16-bit cache value of another type: widen, round once (dtype.h helpers, like the CPU).
template <ActKind A>
__device__ __forceinline__ uint16_t act_to_other16(uint16_t b) {
  const float f = act_widen<A>(b);
  if constexpr (A == ActKind::bf16) {
    return f32_to_f16(f).bits;
  } else {
    return f32_to_bf16(f).bits;
  }
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
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    lo |= uint32_t(f32_to_e4m3(__fmul_rn(v[j], inv))) << (8 * j);
    hi |= uint32_t(f32_to_e4m3(__fmul_rn(v[j + 4], inv))) << (8 * j);
  }
  scale_byte = ue8m0_from_exponent(e);
  return make_uint2(lo, hi);
}

// Writes lane chunk [8c, 8c + 8) of one head (8 act values as bits) to the cache at (slot, kv head).
// For fp8, all lanes of each 8-lane block must call this together (the block max is a shuffle).
// kVec: one 16-byte (8-byte for fp8) store, which needs aligned cache rows; else element stores.
template <ActKind A, CacheKind C, bool kVec = true>
__device__ __forceinline__ void store_cache_chunk(const AttnPrepParams& p, void* cache, uint8_t* scale,
                                                  int64_t slot, int kvh, int c, const uint4& bits,
                                                  unsigned mask) {
  const int64_t page = slot / p.page_size, row = slot - page * p.page_size;
  const int64_t off = page * p.c_page + row * p.c_row + int64_t(kvh) * p.c_head + 8 * c;
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
    if (c % 8 == 0) scale[page * p.s_page + row * p.s_row + int64_t(kvh) * p.s_head + c / 8] = sb;
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
