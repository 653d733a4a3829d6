// Decode attention v3, FP8 cache (E4M3 + one UE8M0 scale per 64 elements): the per-warp math of a 128-key
// tile. Hopper has no FP8 mma.sync (ptxas emulates m16n8k32 e4m3 with conversions and two f16 MMAs), so the
// kernel does that itself and keeps Q and P in f16: each e4m3 pair becomes f16x2 in one cvt right before its
// m16n8k16 f16 MMA (exact: every e4m3 value is an f16 value).
//
// Mapping. A warp owns 32 keys of the tile (keys 32 w .. 32 w + 31) and the GQA group's G <= 8 query heads
// (MMA rows g < G; rows g + 8 carry P's low part).
//   S = Q K^T   K by ldmatrix: a lane gets 4 consecutive bytes (head_dim 4t..4t+3 of a 16-byte piece) of key
//               g, i.e. two f16x2 B registers once widened, which the MMA reads as k-slots (2t, 2t+1) and
//               (2t+8, 2t+9): the head_dim order inside each 16 is permuted, Q loaded in the same order. One
//               accumulator per 64-element scale block, the K scales applied per key after.
//   O += P V    P times each key's V scale over the tile's largest, times 2^E so the tile's largest weight is
//   in
//               [2^14, 2^15), as f16 hi (rows g) + lo (rows g + 8); V by ldmatrix.trans, whose b16 pairs give
//               a lane two keys x two adjacent head_dim bytes: a prmt gathers 4 keys of the even and of the
//               odd element, widened to the B registers of the natural key order. Each tile's product lands
//               in a zero accumulator and is folded into O in fp32 with 2^(vref - 127 - E).
// Numerics (docs/NUMERICS.md): products exact (e4m3 and f16 into fp32), Q's f16 rounding outside f16's normal
// range only, p kept to ~2^-22 by its two terms: the bounds of the bf16 path.
#pragma once

#include <cuda_fp16.h>

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
// The two e4m3 values in the low 16 bits of v -> f16x2 (low byte -> low half), exactly.
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t v) {
  uint32_t r;
  asm("{\n.reg .b16 lo;\ncvt.u16.u32 lo, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ uint32_t f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Q of head g (lane g = lane / 4; rows >= G zero) as f16 A registers in the permuted head_dim order of the K
// fragments: qa[ks][h] for head_dim 32 ks + 16 h + 4t .. + 3: {(4t, 4t+1), (4t+2, 4t+3)}, MMA registers 0
// and 2.
template <int D, int G>
__device__ __forceinline__ void load_q_f16(const uint16_t* q, uint32_t (&qa)[D / 32][2][2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 w =
          g < G ? *reinterpret_cast<const uint2*>(q + 32 * ks + 16 * h + 4 * t) : make_uint2(0, 0);
      qa[ks][h][0] = f16x2(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u));
      qa[ks][h][1] = f16x2(__uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
    }
}

// S for this warp's 32 keys: s[n][c] is key 32 w + 8 n + 2 t + c of head g. sKs: the tile's K scale words,
// one per key, the key's two bytes at bit sh[c] (c: the key's row parity).
template <int D>
__device__ __forceinline__ void scores_fp8(const unsigned char* sK, const uint32_t* sKs, const int (&sh)[2],
                                           const uint32_t (&qa)[D / 32][2][2], float (&s)[4][2]) {
  static_assert(D == 128, "two 64-element scale blocks");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4, m = lane / 8;
  float acc[2][4][4];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[b][n][c] = 0.0f;
        // ldmatrix x4 per 16 keys and 32 head_dim bytes: (keys 0-7, bytes 0-15), (keys 0-7, 16-31), (keys
        // 8-15, 0-15), (keys 8-15, 16-31).
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int r = 32 * warp + 16 * h2 + (m / 2) * 8 + lane % 8;
#pragma unroll
    for (int ks = 0; ks < D / 32; ++ks) {
      uint32_t kb[4];
      ldmatrix_x4(kb, smem_addr(sK + tile_off<kFp8Tile>(r, 2 * ks + m % 2)));
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t a[4] = {qa[ks][h][0], 0u, qa[ks][h][1], 0u};
          const uint32_t w = kb[2 * j + h];
          mma_f16(acc[ks / 2][2 * h2 + j], a, f16x2_of_e4m3x2(w), f16x2_of_e4m3x2(w >> 16));
        }
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint32_t sc = sKs[32 * warp + 8 * n + 2 * t + c] >> sh[c];
      s[n][c] = acc[0][n][c] * ue8m0_f32(sc & 0xffu) + acc[1][n][c] * ue8m0_f32((sc >> 8) & 0xffu);
    }
}

// P of this warp's 32 keys (p[n][c]: key 8 n + 2 t + c, head g) as f16 A fragments per 64-element block and
// 16-key half (pa[blk][kh]). fold[blk]: the factor that turns the block's products into O's units.
// sVs, sh: the tile's V scale words as in scores_fp8.
template <int D>
__device__ __forceinline__ void p_frags_fp8(const float (&p)[4][2], const uint32_t* sVs, const int (&sh)[2],
                                            uint32_t (&pa)[D / 64][2][4], float (&fold)[D / 64]) {
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
    // umax 2^E in [2^14, 2^15) (E <= 126: a tile below 2^-112 of the running maximum keeps fewer bits).
    const int E = umax > 0 ? min(126, 141 - (umax >> 23)) : 0;
    const float sE = exp2i(E);
    fold[blk] = exp2i(vref - 127 - E);
    // Keys 16 kh .. 16 kh + 15: registers 0 / 2 the hi of keys (2t, 2t+1) / (8+2t, 9+2t), 1 / 3 their lo.
#pragma unroll
    for (int kh = 0; kh < 2; ++kh)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float x0 = __int_as_float(ub[2 * kh + j][0]) * sE, x1 = __int_as_float(ub[2 * kh + j][1]) * sE;
        const __half2 hi = __floats2half2_rn(x0, x1);
        pa[blk][kh][2 * j] = *reinterpret_cast<const uint32_t*>(&hi);
        pa[blk][kh][2 * j + 1] = f16x2(x0 - __low2float(hi), x1 - __high2float(hi));
      }
  }
}

