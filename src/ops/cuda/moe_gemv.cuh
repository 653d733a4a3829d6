// Device helpers of the MoE gather GEMVs (moe_gather_gemv.cu, moe_down_combine.cu): the fp32 dot of 8
// lanes' elements, the widening of 8 block-FP8 weights to the bf16 GEMV's operands, and the block-FP8 rows
// read in 16-element chunks for path (d) (the dense GEMV's "e4m3 x 16" helpers, gemv_weights.cuh).
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/gemv_weights.cuh"
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

// How a gather GEMV kernel reads its weights: bf16, or block-FP8 e4m3 8 bytes a lane (each 8-element chunk
// with its own scale load: the path of `2f94697`) or 16 bytes a lane (moe_fp8_rows_for_each_chunk). These
// forms give the same bits (the e4m3 forms: the bf16 kernel on dequantize_fp8's weights, path (c) of
// ops/fp8_linear.h). kMoeE4m3x16 is path (d) instead, its own bits: 16-element chunks of e4m3 decoded
// exactly, their sums scaled once a chunk (moe_x16_rows_for_each_chunk). The e4m3 form a launch takes:
// moe_fp8_e4m3x16(), else moe_fp8_wide_loads() (moe.h).
enum MoeWeightLoads : int { kMoeBf16 = 0, kMoeE4m3x8 = 1, kMoeE4m3Wide = 2, kMoeE4m3x16 = 3 };

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

// Block-FP8 weights: a warp's kW e4m3 rows read with 16-byte loads (16 elements a lane, kWin 512-element
// windows of every row in flight before the first product: 16 kW kWin bytes a lane), yet consumed in the
// bf16 GEMV's order so the result stays bitwise the bf16 GEMV on dequantize_fp8's weights: lane l takes the
// 8-element chunks l, l + 32, l + 64, ... of each row in ascending order. A 16-byte load brings a lane the
// chunks 2 l and 2 l + 1 of its window, which belong to lanes 2 l and 2 l + 1 (mod 32), so each window
// passes through the warp's shared stage (kW x 512 bytes): a 16-byte store a lane, two 8-byte reads. Each
// row's block scales arrive with one coalesced load a batch (lane j < 16: block j of the batch's 16) and
// go to the chunk's lane by a shuffle; widen8_e4m3 gives bf16(f32(q) * s).
// consume(kk, f): f[i][0 .. 8) are row i's widened weights kk .. kk + 7 (the lane's chunk), called in the
// lane's ascending chunk order for every chunk below K. Needs K % 128 == 0 (block-FP8 experts) and the rows'
// 16-byte alignment (K % 16 == 0).
template <int kW, int kWin, typename Consume>
__device__ __forceinline__ void moe_fp8_rows_for_each_chunk(const MoeProductParams& p,
                                                            const int64_t (&wrow)[kW], uint2 (*stage)[64],
                                                            int lane, Consume&& consume) {
  constexpr int kBatch = 512 * kWin;  // elements of a row a batch
  static_assert(kBatch <= 16 * 128, "a batch's scale blocks fit the lanes 0 .. 15");
  for (int b0 = 0; b0 < p.K; b0 += kBatch) {
    uint4 v[kWin][kW];
    float sc[kW];
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int blk = b0 / 128 + lane;
      sc[i] = lane < kBatch / 128 && blk < p.skb ? __ldg(p.ws + (wrow[i] / 128) * p.skb + blk) : 0.0f;
    }
#pragma unroll
    for (int w = 0; w < kWin; ++w) {
      const int e = b0 + 512 * w + 16 * lane;
#pragma unroll
      for (int i = 0; i < kW; ++i)
        v[w][i] = e < p.K ? __ldg(reinterpret_cast<const uint4*>(p.w8 + wrow[i] * p.K + e))
                          : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int w = 0; w < kWin; ++w) {
      if (b0 + 512 * w >= p.K) break;  // the same for the whole warp
      __syncwarp();                    // the previous window's reads are done
#pragma unroll
      for (int i = 0; i < kW; ++i) reinterpret_cast<uint4*>(stage[i])[lane] = v[w][i];
      __syncwarp();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kk = b0 + 512 * w + 256 * h + 8 * lane;
        float f[kW][8];
#pragma unroll
        for (int i = 0; i < kW; ++i) {
          const float s = __shfl_sync(0xffffffffu, sc[i], 4 * w + 2 * h + lane / 16);
          widen8_e4m3(stage[i][32 * h + lane], s, f[i]);
        }
        if (kk < p.K) consume(kk, f);
      }
    }
  }
}

// Path (d) of ops/fp8_linear.h ("e4m3 x 16", the dense GEMV's format: gemv.h, gemv_weights.cuh): a warp's kW
// block-FP8 rows in 16-element chunks, lane l taking the chunks l, l + 32, l + 64, ... of each row in
// ascending order, with one 16-byte load of e4m3 and its block's scale a chunk (Fp8Chunks<uint4>: streamed
// past L1, the scale through it). The loads of kDepth chunks a row are issued before the first of them is
// consumed. consume(kk, w): w[i] is row i's chunk of elements kk .. kk + 15 as loaded, called for every
// chunk of the lane below K in ascending order (lanes past the last chunk idle; nothing warp-collective
// happens in between). Needs K % 16 == 0 and 16-byte aligned rows.
template <int kW, int kDepth, typename Consume>
__device__ __forceinline__ void moe_x16_rows_for_each_chunk(const MoeProductParams& p,
                                                            const int64_t (&wrow)[kW], int lane,
                                                            Consume&& consume) {
  using Chunks = gemv_detail::Fp8Chunks<uint4>;
  const int chunks = p.K / 16;
  typename Chunks::Row rows[kW];
#pragma unroll
  for (int i = 0; i < kW; ++i) rows[i] = Chunks::row(p.w8, p.K / 8, p.ws, p.skb, wrow[i]);
  for (int c0 = lane; c0 < chunks; c0 += 32 * kDepth) {
    typename Chunks::Raw w[kDepth][kW];
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int i = 0; i < kW; ++i)
        w[d][i] = c0 + 32 * d < chunks ? Chunks::load<false>(rows[i], c0 + 32 * d) : Chunks::zero();
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (c0 + 32 * d >= chunks) break;
      consume(16 * (c0 + 32 * d), w[d]);
    }
  }
}

// One 16-element chunk's products in path (d): for each of the kW rows' loaded chunks w[i] (e4m3 and block
// scale) and each x row r (x[r] nullptr: skipped, warp-uniform), acc[r][i] = fmaf(sum, s, acc[r][i]) with sum
// the chunk's 16 products f32(x) * f32(q) by fmaf from +0 in k order (Fp8x16Weights::chunk_sum; the e4m3
// decoded exactly in integer arithmetic, the NaN codes as +-480). Each W row is decoded once for all x rows.
template <int kR, int kW>
__device__ __forceinline__ void moe_x16_chunk_products(const gemv_detail::Fp8Chunks<uint4>::Raw (&w)[kW],
                                                       const uint16_t* const (&x)[kR], int kk,
                                                       float (&acc)[kR][kW]) {
  using Fp8x16 = gemv_detail::Fp8x16Weights;
#pragma unroll
  for (int i = 0; i < kW; ++i) {
    float wf[16];
    Fp8x16::decode16(w[i].q, wf);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (!x[r]) continue;
      const uint4* xv = reinterpret_cast<const uint4*>(x[r] + kk);
      Fp8x16::chunk_sum(wf, xv[0], xv[1], w[i].s, acc[r][i]);
    }
  }
}

}  // namespace kiln::cuda
