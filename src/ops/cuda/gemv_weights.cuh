// The GEMV kernels' weight formats (gemv.h: "Block-FP8 weights"): how a thread streams its chunks of W and
// turns them into the products of the dot products. The FMA kernel is written once over a format WF:
//   WF::Raw         what one chunk occupies in registers between its load and its use;
//   WF::kChunkX     x's 16-byte chunks (8 bf16) one W chunk spans: 1 (8 elements a chunk) or 2 (16);
//   WF::rows<M>()   W rows an FMA block owns (gemv.h: gemv_block_rows);
//   WF::unroll<M>() chunk steps whose loads a thread issues together;
//   WF::row(...)    a W row's handle (its chunk pointer; FP8: and its row of block scales);
//   WF::load<kPinned>(row, c), WF::zero(), WF::prefetch(row, c);
//   WF::dot<M, R>(w, x, acc)  the chunk's products added into acc[m][r] (x(m, i): x row m's i-th 16-byte
//                   chunk of the W chunk), in the format's order (gemv.h);
// and, for the tensor-core kernel (kTensorCores), WF::widen(raw) -> uint4, 8 bf16 in k order.
// A chunk's elements share one 128-K block, so one scale serves the chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/vec.cuh"
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

// Chunk steps whose W loads a thread issues together in the FMA kernel (8-element chunks): more bytes in
// flight where registers allow.
template <int M>
constexpr int unroll_for() {
  return M <= 2 ? 4 : 2;
}

// The FMA kernel's arithmetic for formats whose chunk widens to 8 bf16 (WF::widen): acc[m][r] = fmaf(x, w,
// acc[m][r]) over the chunk's 8 elements in order (gemv.h: the summation order).
template <class WF, int M, int R, class X>
__device__ __forceinline__ void dot_widened(const typename WF::Raw (&w)[R], X&& x, float (&acc)[M][R]) {
  float wf[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r) unpack8(WF::widen(w[r]), wf[r]);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[8];
    unpack8(x(m, 0), xf);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[m][r] = fmaf(xf[e], wf[r][e], acc[m][r]);
  }
}

// The shape of the formats whose 8-element chunk widens to 8 bf16 (WF::widen): both kernels, 4 rows an FMA
// block, unroll_for's chunk steps.
struct WidenedChunks {
  static constexpr int kChunkX = 1;
  static constexpr bool kTensorCores = true;
  template <int M>
  static constexpr int rows() {
    return 4;
  }
  template <int M>
  static constexpr int unroll() {
    return unroll_for<M>();
  }
};

