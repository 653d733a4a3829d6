// Decode attention v3, FP8 cache (E4M3 + one UE8M0 scale per 64 elements): one warp's state for a query row
// and its math on a 128-key tile. Hopper has no FP8 mma.sync (ptxas emulates m16n8k32 e4m3 with conversions
// and two f16 MMAs), so the kernel widens each e4m3 pair to f16x2 itself (one cvt, exact: every e4m3 value is
// an f16 value) right before its m16n8k16 f16 MMA, with Q and P in f16.
//
// Mapping: the keys are the MMAs' rows and the query heads their columns (S^T = K Q^T, O^T += V^T P^T), so
// the 16 rows of every MMA carry keys or head_dim elements and none is padding. A warp owns 32 keys of the
// tile (32 w .. 32 w + 31: two 16-key m-tiles) and 8 columns: for G <= 4 column n is head n % 4, its P's
// hi part in columns 0-3 and lo part in 4-7 (S is computed twice, so lanes t and t + 2 hold the same
// scores and each makes one part, no shuffle); for G = 5..8 column n is head n, hi and lo as two n-tiles.
//   S^T  K by ldmatrix: a lane gets 4 bytes (head_dim 4t..4t+3 of a 16-byte piece) of keys g and g + 8,
//        i.e. A registers 0/2 and 1/3 once widened: the head_dim order inside each 16 is permuted, Q (the B
//        operand) loaded in the same order. One accumulator per 64-element scale block, each key's K scales
//        applied after. s[mt][c]: key 16 mt + g + 8 (c / 2) of the warp, column 2t + c % 2.
//   P    p (<= 1: relative to the running max) times 2^(vs - vref + 14), vs the key's V scale byte and vref
//        the largest seen so far in the row, so every weight is <= 2^14; rounded to f16 as hi + lo, packed
//        per key (columns 2t, 2t + 1) and turned into B fragments (keys 2t, 2t + 1 of column g) by
//        movmatrix.trans.
//   O^T  V by ldmatrix.trans, whose b16 pairs give a lane two keys x two adjacent head_dim bytes: a prmt
//        gathers 4 keys of the even and of the odd element, widened to the A registers (rows g / g + 8 =
//        head_dim 16 pc + 2g / + 1). The MMAs accumulate into O, kept in units of 2^(vref - 127 - 14); O is
//        rescaled (corr times 2^(vref_old - vref_new), exact powers of two besides corr) only on tiles where
//        some column's max or vref moved (a warp vote), and leaves those units once, after the last tile.
// Numerics (docs/NUMERICS.md): products exact (e4m3 and f16 into fp32), Q's f16 rounding outside f16's normal
// range only, p kept to ~2^-22 by its two terms for weights above 2^-28 of the row's largest (below, f16's
// subnormal step bounds the error by 2^-39 of it): the bounds of the bf16 path.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/sm90.cuh"  // KILN_SM90A

namespace kiln::cuda::decode_sm90 {

// Byte offset of (row, 16-byte piece) in a stage's K or V tile of kTile rows: 128-byte column blocks, piece c
// of a row at c ^ (row & 7) (TMA's 128-byte swizzle), so 8-row ldmatrix loads hit all 32 banks.
template <int kTile>
__device__ __forceinline__ int tile_off(int row, int piece) {
  return (piece >> 3) * (kTile * 128) + row * 128 + (((piece & 7) ^ (row & 7)) << 4);
}

constexpr int kFp8Tile = kDecodeSm90TileFp8;  // keys per stage: 32 per warp

#ifdef KILN_SM90A
// 2^e for an integer e, 0 below the normal range.
__device__ __forceinline__ float exp2i(int e) {
  return e < -126 ? 0.0f : __uint_as_float(uint32_t(min(e, 127) + 127) << 23);
}
// 2^(byte - 127) (UE8M0) as a float; byte 0 is the subnormal 2^-127.
__device__ __forceinline__ float ue8m0_f32(uint32_t byte) {
  return __uint_as_float(byte == 0 ? 0x00400000u : byte << 23);
}
__device__ __forceinline__ uint32_t prmt2(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// The two e4m3 values in the low (kHi: high) 16 bits of v -> f16x2 (lower byte -> low half), exactly.
template <bool kHi>
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t v) {
  uint32_t r;
  if constexpr (kHi) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(v));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(v));
  }
  return r;
}
__device__ __forceinline__ uint32_t f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// A 4-byte shared-memory load (the pointers here are generic ones, which would load through the generic
// path).
__device__ __forceinline__ uint32_t lds32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(smem_addr(p)));
  return v;
}
// Lane-wise max of two u16x2.
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// The transpose of an 8x8 b16 matrix held one row pair per lane (lane 4r + c: row r, columns 2c, 2c + 1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t v) {
  uint32_t r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

