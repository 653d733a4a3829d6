// Prefill v4's producer warpgroup (see the mapping comment of attention_prefill_sm90_wgmma_kernel.cuh): each
// work item's Q into one of two Q buffers, then its key tiles through the K and V stages, by TMA or gathered
// through the page table (fp8 widened to bf16).
#pragma once

#include "ops/cuda/attention_prefill_sm90_wgmma_schedule.cuh"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace prefill_sm90 {

#ifdef KILN_SM90A

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// One bf16 row of D elements from src (zeros where !in) into swizzled shared memory: chunk cc (8 elements)
// at chunk_addr(cc), 4 16-byte loads in flight (the producer's 64 registers). Not fenced.
template <int D, typename ChunkAddr>
__device__ __forceinline__ void copy_row_bf16(const uint4* src, bool in, const ChunkAddr& chunk_addr) {
  constexpr int kGroup = 4;
#pragma unroll
  for (int g = 0; g < D / 8; g += kGroup) {
    uint4 v[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) v[u] = in ? __ldg(src + g + u) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kGroup; ++u) st_shared_v4(chunk_addr(g + u), v[u]);
  }
}

// K (kV false) or V rows of key tile j into the swizzled stage buffer at dst, by the 128 producer threads:
// thread t gathers row t (key j kBN + t: one page lookup, then its row's 16-byte chunks, 4-8 loads in flight;
// fp8: 8-byte loads of 8 e4m3, widened exactly with the row's UE8M0 scale of each 64 d), rows at or past
// kv_len zero. Not fenced.
template <int D, KvDtype KT, bool kV>
__device__ __forceinline__ void load_tile_manual(const PagedAttnParams& p, const Work& w, int hk, int j,
                                                 uint32_t dst) {
  static_assert(kBN == 128, "one row per producer thread");
  constexpr int kGroup = 8;  // fp8 chunks in flight a thread: one scale block (bf16: copy_row_bf16's 4)
  const int r = int(threadIdx.x % 128), key = j * kBN + r;
  const bool in = key < w.kv_len;
  int64_t off = 0, sc_off = 0;
  if (in) off = kv_row_offset(p, w.b, key, hk, &sc_off);
  const uint32_t row = dst + uint32_t(r) * 128;
  // Chunk cc (8 elements) of the row: column block cc / 8, swizzled position (cc % 8) ^ (r % 8).
  const auto chunk_addr = [&](int cc) {
    return row + uint32_t(cc / 8) * (kBN * 128) + uint32_t(((cc % 8) ^ (r & 7)) << 4);
  };
  if constexpr (KT == KvDtype::bf16) {
    copy_row_bf16<D>(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(kV ? p.v : p.k) + off), in,
                     chunk_addr);
  } else {
    const uint2* src = reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(kV ? p.v : p.k) + off);
    const uint8_t* scales = (kV ? p.v_scale : p.k_scale) + sc_off;
#pragma unroll
    for (int g = 0; g < D / 8; g += kGroup) {
      uint2 raw[kGroup];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) raw[u] = in ? __ldg(src + g + u) : make_uint2(0, 0);
      const float sc = in ? ue8m0_to_f32(scales[g * 8 / 64]) : 1.0f;  // kGroup * 8 = 64 d: one scale
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        float f[8];
        widen_fp8x8(raw[u], sc, f);
        st_shared_v4(chunk_addr(g + u), pack8(f));
      }
    }
  }
}