// bf16 W: a chunk is 16 bytes, used as loaded.
struct Bf16Weights : WidenedChunks {
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
  template <int M, int R, class X>
  static __device__ __forceinline__ void dot(const Raw (&w)[R], X&& x, float (&acc)[M][R]) {
    dot_widened<Bf16Weights, M, R>(w, x, acc);
  }
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

// A block-FP8 W's chunks: e4m3 [N, K] with f32 scales [ceil(N/128), ceil(K/128)] (ops/fp8_linear.h), a chunk
// being Q (uint2: 8 e4m3, uint4: 16) and its block's scale, loaded together so the scale's latency hides
// under the chunk's.
template <class Q>
struct Fp8Chunks {
  static constexpr int kPerBlock = int(128 / sizeof(Q));  // chunks a 128-K block
  struct Raw {
    Q q;
    float s;
  };
  struct Row {
    const Q* q;
    const float* s;  // the row's 128-row block of scales, kb of them
  };
  // Row n of W (w: [N, K / sizeof(Q)] chunks, row stride ldw8 * 8 / sizeof(Q) chunks; scale: [ceil(N/128),
  // kb]).
  static __device__ __forceinline__ Row row(const void* w, int64_t ldw8, const float* scale, int64_t kb,
                                            int64_t n) {
    return {static_cast<const Q*>(w) + n * (ldw8 * 8 / int64_t(sizeof(Q))), scale + (n / 128) * kb};
  }
  template <bool kPinned>
  static __device__ __forceinline__ Raw load(const Row& r, int64_t c) {
    return {load_stream<kPinned>(r.q + c), load_scale<kPinned>(r.s + c / kPerBlock)};
  }
  static __device__ __forceinline__ Raw zero() { return {Q{}, 0.0f}; }
  static __device__ __forceinline__ void prefetch(const Row& r, int64_t c) { prefetch_l2(r.q + c); }
};

// Block-FP8 W, 8 elements a chunk (8 bytes of e4m3), widened to path (c)'s bf16.
struct Fp8Weights : Fp8Chunks<uint2>, WidenedChunks {
  static __device__ __forceinline__ uint4 widen(const Raw& v) {
    return make_uint4(widen_e4m3x2(v.q.x, v.s), widen_e4m3x2(v.q.x >> 16, v.s), widen_e4m3x2(v.q.y, v.s),
                      widen_e4m3x2(v.q.y >> 16, v.s));
  }
  template <int M, int R, class X>
  static __device__ __forceinline__ void dot(const Raw (&w)[R], X&& x, float (&acc)[M][R]) {
    dot_widened<Fp8Weights, M, R>(w, x, acc);
  }
};

// Byte i (0..3) of v, an e4m3 code, as an fp32: f32(q) exactly, in integer arithmetic and one exact
// multiply (no conversion instruction). The code's bits placed into an fp32's (sign to bit 31, the 4
// exponent and 3 mantissa bits to bits 26..20) read as q * 2^-120 for every code, subnormals included (fp32's
// own subnormals: both formats' exponent fields are biased, 7 and 127); * 2^120 is exact. The NaN codes
// (0x7f, 0xff; no quantizer here writes them) read as +-480 (gemv.h: "e4m3 x 16").
// kRedo: the byte move is an asm volatile, so the compiler decodes again at each use instead of keeping
// every decoded value live (the M > 2 FMA kernel's registers).
template <int i, bool kRedo = false>
__device__ __forceinline__ float e4m3_to_f32_exact(uint32_t v) {
  // Byte i to bits 31..24 with the sign replicated into bits 31..27 by the arithmetic shift, then masked.
  uint32_t top;
  if constexpr (kRedo) {
    asm volatile("prmt.b32 %0, %1, 0, %2;" : "=r"(top) : "r"(v), "n"(0x0444 | i << 12));
  } else {
    top = __byte_perm(v, 0u, 0x0444u | uint32_t(i) << 12);
  }
  const uint32_t bits = uint32_t(int32_t(top) >> 4) & 0x87f00000u;
  return __fmul_rn(__uint_as_float(bits), 0x1p120f);
}

// Block-FP8 W read 16 elements a chunk ("e4m3 x 16", gemv.h): a chunk is 16 bytes of e4m3 (one 16-byte
// load, as a bf16 chunk) and its block's scale. The products take f32(q) exactly (e4m3_to_f32_exact); per
// x row and W row the chunk's 16 products are summed by fmaf from +0 in k order, and the block scale is
// applied to that sum: acc = fmaf(sum, s, acc). At M <= 2 an FMA block owns 8 rows so that it streams as
// many bytes as the bf16 kernel's 4, with half the chunk steps in flight (the same bytes a thread); at M > 2
// 4 rows and one chunk step.
struct Fp8x16Weights : Fp8Chunks<uint4> {
  static constexpr int kChunkX = 2;
  static constexpr bool kTensorCores = false;
  template <int M>
  static constexpr int rows() {  // M > 2: 8 rows' accumulators and weights would not fit 128 registers
    return M <= 2 ? 8 : 4;
  }
  template <int M>
  static constexpr int unroll() {
    return M <= 2 ? 2 : 1;
  }
  // 4 bytes of a chunk (word j: elements 4j .. 4j + 3) as 4 fp32.
  template <bool kRedo>
  static __device__ __forceinline__ void decode4(uint32_t v, float* f) {
    f[0] = e4m3_to_f32_exact<0, kRedo>(v);
    f[1] = e4m3_to_f32_exact<1, kRedo>(v);
    f[2] = e4m3_to_f32_exact<2, kRedo>(v);
    f[3] = e4m3_to_f32_exact<3, kRedo>(v);
  }
  // The chunk's 16 products of x row m and W row r, summed from +0 in k order, then scaled into acc.
  static __device__ __forceinline__ void chunk_sum(const float (&wf)[16], uint4 x0, uint4 x1, float s,
                                                   float& acc) {
    float xa[8], xb[8];
    unpack8(x0, xa);
    unpack8(x1, xb);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum = fmaf(xa[e], wf[e], sum);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum = fmaf(xb[e], wf[8 + e], sum);
    acc = fmaf(sum, s, acc);
  }
  template <bool kRedo = false>
  static __device__ __forceinline__ void decode16(const uint4& q, float (&wf)[16]) {
    decode4<kRedo>(q.x, wf);
    decode4<kRedo>(q.y, wf + 4);
    decode4<kRedo>(q.z, wf + 8);
    decode4<kRedo>(q.w, wf + 12);
  }
  // M <= 2: every row decoded once, then each x row's chunk read once. M > 2: the rows decoded again for
  // each x row (the R rows' 16 weights, or every x row's 16 values, would not fit the registers).
  template <int M, int R, class X>
  static __device__ __forceinline__ void dot(const Raw (&w)[R], X&& x, float (&acc)[M][R]) {
    if constexpr (M <= 2) {
      float wf[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) decode16(w[r].q, wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 x0 = x(m, 0), x1 = x(m, 1);
#pragma unroll
        for (int r = 0; r < R; ++r) chunk_sum(wf[r], x0, x1, w[r].s, acc[m][r]);
      }
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 x0 = x(m, 0), x1 = x(m, 1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wf[16];
          decode16<true>(w[r].q, wf);
          chunk_sum(wf, x0, x1, w[r].s, acc[m][r]);
        }
      }
    }
  }
};

