// The GEMV kernels' weight formats (gemv.h: "Block-FP8 weights"): how a thread streams its chunks of W, 8
// elements at a time, and widens them to the 8 bf16 the dot products take. The kernels are written once over
// a format WF:
//   WF::Raw         what one chunk occupies in registers between its load and its use;
//   WF::row(...)    a W row's handle (its chunk pointer; FP8: and its row of block scales);
//   WF::load<kPinned>(row, c), WF::zero(), WF::prefetch(row, c);
//   WF::widen(raw)  -> uint4, 8 bf16 in k order: the bf16 chunk itself, or bf16(f32(q) * s) per element.
// A chunk's 8 elements share one 128-K block, so one scale serves the chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/fp8.h"

namespace kiln::cuda::gemv_detail {

// W is streamed once: read-only loads that skip L1 (x keeps it) with a 256-byte L2 prefetch hint.
// kPinned: kept in program order among the asm volatile (the PDL wait), so the round issued before the wait
// cannot sink below it.
template <bool kPinned = false>
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  if constexpr (kPinned) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  }
  return v;
}

template <bool kPinned = false>
__device__ __forceinline__ uint2 load_stream(const uint2* p) {
  uint2 v;
  if constexpr (kPinned) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  }
  return v;
}

// A block scale: read through L1 (a 128-K block's scale serves 16 chunks of the row, and a 128-row block's
// scale row serves 128 rows).
template <bool kPinned = false>
__device__ __forceinline__ float load_scale(const float* p) {
  float v;
  if constexpr (kPinned) {
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  } else {
    asm("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  }
  return v;
}

// An L2 prefetch is safe before the PDL wait even for data the previous kernel writes: the L2 is the point
// of coherence, so a later write there is what the loads after the wait see.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// bf16 W: a chunk is 16 bytes, used as loaded.
struct Bf16Weights {
  using Raw = uint4;
  struct Row {
    const uint4* p;
  };
  // Row n of W (w: [N, K/8] chunks, row stride ldw8); the scale arguments are unused.
  static __device__ __forceinline__ Row row(const void* w, int64_t ldw8, const float*, int64_t, int64_t n) {
    return {static_cast<const uint4*>(w) + n * ldw8};
  }
  template <bool kPinned>
  static __device__ __forceinline__ Raw load(const Row& r, int64_t c) {
    return load_stream<kPinned>(r.p + c);
  }
  static __device__ __forceinline__ Raw zero() { return make_uint4(0, 0, 0, 0); }
  static __device__ __forceinline__ void prefetch(const Row& r, int64_t c) { prefetch_l2(r.p + c); }
  static __device__ __forceinline__ uint4 widen(const Raw& v) { return v; }
};

// Two e4m3 (the low 16 bits of v, element 0 in the low byte) times the block scale s, as two bf16 in one
// word (element 0 in the low half): bf16(f32(q) * s) each, path (c)'s value (ops/fp8_linear.h). e4m3 ->
// f16 (cvt, sm_89+) and f16 -> f32 are exact, the product is one fp32 multiply, the rounding RNE. Older
// targets decode the bytes in integer arithmetic (ops/fp8.h, the oracle's decoder): the same values.
__device__ __forceinline__ uint32_t widen_e4m3x2(uint32_t v, float s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(v & 0xffffu)));
  const float lo = __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
  const float hi = __half2float(__ushort_as_half(uint16_t(h2 >> 16)));
#else
  const float lo = ::kiln::e4m3_to_f32(uint8_t(v & 0xffu)),
              hi = ::kiln::e4m3_to_f32(uint8_t((v >> 8) & 0xffu));
#endif
  const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(lo, s), __fmul_rn(hi, s));
  return uint32_t(__bfloat16_as_ushort(b.x)) | (uint32_t(__bfloat16_as_ushort(b.y)) << 16);
}

// Block-FP8 W: e4m3 [N, K] with f32 scales [ceil(N/128), ceil(K/128)] (ops/fp8_linear.h). A chunk is 8
// bytes of e4m3 and its block's scale, loaded together so the scale's latency hides under the chunk's.
struct Fp8Weights {
  struct Raw {
    uint2 q;
    float s;
  };
  struct Row {
    const uint2* q;
    const float* s;  // the row's 128-row block of scales, kb of them
  };
  // Row n of W (w: [N, K/8] chunks of 8 bytes, row stride ldw8; scale: [ceil(N/128), kb]).
  static __device__ __forceinline__ Row row(const void* w, int64_t ldw8, const float* scale, int64_t kb,
                                            int64_t n) {
    return {static_cast<const uint2*>(w) + n * ldw8, scale + (n / 128) * kb};
  }
  template <bool kPinned>
  static __device__ __forceinline__ Raw load(const Row& r, int64_t c) {
    return {load_stream<kPinned>(r.q + c), load_scale<kPinned>(r.s + c / 16)};  // 16 chunks a 128-K block
  }
  static __device__ __forceinline__ Raw zero() { return {make_uint2(0, 0), 0.0f}; }
  static __device__ __forceinline__ void prefetch(const Row& r, int64_t c) { prefetch_l2(r.q + c); }
  static __device__ __forceinline__ uint4 widen(const Raw& v) {
    return make_uint4(widen_e4m3x2(v.q.x, v.s), widen_e4m3x2(v.q.x >> 16, v.s), widen_e4m3x2(v.q.y, v.s),
                      widen_e4m3x2(v.q.y >> 16, v.s));
  }
};

}  // namespace kiln::cuda::gemv_detail