// Q of item k into Q buffer k % 2 (both consumers' halves, the consumers' layout: [2][D / 64][64 rows]
// [128 B]) once the consumers released the item two before it, completing the buffer's full barrier:
// - use_tma_q: thread 0 issues one box (64 d x G heads x 64 / G tokens) per consumer half and column
//   block; rows past the sequence hold other tokens' or zero-filled q (computed, never stored);
// - otherwise every producer thread waits (each waits every Q phase in order) and gathers packed row t,
//   zero past the sequence's rows.
template <int D>
__device__ __forceinline__ void produce_q(const PrefillSm90Params& prm, const Item& it, int k, uint32_t q_buf,
                                          uint32_t full, uint32_t empty) {
  constexpr uint32_t kHalfBytes = kWgRows * D * 2;
  const PagedAttnParams& p = prm.p;
  const int t = int(threadIdx.x % 128), G = prm.G;
  const uint32_t ph = uint32_t(k >> 1) & 1u;
  if (prm.use_tma_q) {
    if (t != 0) return;
    sm90::mbar_wait(empty, ph ^ 1u);
    sm90::mbar_arrive_expect_tx(full, 2 * kHalfBytes);
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int cb = 0; cb < D / 64; ++cb)
        sm90::tma_load_3d(q_buf + uint32_t(c) * kHalfBytes + uint32_t(cb) * (kWgRows * 128), &prm.tmap_q,
                          cb * 64, it.hk * G, it.w.q0 + (it.w.tile * kBM + c * kWgRows) / G, full);
    return;
  }
  sm90::mbar_wait(empty, ph ^ 1u);
  const int f = it.w.tile * kBM + t, r = t % kWgRows;
  const bool in = f < it.w.q_len * G;
  const uint4* src = reinterpret_cast<const uint4*>(
      static_cast<const uint16_t*>(p.q) +
      (in ? int64_t(it.w.q0 + f / G) * p.q_stride_t + int64_t(it.hk * G + f % G) * p.q_stride_h : 0));
  const uint32_t row = q_buf + uint32_t(t / kWgRows) * kHalfBytes;
  copy_row_bf16<D>(src, in, [&](int cc) {
    return row + uint32_t(cc / 8) * (kWgRows * 128) + sm90::sw128_offset(r, cc % 8);
  });
  sm90::fence_proxy_async();
  sm90::named_bar_sync(1, 128);
  if (t == 0) sm90::mbar_arrive(full);
}