// The lighter e4m3 x 16 form (GemvConfig::x16_rows = 4; gemv.h "e4m3 x 16"): the same chunks and the same
// arithmetic, 4 W rows a block at every M. At M <= 2 each row's chunk is decoded just before its products (at
// M = 1 a decoded row serves no other x row, so decoding row by row loses nothing), and a round is 2 chunk
// steps: 8 loads of 16 bytes a thread. Why 2: a round's loads hold 5 registers each (the chunk and its
// scale), and they, not the decoded weights, set the count: M = 1 (bf16 out; nvcc 13.0, sm_90a) compiled to
// 117 registers at 4 steps (16 loads, as the first form's 2 steps x 8 rows, 126), 90 at 3, 73 at 2; and at
// Qwen3-4B's K (2560, 4096: 160 or 256 chunks a row) a thread of 4 warps has at most 2 chunks a row, so 2
// steps already put the block's whole W slice in flight in one round. At M > 2 it is Fp8x16Weights' form (4
// rows, 1 step), whose kernels run it (fma_kernel_format). A row's sums are the first form's bit for bit: per
// chunk the 16 products from +0 in k order, then acc = fmaf(sum, s, acc), over the thread's chunks t, t + T,
// ... in order; neither the rows a block owns nor the steps a round loads enter that order (only T = 32 x
// warps does).
struct Fp8x16LightWeights : Fp8x16Weights {
  template <int M>
  static constexpr int rows() {
    return 4;
  }
  template <int M>
  static constexpr int unroll() {
    return M <= 2 ? 2 : 1;
  }
  template <int M, int R, class X>
  static __device__ __forceinline__ void dot(const Raw (&w)[R], X&& x, float (&acc)[M][R]) {
    static_assert(M <= 2, "M > 2 runs Fp8x16Weights' kernels (fma_kernel_format)");
    uint4 x0[M], x1[M];
#pragma unroll
    for (int m = 0; m < M; ++m) x0[m] = x(m, 0), x1[m] = x(m, 1);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[16];
      decode16(w[r].q, wf);
#pragma unroll
      for (int m = 0; m < M; ++m) chunk_sum(wf, x0[m], x1[m], w[r].s, acc[m][r]);
    }
  }
};

// The format whose FMA kernel runs M rows of x for format WF: WF itself, except the lighter e4m3 x 16 form
// at M > 2, which is Fp8x16Weights' form there (so its kernels are not built twice).
template <class WF, int M>
using fma_kernel_format =
    std::conditional_t<std::is_same_v<WF, Fp8x16LightWeights> && (M > 2), Fp8x16Weights, WF>;

}  // namespace kiln::cuda::gemv_detail
