// Decode attention v3, FP8 cache (E4M3 + one UE8M0 scale per 64 elements): the per-warp math on FP8 tensor
// cores (mma.m16n8k32 e4m3 x e4m3 -> f32), so no K or V byte is ever converted in registers.
//
// Mapping. A warp owns 32 keys of a 128-key tile (keys 32 w .. 32 w + 31) and the GQA group's G <= 8 query
// heads; MMA rows g < G carry each head's high part and rows g + 8 its low part, so one MMA does both.
//   S[16 x 32] = Q K^T   Q as two e4m3 terms, q 2^qe = hi + lo (qe per head puts max |q| in [64, 128); for a
//                        bf16 q the two terms are exact unless |q| < 2^-8 max |q|); K straight from shared
//                        memory by ldmatrix (a b16 lane pair is 4 consecutive e4m3 bytes, the B layout of
//                        k32); one accumulator per 64-element scale block, the K scales applied per key
//                        after.
//   O[16 x D] += P V     P (times each key's V scale over the tile's largest, times 2^E so the tile's largest
//                        weight is in [128, 256)) as hi + lo e4m3 rows; V by ldmatrix.trans, whose b16 pairs
//                        give a lane two keys x two adjacent head_dim bytes: one prmt makes the B fragment of
//                        4 keys for the even and one for the odd head_dim elements (so the key order inside
//                        the k32 step is permuted, the same permutation in P). Each tile's product lands in a
//                        zero accumulator and is folded into O in fp32 with 2^(vref - 127 - E).
// Numerics (docs/NUMERICS.md): S as exact as the bf16 path but for Q's low part below 2^-8 max |q|; P's two
// terms hold it to <= 2^-8 relative (bf16 P's precision); accumulation in the tensor cores' fp32.
#pragma once

#include <cstdint>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/sm90.cuh"  // KILN_SM90A

namespace kiln::cuda::decode_v3 {

// Byte offset of (row, 16-byte piece) in a stage's K or V tile of kTile rows: 128-byte column blocks, piece c
// of a row at c ^ (row & 7) (TMA's 128-byte swizzle), so 8-row ldmatrix loads hit all 32 banks.
template <int kTile>
__device__ __forceinline__ int tile_off(int row, int piece) {
  return (piece >> 3) * (kTile * 128) + row * 128 + (((piece & 7) ^ (row & 7)) << 4);
}

constexpr int kFp8Tile = kDecodeV3TileFp8;  // keys per stage: 32 per warp

#ifdef KILN_SM90A
// c += a (16x32, row) * b (32x8, col), e4m3 operands, fp32 accumulators (the PTX ISA's m16n8k32 layouts:
// a lane holds 4 consecutive k of a row per register, rows g, g + 8, g, g + 8 with k + 16 in registers 2-3;
// b: k 4t..4t+3 and 16+4t..19+4t of column g).
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a * b (a zero accumulator).
__device__ __forceinline__ void mma_e4m3_zero(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
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
// Four floats -> four e4m3 bytes (x0 the lowest), round to nearest, saturating.
__device__ __forceinline__ uint32_t e4m3x4(float x0, float x1, float x2, float x3) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\ncvt.rn.satfinite.e4m3x2.f32 hi, %4, "
      "%3;\n"
      "mov.b32 %0, {lo, hi};\n}"
      : "=r"(r)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}
// x rounded to 4 significant bits (ties away from zero) in fp32: an e4m3 value wherever x is in e4m3's
// normal range, so x - hi4(x) is exact and e4m3 holds hi4(x) exactly.
__device__ __forceinline__ float hi4(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x00080000u) & 0xfff00000u);
}
// Two-term e4m3 split of four values: *hi gets hi4 of each, *lo the rounded rest.
__device__ __forceinline__ void split_e4m3x4(const float (&x)[4], uint32_t* hi, uint32_t* lo) {
  float h[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = hi4(x[i]), l[i] = x[i] - h[i];
  *hi = e4m3x4(h[0], h[1], h[2], h[3]);
  *lo = e4m3x4(l[0], l[1], l[2], l[3]);
}

// Q of head g (lane g = lane / 4; rows >= G zero) as k32 A fragments, one per 32 head_dim elements:
// {hi of k 4t..4t+3, lo of them, hi of k 16+4t..19+4t, lo of them} (rows g, g + 8, g, g + 8). Returns qe.
template <int D, int G>
__device__ __forceinline__ int load_q_fp8(const uint16_t* q, uint32_t (&qa)[D / 32][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float f[D / 32][8];
  float amax = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 w =
          g < G ? *reinterpret_cast<const uint2*>(q + 32 * ks + 16 * h + 4 * t) : make_uint2(0, 0);
      f[ks][4 * h + 0] = __uint_as_float(w.x << 16), f[ks][4 * h + 1] = __uint_as_float(w.x & 0xffff0000u);
      f[ks][4 * h + 2] = __uint_as_float(w.y << 16), f[ks][4 * h + 3] = __uint_as_float(w.y & 0xffff0000u);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[ks][i]));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  // max |q| 2^qe in [64, 128); q is bf16, so amax is normal or zero.
  const int qe = amax > 0.0f ? 6 - (int(__float_as_uint(amax) >> 23) - 127) : 0;
  const float s = exp2i(qe);
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x[4] = {f[ks][4 * h] * s, f[ks][4 * h + 1] * s, f[ks][4 * h + 2] * s, f[ks][4 * h + 3] * s};
      split_e4m3x4(x, &qa[ks][2 * h], &qa[ks][2 * h + 1]);
    }
  return qe;
}

