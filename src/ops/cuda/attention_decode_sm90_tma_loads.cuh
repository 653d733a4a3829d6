// Decode attention v3 (attention_decode_sm90_tma.cu): a stage's shared-memory geometry and the copies that
// fill it (TMA boxes per page, cp.async 16-byte pieces, the fp8 scale words), with the page lookups they
// need. Included by attention_decode_sm90_tma.cu only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_decode_sm90_tma_fp8.cuh"  // tile_off, kFp8Tile
#include "ops/cuda/mma.cuh"                            // smem_addr
#include "ops/cuda/sm90.cuh"

namespace kiln::cuda::decode_sm90 {

constexpr int kWarps = 4, kThreads = kWarps * 32;

// Shared-memory geometry of one stage: the K tile, then the V tile, each kHalves column blocks of [kTile
// rows] [128 bytes] (TMA's 128-byte swizzle box: 16-byte piece c of a row at c ^ (row & 7), so an 8-row
// ldmatrix or 8-byte load spreads over all 32 banks); tile_off gives the byte of (row, 16-byte piece of the
// row).
template <int D, KvDtype KT>
struct TileCfg {
  static constexpr bool kFp8 = KT != KvDtype::bf16;
  static constexpr int kTile = kFp8 ? kFp8Tile : kDecodeSm90Tile;  // keys per stage
  static constexpr int kWarpKeys = kTile / kWarps;
  static constexpr int kEsz = KT == KvDtype::bf16 ? 2 : 1;
  static constexpr int kRowBytes = D * kEsz;
  static constexpr int kPieces = kRowBytes / 16;              // per row
  static constexpr int kHalves = kRowBytes / 128;             // 128-byte column blocks
  static constexpr int kCopies = kTile * kPieces / kThreads;  // K (and V) pieces per thread per tile
  static constexpr int kRowStep = kThreads / kPieces;         // rows between a thread's pieces
  static constexpr int kStageBytes = 2 * kTile * kRowBytes;
  // fp8: 2 stages of 128 keys, so 3 blocks share an SM (registers capped at 168 by the launch bounds):
  // measured 854 -> 743 us at B=128 ctx 9216 (H200); bf16 keeps 3 stages and 2 blocks (2 stages: 1156 ->
  // 1212 us), docs/PERF.md.
  static constexpr int kStages = kFp8 ? 2 : kStageBytes >= 32 * 1024 ? 3 : 4;
  static_assert(!kFp8 || D == 128, "fp8: D 128");
  // fp8: per stage and key, the 4-byte word holding its K scales, then the same for V (issue_scales).
  static constexpr int kScaleBytes = kStages * 2 * kTile * 4;
  // Blocks per SM the shared memory allows (227 KB usable), so the register cap matches it.
  static constexpr int kBlocksPerSm = 227 * 1024 / (1024 + kStages * kStageBytes + kScaleBytes + 64);
  static_assert(kPieces >= 8 && kCopies >= 1 && kTile * kPieces % kThreads == 0, "tile geometry");
};

// Device code: Hopper only (TMA, mbarriers: sm_90a).
#ifdef KILN_SM90A
using sm90::fence_proxy_async;
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  sm90::mbar_arrive_expect_tx(smem_addr(bar), bytes);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  sm90::mbar_wait(smem_addr(bar), parity);
}
// Box (c0, c1, c2, c3) of map into smem, completing on bar.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap& map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  sm90::tma_load_4d(smem_addr(dst), &map, c0, c1, c2, c3, smem_addr(bar));
}

// 16-byte global -> shared copy that fills zeros instead when !valid (src is then not read).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t sa = smem_addr(smem);
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(n) : "memory");
}

// Context position -> (page-table index, row in the page) without an integer division when the page size is
// a power of two (16, 32, 64: every engine configuration); other sizes divide.
struct PagePos {
  int size, shift;  // shift >= 0: size == 1 << shift
  __device__ __forceinline__ int index(int t) const { return shift >= 0 ? t >> shift : t / size; }
  __device__ __forceinline__ int row(int t) const { return shift >= 0 ? t & (size - 1) : t % size; }
};