// Key tile j of the item, the block's jt-th tile (stage jt % S, phase (jt / S) & 1): K, then V. TMA tiles:
// thread 0 issues K's boxes and thread vt = prm.v_issue_thread (32, lane 0 of warp 1) V's, each walking every
// tile with its own page lookups and empty-barrier waits, so K of tile j + 1 is not held behind the wait for
// V_j's stage (freed when P V_{j-2} completes, after the consumers' softmax of tile j - 1; K_{j+1}'s stage
// frees when S_{j-1} does, before it). With one thread issuing both, the consumers waited for K tiles (9.5 %
// of their stall samples, ncu); split: prefill 4096 tokens 352 -> 298 µs (bf16, 390 -> 461 TFLOP/s), 8192
// 1,300 -> 1,091 µs (H200, 2026-12-02, `164b2c3`;
// bench/results/h200_decode_cluster_merge_early_combine_2026-12-02.txt).
template <int D, KvDtype KT, int S>
__device__ __forceinline__ void produce_tile(const PrefillSm90Params& prm, const Item& it, int j, int jt,
                                             uint32_t base) {
  constexpr uint32_t kTileBytes = kBN * D * 2;
  const uint32_t sK = base + smem_k_offset<D>(), sV = base + smem_v_offset<D>(),
                 bars = base + smem_bars_offset<D>();
  const PagedAttnParams& p = prm.p;
  const Work& w = it.w;
  const int t = int(threadIdx.x % 128), hk = it.hk;
  // Whether some tiles come by TMA (threads 0 and vt alone; the other producer threads skip them).
  const bool tma_tiles = KT == KvDtype::bf16 && prm.use_tma;
  const int s = jt % S;
  const uint32_t ph = uint32_t(jt / S) & 1u;
  const uint32_t full_k = bars + 8 * s, full_v = bars + 8 * (S + s);
  const uint32_t empty_k = bars + 8 * (2 * S + s), empty_v = bars + 8 * (3 * S + s);
  const uint32_t dk = sK + s * kTileBytes, dv = sV + s * kTileBytes;
  // Uniform over the warpgroup: TMA only for tiles whose every key is inside the context.
  const int vt = prm.v_issue_thread;
  if (tma_tiles && (j + 1) * kBN <= w.kv_len) {
    if (t != 0 && t != vt) return;
    // The tile's page ids first (independent loads, one latency; each of the two threads its own), then
    // thread 0 the boxes of K, thread vt those of V.
    const int ps = p.page_size, n_pages = kBN / ps;
    int pages[kBN / 16];  // page_size >= 16 (prefill_sm90_uses_tma)
#pragma unroll
    for (int pg = 0; pg < kBN / 16; ++pg) pages[pg] = pg < n_pages ? kv_page(p, w.b, j * kBN + pg * ps) : 0;
    // Once the consumers released the stage: one box per page and 64-wide column.
    const auto issue = [&](uint32_t empty, uint32_t full, uint32_t dst, const CUtensorMap* tmap) {
      sm90::mbar_wait(empty, ph ^ 1u);
      sm90::mbar_arrive_expect_tx(full, kTileBytes);
#pragma unroll
      for (int pg = 0; pg < kBN / 16; ++pg)
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
          if (pg < n_pages)
            sm90::tma_load_4d(dst + uint32_t(c * kBN + pg * ps) * 128, tmap, c * 64, prm.rows_dim1 ? 0 : hk,
                              prm.rows_dim1 ? hk : 0, pages[pg], full);
    };
    if (t == 0) issue(empty_k, full_k, dk, &prm.tmap_k);
    if (t == vt) issue(empty_v, full_v, dv, &prm.tmap_v);
  } else if (!tma_tiles) {
    // Every tile gathered: each producer thread waits for every tile's stage itself, so its parity waits
    // follow the empty barriers' phases one by one.
    sm90::mbar_wait(empty_k, ph ^ 1u);
    load_tile_manual<D, KT, false>(p, w, hk, j, dk);
    sm90::fence_proxy_async();
    sm90::named_bar_sync(1, 128);
    if (t == 0) sm90::mbar_arrive(full_k);
    sm90::mbar_wait(empty_v, ph ^ 1u);
    load_tile_manual<D, KT, true>(p, w, hk, j, dv);
    sm90::fence_proxy_async();
    sm90::named_bar_sync(1, 128);
    if (t == 0) sm90::mbar_arrive(full_v);
  } else {
    // A gathered tile after TMA tiles (an item's last tile, reaching past kv_len). The other threads skipped
    // the TMA tiles' empty waits, so they must not wait on the empty barriers themselves: a parity wait
    // cannot tell phase k from k - 2, and theirs would pass as soon as an older use of the stage was
    // released (or at once on a fresh barrier), letting them write rows into a stage that a TMA load or the
    // consumers still own. Thread 0 has waited for every K stage in order and thread vt for every V
    // stage: each waits for its own, then a named barrier hands the stage to the others (bar.sync orders
    // its acquire before their stores).
    if (t == 0) sm90::mbar_wait(empty_k, ph ^ 1u);
    sm90::named_bar_sync(1, 128);
    load_tile_manual<D, KT, false>(p, w, hk, j, dk);
    sm90::fence_proxy_async();
    sm90::named_bar_sync(1, 128);
    if (t == 0) sm90::mbar_arrive(full_k);
    if (t == vt) sm90::mbar_wait(empty_v, ph ^ 1u);
    sm90::named_bar_sync(1, 128);
    load_tile_manual<D, KT, true>(p, w, hk, j, dv);
    sm90::fence_proxy_async();
    sm90::named_bar_sync(1, 128);
    if (t == 0) sm90::mbar_arrive(full_v);
  }
}

// The producer warpgroup: for each of the block's items, its Q, then its key tiles through the stages
// (the tile count runs on across items, so the next item's first tiles load while the consumers finish
// the current one).
template <int D, KvDtype KT, int S>
__device__ __forceinline__ void produce(const PrefillSm90Params& prm, uint32_t base) {
  const uint32_t bars_q = base + smem_bars_offset<D>() + 8 * (4 * S);
  Item it;
  int jt = 0;
  for (int k = 0; block_item(prm, k, it); ++k) {
    produce_q<D>(prm, it, k, base + uint32_t(k & 1) * (kBM * D * 2), bars_q + 8 * (k & 1),
                 bars_q + 8 * (2 + (k & 1)));
    for (int j = 0; j < it.n_tiles; ++j, ++jt) produce_tile<D, KT, S>(prm, it, j, jt, base);
  }
}

#endif  // KILN_SM90A

}  // namespace prefill_sm90
}  // namespace kiln::cuda