// S for this warp's 32 keys: s[n][c] is key 32 w + 8 n + 2 t + c of head g, in units of 2^-qe (Q's scale).
// sKs: the tile's K scale words, one per key, the key's two bytes at bit sh[c] (c: the key's row parity).
template <int D>
__device__ __forceinline__ void scores_fp8(const unsigned char* sK, const uint32_t* sKs, const int (&sh)[2],
                                           const uint32_t (&qa)[D / 32][4], float (&s)[4][2]) {
  static_assert(D == 128, "two 64-element scale blocks");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4, m = lane / 8;
  float acc[2][4][4];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[b][n][c] = 0.0f;
        // ldmatrix x4 per 16 keys and k-step: (keys 0-7, bytes 0-15), (keys 0-7, 16-31), (keys 8-15, 0-15),
        // (8-15, 16-31) of the k-step's 32 bytes.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 32 * warp + 16 * h + (m / 2) * 8 + lane % 8;
#pragma unroll
    for (int ks = 0; ks < D / 32; ++ks) {
      uint32_t kb[4];
      ldmatrix_x4(kb, smem_addr(sK + tile_off<kFp8Tile>(r, 2 * ks + m % 2)));
      mma_e4m3(acc[ks / 2][2 * h], qa[ks], kb[0], kb[1]);
      mma_e4m3(acc[ks / 2][2 * h + 1], qa[ks], kb[2], kb[3]);
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int key = 32 * warp + 8 * n + 2 * t + c;
      const uint32_t sc = sKs[key] >> sh[c];
      s[n][c] = (acc[0][n][c] + acc[0][n][c + 2]) * ue8m0_f32(sc & 0xffu) +
                (acc[1][n][c] + acc[1][n][c + 2]) * ue8m0_f32((sc >> 8) & 0xffu);
    }
}

