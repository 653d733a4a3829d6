// Prefill v4: causal paged GQA attention with wgmma on Hopper (the FlashAttention-3 structure: a producer
// warpgroup feeding a multi-stage shared-memory pipeline completed on mbarriers, two consumer warpgroups
// doing S = Q K^T and O += P V with wgmma). Included only by the instantiation units.
//
// Work mapping.
//   Packed query rows: sequence b's q_len x G (token, query head of KV group hk) pairs are numbered
//   f = token * G + g (g = h - hk G). A block owns kBM = 128 consecutive packed rows of one (b, hk): all G
//   heads of a group read the same K/V tiles, so each tile is fetched once per group and per 128 rows
//   whatever G is (G 4: 32 tokens x 4 heads; G 1: 128 tokens; G 3, 5, 6 too: a block may start mid-token).
//   Work items: (KV head hk, sequence, row tile), linear index x: head x % Hkv, item x / Hkv, where items
//   enumerate the sequences in order and each sequence's row tiles last first (the causal tiles with the
//   most keys first; find_work: a warp-wide prefix sum over cu_q).
//   Grid: persistent, min(Hkv * (ceil(T G / 128) + B), SMs) blocks of one per SM. Block b's k-th item is
//   x = k P + b in even rounds and k P + P - 1 - b in odd ones (P blocks, a zigzag that pairs long items
//   with short ones: block_item); both roles walk the same sequence, and the key-tile count jt runs on
//   across items, so the producer fills the next item's Q and first tiles while the consumers finish the
//   current one (no prologue or epilogue with idle tensor cores between items).
//   Block: 384 threads = 3 warpgroups.
//     warpgroup 0, producer (setmaxnreg 64): per item k, its Q into Q buffer k % 2 (once the consumers
//       released item k - 2's; by TMA where G divides 64, else gathered by the 128 threads), then for key
//       tile j = 0 .. n_tiles - 1 (kBN = 128 keys), the block's tile jt, stage jt % S: waits until both
//       consumers released the stage's K (empty K barrier), fills it, then the same for V:
//       - bf16 cache, tile wholly inside the context, page_size 16, 32, 64 or 128: thread 0 issues one TMA
//         box (page_size rows x 64 d, 128-byte swizzle) per page and 64-wide column of K, and thread 32
//         (v_issue_thread) those of V, each thread with its own page lookups and empty waits, each tensor
//         completing its own full barrier (expect_tx = the tile's bytes);
//       - otherwise (the tile reaching past kv_len, an fp8 cache, no tensor map): thread t gathers key row
//         t of the tile through the page table (fp8: 8 e4m3 bytes at a time widened exactly to bf16 with
//         the row's UE8M0 scale), rows at or past kv_len stored as zeros (NaN garbage never reaches P V),
//         in the same swizzled layout, then fence.proxy.async + a named barrier + one arrival. Where some
//         tiles came by TMA, only thread 0 (K) and thread 32 (V) have waited on the empty barriers for every
//         tile (the others skip TMA tiles, and an mbarrier parity wait cannot tell phase k from k - 2), so
//         they alone wait for a gathered tile's stages and a named barrier hands each to the others.
//     warpgroups 1 and 2, consumers (setmaxnreg 216): consumer c owns packed rows 64 c .. 64 c + 63 of the
//       item; warp w of it rows 16 w .. 16 w + 15 (thread: rows lane / 4 and lane / 4 + 8, the wgmma
//       accumulator layout, wgmma_bf16.cuh). Per item it waits for its Q buffer, then per key tile: waits
//       K, S = Q K^T (m64n128k16, D / 16 steps, Q and K K-major from shared memory), scales to the log2
//       domain, masks keys past each row's position (only in tiles that reach past the warpgroup's first
//       row), online softmax in fp32 (running max m, sum l of unrounded p, O rescaled by 2^(m_old -
//       m_new) unless no row of the warp moved its max), P rounded to bf16 in registers, waits V, O += P V
//       (m64nDk16, A = P from registers, B = V MN-major from shared memory); each warp releases K once S is
//       done, V once P V is, and the Q buffer after the item's last product. Pipelined (the default): S_j is
//       issued before P_{j-1} V_{j-1} and tile j's softmax runs while that product is in flight, and the two
//       consumers take turns issuing their products (named barriers 2 and 3, once both operands are in), so
//       one's softmax overlaps the other's MMAs. Finally O / l, one bf16 rounding, stored to out[token, hk G
//       + g, :].
//   Shared memory (1024-aligned): Q [2 buffers][2 warpgroups][D / 64][64 rows][128 B]; K and V [S][D / 64]
//   [128 keys][128 B]; fullK[S], fullV[S] (count 1 + TMA bytes), emptyK[S], emptyV[S] (count 8: every
//   consumer warp), fullQ[2] (count 1 + TMA bytes), emptyQ[2] (count 8).
// Numerics: fp32 scores and softmax (exp2 of log2-scaled scores), P rounded once to bf16 for the P V MMA
// (|p - bf16(p)| <= 2^-9 p) while l sums the unrounded p; see docs/NUMERICS.md for the stated bound.
#pragma once