__device__ __forceinline__ PagePos page_pos(int page_size) {
  return {page_size, (page_size & (page_size - 1)) == 0 ? 31 - __clz(page_size) : -1};
}

// Page of context position t of sequence b (clamped, as kv_page).
__device__ __forceinline__ int page_of(const PagedAttnParams& p, const PagePos& pp, int b, int t) {
  return clamp_page(p, p.page_table[int64_t(b) * p.pages_stride + pp.index(t)]);
}

// Issues the cp.async copies of tile [t0, t0 + kTile) of (b, hk) into stage smem (K rows, then V rows);
// rows past t_end are zero-filled. pg: the page of each of this thread's rows (load_pages).
template <int D, KvDtype KT>
__device__ __forceinline__ void issue_tile(const PagedAttnParams& p, const PagePos& pp, int hk, int t0,
                                           int t_end, const int (&pg)[TileCfg<D, KT>::kCopies],
                                           unsigned char* stage) {
  using C = TileCfg<D, KT>;
  const int piece = threadIdx.x % C::kPieces, r0 = threadIdx.x / C::kPieces;
  const unsigned char* kb =
      static_cast<const unsigned char*>(p.k) + (int64_t(hk) * p.s_head * C::kEsz + piece * 16);
  const unsigned char* vb =
      static_cast<const unsigned char*>(p.v) + (int64_t(hk) * p.s_head * C::kEsz + piece * 16);
#pragma unroll
  for (int j = 0; j < C::kCopies; ++j) {
    const int r = r0 + j * C::kRowStep, t = t0 + r;
    const bool valid = t < t_end;
    int64_t sc_unused;  // hk's offset is in kb / vb already
    const int64_t off = valid ? kv_offset(p, pg[j], pp.row(t), 0, &sc_unused) * C::kEsz : 0;
    unsigned char* dk = stage + tile_off<C::kTile>(r, piece);
    cp_async16_zfill(dk, kb + off, valid);
    cp_async16_zfill(dk + C::kTile * C::kRowBytes, vb + off, valid);
  }
}

template <int D, KvDtype KT>
__device__ __forceinline__ void load_pages(const PagedAttnParams& p, const PagePos& pp, int b, int t0,
                                           int t_end, int (&pg)[TileCfg<D, KT>::kCopies]) {
  using C = TileCfg<D, KT>;
  const int r0 = threadIdx.x / C::kPieces;
#pragma unroll
  for (int j = 0; j < C::kCopies; ++j) {
    const int t = t0 + r0 + j * C::kRowStep;
    pg[j] = t < t_end ? page_of(p, pp, b, t) : 0;
  }
}