// P of this warp's 32 keys (p[n][c]: key 8 n + 2 t + c, head g) as k32 A fragments per 64-element block,
// in the key order of the V fragments (pv_fp8): k 4t..4t+3 = keys 2t, 2t+1, 8+2t, 9+2t; k 16+4t.. = keys
// 16+2t, 17+2t, 24+2t, 25+2t. fold[blk]: the factor that turns the block's products into O's units.
// sVs, sh: the tile's V scale words as in scores_fp8.
template <int D>
__device__ __forceinline__ void p_frags_fp8(const float (&p)[4][2], const uint32_t* sVs, const int (&sh)[2],
                                            uint32_t (&pa)[D / 64][4], float (&fold)[D / 64]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  uint32_t vw[4][2];  // the key's two V scale bytes in bits 0-15
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) vw[n][c] = sVs[32 * warp + 8 * n + 2 * t + c] >> sh[c];
#pragma unroll
  for (int blk = 0; blk < D / 64; ++blk) {
    int vs[4][2], vref = 0;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) vref = max(vref, vs[n][c] = int((vw[n][c] >> (8 * blk)) & 0xffu));
    vref = max(vref, __shfl_xor_sync(0xffffffffu, vref, 1));
    vref = max(vref, __shfl_xor_sync(0xffffffffu, vref, 2));
    // u = p 2^(vs - vref) by adding to p's exponent bits (p in [0, 1]); a result that would leave the normal
    // range (below 2^-126) becomes 0. As integers, non-negative floats order as their values.
    int ub[4][2], umax = 0;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        ub[n][c] = max(int(__float_as_uint(p[n][c])) + ((vs[n][c] - vref) << 23), 0);
        umax = max(umax, ub[n][c]);
      }
    umax = max(umax, __shfl_xor_sync(0xffffffffu, umax, 1));
    umax = max(umax, __shfl_xor_sync(0xffffffffu, umax, 2));
    // umax 2^E in [128, 256) (E <= 126: a tile below 2^-119 of the running maximum keeps fewer bits).
    const int E = umax > 0 ? min(126, 134 - (umax >> 23)) : 0;
    const float sE = exp2i(E);
    fold[blk] = exp2i(vref - 127 - E);
    float x0[4], x1[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x0[i] = __int_as_float(ub[i / 2][i % 2]) * sE;
      x1[i] = __int_as_float(ub[2 + i / 2][i % 2]) * sE;
    }
    split_e4m3x4(x0, &pa[blk][0], &pa[blk][1]);
    split_e4m3x4(x1, &pa[blk][2], &pa[blk][3]);
  }
}

// O = O corr + P V for this warp's 32 keys; o[pc][i] is head_dim 16 pc + 4 t + i of head g.
template <int D>
__device__ __forceinline__ void pv_fp8(const unsigned char* sV, const uint32_t (&pa)[D / 64][4],
                                       const float (&fold)[D / 64], float corr, float (&o)[D / 16][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // ldmatrix.trans x4: matrix i = keys 8 i .. 8 i + 7 of the warp's 32, one 16-byte piece.
  const int r = 32 * warp + lane;
#pragma unroll
  for (int pc = 0; pc < D / 16; ++pc) {
    uint32_t vb[4];
    ldmatrix_x4_trans(vb, smem_addr(sV + tile_off<kFp8Tile>(r, pc)));
    // vb[i] bytes: (key 8i+2t: d, d+1), (key 8i+2t+1: d, d+1), d = 16 pc + 2 g.
    const uint32_t e0 = prmt2(vb[0], vb[1], 0x6420u), e1 = prmt2(vb[2], vb[3], 0x6420u);
    const uint32_t d0 = prmt2(vb[0], vb[1], 0x7531u), d1 = prmt2(vb[2], vb[3], 0x7531u);
    float te[4], to[4];
    mma_e4m3_zero(te, pa[pc / 4], e0, e1);  // n = g: head_dim 16 pc + 2 g; columns 2t, 2t+1
    mma_e4m3_zero(to, pa[pc / 4], d0, d1);  // head_dim 16 pc + 2 g + 1
    const float f = fold[pc / 4];
    o[pc][0] = fmaf(o[pc][0], corr, (te[0] + te[2]) * f);
    o[pc][1] = fmaf(o[pc][1], corr, (to[0] + to[2]) * f);
    o[pc][2] = fmaf(o[pc][2], corr, (te[1] + te[3]) * f);
    o[pc][3] = fmaf(o[pc][3], corr, (to[1] + to[3]) * f);
  }
}
#endif  // KILN_SM90A

}  // namespace kiln::cuda::decode_v3