// One warp's online-softmax state for a query row: m / l of its columns 2t, 2t + 1 (l: this lane's keys
// only), O^T of its columns (o[nt][pc][c]: head_dim 16 pc + 2g + c / 2, column 2t + c % 2 of n-tile nt), and
// Q^T as B fragments.
template <int D, int G>
struct Fp8Row {
  static_assert(D == 128, "two 64-element scale blocks");
  static constexpr bool kDup = G <= 4;      // hi and lo in one n-tile (columns n and n + 4)
  static constexpr int kOt = kDup ? 1 : 2;  // O^T n-tiles: hi and lo apart for G > 4
  uint32_t qb[D / 16][2];                   // piece P: Q(head_dim 16 P + 4t, + 1), (16 P + 4t + 2, + 3)
  float m[2], l[2];
  int vref[2];  // per 64-element block: the largest V scale byte seen (O's units)
  float o[kOt][D / 16][4];

  // Column g's head, or -1 where the column is padding.
  __device__ __forceinline__ static int column_head(int n) {
    const int h = kDup ? n % 4 : n;
    return h < G ? h : -1;
  }

  // q: the row's first query head of the group (heads q_stride_h apart).
  __device__ __forceinline__ void init(const uint16_t* q, int64_t q_stride_h) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, h = column_head(g);
#pragma unroll
    for (int pc = 0; pc < D / 16; ++pc) {
      const uint2 w =
          h >= 0 ? *reinterpret_cast<const uint2*>(q + h * q_stride_h + 16 * pc + 4 * t) : make_uint2(0, 0);
      qb[pc][0] = f16x2(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u));
      qb[pc][1] = f16x2(__uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
    }
    m[0] = m[1] = -__builtin_huge_valf();
    l[0] = l[1] = 0.0f;
    vref[0] = vref[1] = 0;
#pragma unroll
    for (int nt = 0; nt < kOt; ++nt)
#pragma unroll
      for (int pc = 0; pc < D / 16; ++pc)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[nt][pc][c] = 0.0f;
  }

  // S^T of the warp's 32 keys with the K scales applied. sKs: the tile's K scale words, one per key, the
  // key's two bytes at bit sh (every key of this lane has the row parity of g).
  __device__ __forceinline__ void scores(const unsigned char* sK, const uint32_t* sKs, int sh,
                                         float (&s)[2][4]) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, mi = lane / 8;
    float acc[2][2][4];  // [scale block][m-tile][c]
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[b][mt][c] = 0.0f;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      // ldmatrix x4 per 16 keys and 32 head_dim bytes: (keys 0-7, piece 2ks), (keys 8-15, 2ks), (keys 0-7,
      // 2ks + 1), (keys 8-15, 2ks + 1).
      const int r = 32 * warp + 16 * mt + (mi % 2) * 8 + lane % 8;