// TMA path (page sizes 16, 32, 64, so pp.shift >= 0). A tile's producer is one warp (tile n: warp n %
// kWarps, so the page lookups and copy issues of successive tiles fall on different schedulers); lane i
// looks up page i of the tile (0 past the chunk or the tile) ...
template <int kTile>
__device__ __forceinline__ int lane_tile_page(const PagedAttnParams& p, const PagePos& pp, int b, int t0,
                                              int t_end) {
  const int i = threadIdx.x % 32, t = t0 + i * pp.size;
  return i * pp.size < kTile && t < t_end ? page_of(p, pp, b, t) : 0;
}
// ... and, with the whole warp, copies each page's rows of (hk) into the stage as 128-byte swizzled boxes (K
// then V), completing on bar: lane 0 arrives announcing the bytes, lane i issues page i's boxes. Rows of the
// last page past t_end are loaded too (and zeroed later in V).
template <int D, KvDtype KT>
__device__ __forceinline__ void tma_issue_warp(const CUtensorMap& tk, const CUtensorMap& tv, uint64_t* bar,
                                               unsigned char* stage, int hk, int t0, int t_end,
                                               const PagePos& pp, int page) {
  using C = TileCfg<D, KT>;
  constexpr int kTile = C::kTile;
  const int lane = threadIdx.x % 32;
  const int n_pages = min(kTile >> pp.shift, (t_end - t0 + pp.size - 1) >> pp.shift);
  if (lane == 0) mbar_expect_tx(bar, uint32_t(n_pages * C::kHalves * pp.size * 128 * 2));
  __syncwarp();
  if (lane < n_pages) {
#pragma unroll
    for (int h = 0; h < C::kHalves; ++h) {
      unsigned char* dst = stage + h * (kTile * 128) + lane * pp.size * 128;
      tma_load_4d(dst, tk, h * (128 / C::kEsz), 0, hk, page, bar);
      tma_load_4d(dst + kTile * C::kRowBytes, tv, h * (128 / C::kEsz), 0, hk, page, bar);
    }
  }
}
// Zeroes V rows [valid, kTile) of a stage (TMA loaded whole pages: rows past the chunk may hold anything, and
// p = 0 times a NaN would still poison O), then orders the stores before later TMA writes.
template <int D, KvDtype KT>
__device__ __forceinline__ void zero_v_tail(unsigned char* sV, int valid) {
  using C = TileCfg<D, KT>;
  constexpr int kTile = C::kTile;
  const int n = (kTile - valid) * 8;  // 16-byte pieces per column block
  for (int i = threadIdx.x; i < n * C::kHalves; i += kThreads) {
    const int h = i / n, r = valid + (i % n) / 8, c = i % 8;
    *reinterpret_cast<uint4*>(sV + h * (kTile * 128) + r * 128 + c * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
}

// fp8: the K and V scales of key threadIdx.x of the tile at t0 arrive by one 4-byte cp.async each: the
// aligned word holding the key's two bytes (decode_sm90_applies requires even scale strides, so the pair
// never straddles a word; scale_shift says which half). Copied with the K/V tile, so no iteration waits on a
// global load of its own. page: the key's page (page_of, loaded an iteration ahead); past t_end zeros are
// stored.
template <int D, KvDtype KT>
__device__ __forceinline__ void issue_scales(const PagedAttnParams& p, const PagePos& pp, int hk, int t0,
                                             int t_end, int page, uint32_t* stage_sc) {
  using C = TileCfg<D, KT>;
  static_assert(C::kTile == kThreads, "one key per thread");
  const int t = t0 + int(threadIdx.x);
  const bool valid = t < t_end;
  int64_t sc_off = 0;
  if (valid) kv_offset(p, page, pp.row(t), hk, &sc_off);
  const uintptr_t ka = reinterpret_cast<uintptr_t>(p.k_scale + sc_off) & ~uintptr_t(3);
  const uintptr_t va = reinterpret_cast<uintptr_t>(p.v_scale + sc_off) & ~uintptr_t(3);
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(stage_sc + threadIdx.x)),
               "l"(ka), "r"(n)
               : "memory");
  asm volatile(
      "cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(stage_sc + C::kTile + threadIdx.x)),
      "l"(va), "r"(n)
      : "memory");
}
// The page of key threadIdx.x of the tile at t0 (0 past t_end).
__device__ __forceinline__ int key_page(const PagedAttnParams& p, const PagePos& pp, int b, int t0,
                                        int t_end) {
  const int t = t0 + int(threadIdx.x);
  return t < t_end ? page_of(p, pp, b, t) : 0;
}
// The TMA path tracks the scale copies on the stage's mbarrier: each thread's arrival fires once its copies
// have landed (the barrier counts kThreads of them besides the producer's).
__device__ __forceinline__ void scales_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Shift (0 or 16) of the key's scale pair inside its word, for keys of even (c = 0) and odd (c = 1) rows:
// the pair sits at byte (row sc_row + hk sc_head) & 2 of the word (page starts are word aligned; pages have
// an even size, and tiles start at even positions, so a key's row parity is its position's).
__device__ __forceinline__ void scale_shifts(const PagedAttnParams& p, int hk, int (&sh)[2]) {
  const int h = int(int64_t(hk) * p.sc_head & 2);
  sh[0] = 8 * h;
  sh[1] = 8 * (h ^ int(p.sc_row & 2));
}
#endif  // KILN_SM90A

}  // namespace kiln::cuda::decode_sm90