// O = O corr + P V for this warp's 32 keys; o[pc][i] is head_dim 16 pc + 4 t + i of head g.
template <int D>
__device__ __forceinline__ void pv_fp8(const unsigned char* sV, const uint32_t (&pa)[D / 64][2][4],
                                       const float (&fold)[D / 64], float corr, float (&o)[D / 16][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // ldmatrix.trans x4: matrix i = keys 8 i .. 8 i + 7 of the warp's 32, one 16-byte piece.
  const int r = 32 * warp + lane;
#pragma unroll
  for (int pc = 0; pc < D / 16; ++pc) {
    uint32_t vb[4];
    ldmatrix_x4_trans(vb, smem_addr(sV + tile_off<kFp8Tile>(r, pc)));
    // vb[i] bytes: (key 8i+2t: d, d+1), (key 8i+2t+1: d, d+1), d = 16 pc + 2 g. e[kh] / od[kh]: keys 2t,
    // 2t+1, 8+2t, 9+2t of half kh at the even / odd element.
    const uint32_t e[2] = {prmt2(vb[0], vb[1], 0x6420u), prmt2(vb[2], vb[3], 0x6420u)};
    const uint32_t od[2] = {prmt2(vb[0], vb[1], 0x7531u), prmt2(vb[2], vb[3], 0x7531u)};
    float te[4] = {0.0f, 0.0f, 0.0f, 0.0f}, to[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {
      mma_f16(te, pa[pc / 4][kh], f16x2_of_e4m3x2(e[kh]),
              f16x2_of_e4m3x2(e[kh] >> 16));  // n = g: 16 pc + 2 g
      mma_f16(to, pa[pc / 4][kh], f16x2_of_e4m3x2(od[kh]), f16x2_of_e4m3x2(od[kh] >> 16));  // 16 pc + 2 g + 1
    }
    const float f = fold[pc / 4];
    o[pc][0] = fmaf(o[pc][0], corr, (te[0] + te[2]) * f);
    o[pc][1] = fmaf(o[pc][1], corr, (to[0] + to[2]) * f);
    o[pc][2] = fmaf(o[pc][2], corr, (te[1] + te[3]) * f);
    o[pc][3] = fmaf(o[pc][3], corr, (to[1] + to[3]) * f);
  }
}
#endif  // KILN_SM90A

}  // namespace kiln::cuda::decode_v3