#pragma unroll
      for (int ks = 0; ks < D / 32; ++ks) {
        uint32_t kb[4];
        ldmatrix_x4(kb, smem_addr(sK + tile_off<kFp8Tile>(r, 2 * ks + mi / 2)));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t a[4] = {f16x2_of_e4m3x2<false>(kb[2 * h]), f16x2_of_e4m3x2<false>(kb[2 * h + 1]),
                                 f16x2_of_e4m3x2<true>(kb[2 * h]), f16x2_of_e4m3x2<true>(kb[2 * h + 1])};
          mma_f16(acc[ks / 2][mt], a, qb[2 * ks + h][0], qb[2 * ks + h][1]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t sc = lds32(sKs + 32 * warp + 16 * mt + 8 * hh + g) >> sh;
        const float s0 = ue8m0_f32(sc & 0xffu), s1 = ue8m0_f32((sc >> 8) & 0xffu);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          s[mt][2 * hh + j] = acc[0][mt][2 * hh + j] * s0 + acc[1][mt][2 * hh + j] * s1;
      }
  }

  // One tile: the online softmax over S (scaled by scale2 = scale log2 e; keys at or past t_end masked when
  // partial), then O = O corr + P V. key0: the context position of the warp's first key.
  __device__ __forceinline__ void tile(const unsigned char* sK, const uint32_t* sKs, int sh, float scale2,
                                       int key0, int t_end, bool partial) {
    const unsigned char* sV = sK + kFp8Tile * D;
    const uint32_t* sVs = sKs + kFp8Tile;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    constexpr float kNegInf = -__builtin_huge_valf();
    float s[2][4];
    scores(sK, sKs, sh, s);
    if (partial) {  // uniform over the warp: only the chunk's last tile
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (key0 + 16 * mt + 8 * (c / 2) + g >= t_end) s[mt][c] = kNegInf;
    }
    // The running max (base 2) of each column over the warp's keys (scale2 > 0: the max of s, scaled).
    float mx[2] = {fmaxf(fmaxf(s[0][0], s[0][2]), fmaxf(s[1][0], s[1][2])),
                   fmaxf(fmaxf(s[0][1], s[0][3]), fmaxf(s[1][1], s[1][3]))};
    float corr[2], neg_m[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int x = 4; x < 32; x *= 2) mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], x));
      const float m_new = fmaxf(m[j], mx[j] * scale2);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // a column with no key yet keeps p = 0
      corr[j] = exp2_approx(m[j] - m_use);
      neg_m[j] = -m_use;
      m[j] = m_new;
      l[j] *= corr[j];
    }
    float p[2][4];  // <= 1
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) l[c % 2] += (p[mt][c] = exp2_approx(fmaf(s[mt][c], scale2, neg_m[c % 2])));

    // V scales: each key's pair as u16x2 (block 0 low, 1 high), the warp's largest of each block, and the
    // running reference vref (O is kept in units of 2^(vref - 127 - 14)).
    uint32_t vw[2][2];
    uint32_t vmax = 0;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        vw[mt][hh] = prmt2(lds32(sVs + 32 * warp + 16 * mt + 8 * hh + g), 0u, sh ? 0x4342u : 0x4140u);
        vmax = max_u16x2(vmax, vw[mt][hh]);
      }
#pragma unroll
    for (int x = 4; x < 32; x *= 2) vmax = max_u16x2(vmax, __shfl_xor_sync(0xffffffffu, vmax, x));
    float resc[2][2];  // [blk][j]: the factor that moves O of column 2t + j into the new units
    bool rescale = corr[0] != 1.0f || corr[1] != 1.0f;
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      const int vnew = max(vref[blk], int(vmax >> (16 * blk)) & 0xffff);
      const float f = exp2i(vref[blk] - vnew);
      rescale |= vnew != vref[blk];
      vref[blk] = vnew;
#pragma unroll
      for (int j = 0; j < 2; ++j) resc[blk][j] = corr[j] * f;
    }
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int nt = 0; nt < kOt; ++nt)
#pragma unroll
        for (int pc = 0; pc < D / 16; ++pc)
#pragma unroll
          for (int c = 0; c < 4; ++c) o[nt][pc][c] *= resc[pc / 4][c % 2];
    }

    // P as B fragments per scale block: x = p 2^(vs - vref + 14) <= 2^14, as f16 hi + lo; pb[blk][nt][mt][i]
    // for the k-step of m-tile mt.
    uint32_t pb[2][kOt][2][2];