#include "ops/cuda/attention_prefill_sm90_wgmma_producer.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/wgmma_bf16.cuh"

namespace kiln::cuda {
namespace prefill_sm90 {

#ifdef KILN_SM90A

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return f32_to_bf16_bits(lo) | (f32_to_bf16_bits(hi) << 16);
}

// Consumer warpgroup c (0 or 1) on item k of the block, whose first key tile is the block's jt0-th: see
// the mapping comment at the top of this file. kOverlap: the softmax of tile j overlaps the P V product of
// tile j - 1; else each tile's two products run in turn.
template <int D, int S, bool kOverlap>
__device__ __forceinline__ void consume_item(const PrefillSm90Params& prm, const Item& it, int k, int jt0,
                                             int c, uint32_t sQ) {
  constexpr uint32_t kTileBytes = kBN * D * 2;
  static_assert(smem_bytes<D>() < 0x40000, "issue_qk / issue_pv add offsets to a 14-bit address field");
  const uint32_t sK = sQ + smem_k_offset<D>(), sV = sQ + smem_v_offset<D>(),
                 bars = sQ + smem_bars_offset<D>();
  const PagedAttnParams& p = prm.p;
  const Work& w = it.w;
  const int G = prm.G, n_tiles = it.n_tiles, t = int(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  const int rows = w.q_len * G, f_wg = w.tile * kBM + c * kWgRows;
  const uint32_t q_tile = sQ + uint32_t(k & 1) * (kBM * D * 2) + uint32_t(c) * (kWgRows * D * 2);

  // Context positions of this thread's two rows (rows past the sequence take its last row's position:
  // computed, never stored) and of the warpgroup's first row (tiles past it need no mask).
  const int pos_base = w.kv_len - w.q_len;
  int rpos[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2)
    rpos[h2] = pos_base + min(f_wg + warp * 16 + lane / 4 + 8 * h2, rows - 1) / G;
  const int first_pos = pos_base + min(f_wg, rows - 1) / G;
  const float sl2 = p.scale * 1.4426950408889634f;  // scores in the log2 domain: p = 2^(s log2 e - m)

  float o[D / 2], sc[kBN / 2];
  uint32_t pa[kBN / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) sc[i] = 0.0f;
  float m[2] = {-__builtin_huge_valf(), -__builtin_huge_valf()}, l[2] = {0.0f, 0.0f}, corr[2];

  // Key tile j of the item is the block's tile jt0 + j: stage (jt0 + j) % S, phase ((jt0 + j) / S) & 1.
  const auto stage = [&](int j) { return (jt0 + j) % S; };
  const auto full_k = [&](int j) { return bars + 8 * stage(j); };
  const auto full_v = [&](int j) { return bars + 8 * (S + stage(j)); };
  const auto wait_full = [&](uint32_t bar, uint32_t parity) {
    sm90::mbar_wait(bar, parity);
    __syncwarp();  // the spin may end on different iterations per lane; wgmma needs the warp converged
  };
  const auto parity = [&](int j) { return uint32_t((jt0 + j) / S) & 1u; };
  // This warp is done with K (kV false) or V of tile j (its wgmma reads completed: after wait_group).
  const auto release = [&](bool kV, int j) {
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bars + 8 * ((kV ? 3 : 2) * S + stage(j)));
  };
  // sc = Q K_j^T (not committed).
  const auto issue_qk = [&](int j) {
    const uint32_t k_tile = sK + uint32_t(stage(j)) * kTileBytes;
    // One descriptor per operand tile, each k-step's offset added to its 14-bit address field (shared
    // addresses stay below 256 KB, so the field never carries): 64 fewer SASS instructions than a
    // descriptor built per k-step, 0.5 % faster at 4096 and 8192 tokens (H200, 2026-12-03, `3925ba7`;
    // bench/results/h200_decode_prefill_probes_2026-12-03.txt).
    const sm90::WgmmaDesc qd = sm90::sw128_desc(q_tile, 16, 1024), kd = sm90::sw128_desc(k_tile, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t col = uint32_t(kk / 4), k32 = uint32_t(kk % 4) * 32;
      sm90::wgmma_m64n128k16_ss(sc, qd.plus(col * (kWgRows * 128) + k32), kd.plus(col * (kBN * 128) + k32),
                                kk > 0 ? 1u : 0u);
    }
  };
  // o += P V_j with P in pa (not committed).
  const auto issue_pv = [&](int j) {
    const uint32_t v_tile = sV + uint32_t(stage(j)) * kTileBytes;
    const sm90::WgmmaDesc vd = sm90::sw128_desc(v_tile, kBN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const sm90::WgmmaDesc dv = vd.plus(uint32_t(kk) * 2048);  // the next 16 keys: 2 KB on
      if constexpr (D == 128)
        sm90::wgmma_m64n128k16_rs(o, pa[kk], dv, 1u);
      else
        sm90::wgmma_m64n64k16_rs(o, pa[kk], dv, 1u);
    }
  };
  // Online softmax of tile j in sc (rows lane / 4: e = 0, 1; lane / 4 + 8: e = 2, 3): mask keys past each
  // row's position, new running max m in the log2 domain, corr = 2^(m_old - m_new), sc = p =
  // 2^(s sl2 - m) (one FFMA and one ex2 an element), l = l corr + sum p. Touches neither o nor pa (a P V
  // product may still be reading them).
  const auto softmax = [&](int j) {
    // The mask is its own code behind the warp-uniform need_mask, one threshold a row (column 8 i + e % 2
    // of this thread lies past row r's position when it exceeds lim[r]): folded into every tile's max loop,
    // ptxas if-converted it into 64 ISETP + 64 FSEL a tile (+5 % at 4096 and 8192 tokens without them:
    // H200, 2026-12-03, `ad79b29`; bench/results/h200_prefill_split_mask_2026-12-03.txt).
    if ((j + 1) * kBN - 1 > first_pos) {
      const int lim[2] = {rpos[0] - j * kBN - 2 * (lane % 4), rpos[1] - j * kBN - 2 * (lane % 4)};
#pragma unroll
      for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (8 * i + (e & 1) > lim[e >> 1]) sc[4 * i + e] = -__builtin_huge_valf();
    }
    // Row maxima in four chains a row (fmaxf is exact: the same bits in any order).
    float mq[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int q = 0; q < 4; ++q) mq[r][q] = -__builtin_huge_valf();
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& q = mq[e >> 1][(i % 2) * 2 + (e & 1)];
        q = fmaxf(q, sc[4 * i + e]);
      }
    float mx[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[r] = fmaxf(fmaxf(mq[r][0], mq[r][1]), fmaxf(mq[r][2], mq[r][3]));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // max(s) sl2 = max(s sl2): scaling by sl2 > 0 is monotonic. Finite: key 0 is visible to every row
      // from tile 0 on.
      const float mn = fmaxf(m[r], mx[r] * sl2);
      corr[r] = exp2_approx(m[r] - mn);
      m[r] = mn;
      l[r] *= corr[r];
    }
    // The row sums in two chains a row (one chain of 32 dependent FADDs a row was the softmax's longest;
    // another order of the same unrounded p: v4 is held to the fp64 bound, not to bits).
    float lq[2][2] = {};
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2_approx(fmaf(sc[4 * i + e], sl2, -m[e >> 1]));  // masked: 2^-inf = 0
        lq[e >> 1][e & 1] += pe;
        sc[4 * i + e] = pe;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] += lq[r][0] + lq[r][1];
  };
  // o *= corr (its rows), then P rounded to bf16: n8 blocks 2 kk and 2 kk + 1 of S are the A fragment of
  // k-step kk of P V.
  const auto rescale_and_pack = [&] {
    // No rescale when no row of the warp moved its max (o * 1 = o: the same bits), as in most tiles of a
    // long row.
    if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        o[4 * i] *= corr[0], o[4 * i + 1] *= corr[0];
        o[4 * i + 2] *= corr[1], o[4 * i + 3] *= corr[1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pa[kk][0] = pack_bf16x2(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = pack_bf16x2(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };

  // Ping-pong (prm.pingpong, the default): the two consumers take turns issuing their tensor work, FA3's
  // inter-warpgroup schedule: consumer c waits for its turn on named barrier 2 + c and hands the turn to the
  // other on 3 - c once its products are issued, so one's softmax runs while the other's products do
  // (+3-5 % at 4096 and 8192 tokens on the H200, 2026-12-02, `7c679c9`;
  // bench/results/h200_prefill_pingpong_2026-12-02.txt).
  const bool pp = prm.pingpong != 0;
  const auto turn_take = [&] {
    if (pp) sm90::named_bar_sync(uint32_t(2 + c), 256);
  };
  const auto turn_give = [&] {
    if (pp) sm90::named_bar_arrive(uint32_t(3 - c), 256);
  };
  wait_full(bars + 8 * (4 * S + (k & 1)), uint32_t(k >> 1) & 1u);  // Q
  if constexpr (kOverlap) {
    // S_j = Q K_j^T is issued before O += P_{j-1} V_{j-1}, and the softmax of tile j runs while that
    // product is still on the tensor cores (wait_group 1), FlashAttention-3's intra-warpgroup overlap. K_j
    // is released as soon as S_j is done, V_{j-1} when its product is.
    wait_full(full_k(0), parity(0));
    turn_take();
    sm90::wgmma_fence();
    issue_qk(0);
    sm90::wgmma_commit();
    turn_give();
    sm90::wgmma_wait<0>();
    release(false, 0);
    softmax(0);
    rescale_and_pack();
    for (int j = 1; j < n_tiles; ++j) {
      wait_full(full_k(j), parity(j));
      if (pp) wait_full(full_v(j - 1), parity(j - 1));  // both operands in before taking the turn
      turn_take();
      sm90::wgmma_fence();
      issue_qk(j);
      sm90::wgmma_commit();
      if (!pp) wait_full(full_v(j - 1), parity(j - 1));
      sm90::wgmma_fence();
      issue_pv(j - 1);
      sm90::wgmma_commit();
      turn_give();
      sm90::wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
      release(false, j);
      softmax(j);
      sm90::wgmma_wait<0>();
      release(true, j - 1);
      rescale_and_pack();
    }
    wait_full(full_v(n_tiles - 1), parity(n_tiles - 1));
    turn_take();
    sm90::wgmma_fence();
    issue_pv(n_tiles - 1);
    sm90::wgmma_commit();
    turn_give();
    sm90::wgmma_wait<0>();
    release(true, n_tiles - 1);
  } else {
    for (int j = 0; j < n_tiles; ++j) {
      wait_full(full_k(j), parity(j));
      sm90::wgmma_fence();
      issue_qk(j);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      release(false, j);
      softmax(j);
      rescale_and_pack();
      wait_full(full_v(j), parity(j));
      sm90::wgmma_fence();
      issue_pv(j);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      release(true, j);
    }
  }
  // Every S product of the item is done: its Q buffer goes back to the producer (the item after next).
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(bars + 8 * (4 * S + 2 + (k & 1)));

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // The item's place, looked up again rather than held in registers through the tile loop.
  Item e;
  block_item(prm, k, e);
  const int e_rows = e.w.q_len * G, e_f_wg = e.w.tile * kBM + c * kWgRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int f = e_f_wg + warp * 16 + lane / 4 + 8 * r;
    if (f >= e_rows) continue;
    uint16_t* dst = static_cast<uint16_t*>(p.out) + int64_t(e.w.q0 + f / G) * p.o_stride_t +
                    int64_t(e.hk * G + f % G) * p.o_stride_h + (lane % 4) * 2;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<uint32_t*>(dst + 8 * i) =
          pack_bf16x2(__fdiv_rn(o[4 * i + 2 * r], l[r]), __fdiv_rn(o[4 * i + 2 * r + 1], l[r]));
  }
}

template <int D, int S, bool kOverlap>
__device__ __forceinline__ void consume(const PrefillSm90Params& prm, int c, uint32_t sQ) {
  Item it;
  int jt = 0;
  // Ping-pong: consumer 0 takes the first turn; its extra take at the end matches consumer 1's last
  // hand-over (every take pairs with one hand-over; both consumers walk the same items and tiles).
  if (kOverlap && prm.pingpong && c == 1) sm90::named_bar_arrive(2, 256);
  for (int k = 0; block_item(prm, k, it); ++k) {
    consume_item<D, S, kOverlap>(prm, it, k, jt, c, sQ);
    jt += it.n_tiles;
  }
  if (kOverlap && prm.pingpong && c == 0) sm90::named_bar_sync(2, 256);
}

#endif  // KILN_SM90A

template <int D, KvDtype KT, bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_sm90_kernel(const __grid_constant__ PrefillSm90Params prm) {
#ifdef KILN_SM90A
  constexpr int S = stages<D>();
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sQ = (sm90::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + smem_k_offset<D>(), sV = sQ + smem_v_offset<D>(),
                 bars = sQ + smem_bars_offset<D>();
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      sm90::mbar_init(bars + 8 * s, 1);            // full K
      sm90::mbar_init(bars + 8 * (S + s), 1);      // full V
      sm90::mbar_init(bars + 8 * (2 * S + s), 8);  // K consumed: the 8 consumer warps
      sm90::mbar_init(bars + 8 * (3 * S + s), 8);  // V consumed
    }
    for (int b = 0; b < 2; ++b) {
      sm90::mbar_init(bars + 8 * (4 * S + b), 1);      // full Q
      sm90::mbar_init(bars + 8 * (4 * S + 2 + b), 8);  // Q consumed
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();
  const int wg = int(threadIdx.x / 128);
  if (wg == 0) {
    sm90::setmaxnreg_dec<kProducerRegs>();
    produce<D, KT, S>(prm, sQ);
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    consume<D, S, kOverlap>(prm, wg - 1, sQ);
  }
  pdl_launch_dependents();
#endif
}

}  // namespace prefill_sm90

template <int D, KvDtype KT>
void launch_prefill_sm90_kernel(const LaunchCfg& cfg, const PrefillSm90Params& prm, bool overlap) {
  KILN_CHECK(cfg.smem == prefill_sm90::smem_bytes<D>(), "prefill v4: shared memory of ", cfg.smem,
             " bytes, not ", prefill_sm90::smem_bytes<D>());
  if (overlap)
    launch(cfg, prefill_sm90::prefill_sm90_kernel<D, KT, true>, prm);
  else
    launch(cfg, prefill_sm90::prefill_sm90_kernel<D, KT, false>, prm);
}

template <int D, KvDtype KT>
int prefill_sm90_binary_version() {
  return kernel_binary_version(reinterpret_cast<const void*>(prefill_sm90::prefill_sm90_kernel<D, KT, true>));
}

}  // namespace kiln::cuda