#pragma unroll
    for (int blk = 0; blk < 2; ++blk)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int vs = int(vw[mt][hh] >> (16 * blk)) & 0xffff;
          // 2^(vs - vref + 14), 0 below the normal range
          const float f = __int_as_float(max(vs - vref[blk] + 141, 0) << 23);
          const float x0 = p[mt][2 * hh] * f, x1 = p[mt][2 * hh + 1] * f;
          const __half2 hi = __floats2half2_rn(x0, x1);
          if constexpr (kDup) {
            // lanes t >= 2 (columns 4-7) carry the lo part: x - hi; the others x - 0.
            const float keep = t >= 2 ? 1.0f : 0.0f;
            pb[blk][0][mt][hh] =
                movmatrix_trans(f16x2(fmaf(-keep, __low2float(hi), x0), fmaf(-keep, __high2float(hi), x1)));
          } else {
            pb[blk][0][mt][hh] = movmatrix_trans(*reinterpret_cast<const uint32_t*>(&hi));
            pb[blk][1][mt][hh] = movmatrix_trans(f16x2(x0 - __low2float(hi), x1 - __high2float(hi)));
          }
        }

    // O^T += V^T P^T: ldmatrix.trans x4, matrix i = keys 8 i .. 8 i + 7 of the warp's 32, one 16-byte piece.
    const int r = 32 * warp + lane;
#pragma unroll
    for (int pc = 0; pc < D / 16; ++pc) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, smem_addr(sV + tile_off<kFp8Tile>(r, pc)));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        // vb[i] bytes: (key 2t: d, d + 1), (key 2t + 1: d, d + 1) of keys 8 i .., d = 16 pc + 2g. e / od:
        // keys 2t, 2t + 1, 8 + 2t, 9 + 2t of m-tile mt at the even / odd element.
        const uint32_t e = prmt2(vb[2 * mt], vb[2 * mt + 1], 0x6420u);
        const uint32_t od = prmt2(vb[2 * mt], vb[2 * mt + 1], 0x7531u);
        const uint32_t a[4] = {f16x2_of_e4m3x2<false>(e), f16x2_of_e4m3x2<false>(od),
                               f16x2_of_e4m3x2<true>(e), f16x2_of_e4m3x2<true>(od)};
#pragma unroll
        for (int nt = 0; nt < kOt; ++nt) mma_f16(o[nt][pc], a, pb[pc / 4][nt][mt][0], pb[pc / 4][nt][mt][1]);
      }
    }
  }

  // After the last tile: this warp's m, l and O of each head into the merge scratch (sm_m / sm_l [warp][G],
  // sm_o [warp][G][D]).
  __device__ __forceinline__ void to_scratch(float* sm_m, float* sm_l, float* sm_o) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int x = 4; x < 32; x *= 2) l[j] += __shfl_xor_sync(0xffffffffu, l[j], x);
    // hi + lo of each column (kDup: from lane t + 2; else the second n-tile), then out of the units
    // 2^(vref - 127 - 14) (two exact steps: 2^(vref - 127) alone may be subnormal).
    const float unit[2] = {ue8m0_f32(uint32_t(vref[0])), ue8m0_f32(uint32_t(vref[1]))};
#pragma unroll
    for (int pc = 0; pc < D / 16; ++pc)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if constexpr (kDup) {
          o[0][pc][c] += __shfl_xor_sync(0xffffffffu, o[0][pc][c], 2);
        } else {
          o[0][pc][c] += o[kOt - 1][pc][c];
        }
        o[0][pc][c] = o[0][pc][c] * 0x1p-14f * unit[pc / 4];
      }
    if (kDup && t >= 2) return;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = 2 * t + j;
      if (h >= G) continue;
      if (g == 0) sm_m[warp * G + h] = m[j], sm_l[warp * G + h] = l[j];
      float* dst = sm_o + (warp * G + h) * D + 2 * g;
#pragma unroll
      for (int pc = 0; pc < D / 16; ++pc)
        *reinterpret_cast<float2*>(dst + 16 * pc) = make_float2(o[0][pc][j], o[0][pc][2 + j]);
    }
  }
};
#endif               // KILN_SM90A
struct NoFp8Row {};  // a bf16 cache's stand-in

}  // namespace kiln::cuda::decode_sm90
