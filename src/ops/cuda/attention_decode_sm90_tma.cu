// Hopper decode attention (sm_90a; DecodeKernel::v3, the default: ops/cuda/attention.h, README.md here):
// split-KV paged decode on tensor cores, K/V tiles copied by TMA (cp.async for other page sizes).
//
// Mapping. Grid (splits, Hkv, row groups: B, or B x decode_rows_per_seq for a verify step), 4 warps. Block
// (s, hk, z) owns keys [s c, s c + c) of the context of row group z's row(s) (decode_rows)
// (c = decode_chunk(ctx, splits, kTile)) for the G = Hq / Hkv query heads of KV head hk. Keys stream through
// shared memory in kTile = 64-key tiles, kStages deep (cp.async, zero-filled past the chunk, 16-byte pieces
// XOR-swizzled by row so every ldmatrix and 8-byte load is bank-conflict free). Warp w takes keys
// 16 w .. 16 w + 15 of every tile and keeps its own online-softmax state; the 4 warps merge at the end.
//
// Per warp and tile (bf16), with the group's G query heads as the rows of an m16n8k16 MMA (rows >= G zero):
//   S[16 x 16] = Q[16 x D] K^T      D / 16 k-steps x 2 key tiles of 8, K by ldmatrix from shared memory;
//   online softmax in fp32 on S's rows (base-2 exponent, the score scale folded with log2 e);
//   O[16 x D] += P V                P in bf16 as hi + lo (two MMAs, ~16 bits of p), V by ldmatrix.trans.
// The query heads share every K/V byte loaded, and nothing but the MMAs touches each K/V element.
//
// FP8 (E4M3 + one UE8M0 scale per 64 elements): tiles of 128 keys (32 per warp) are copied as bytes (half
// of bf16's traffic) and widened to f16 pair by pair right before their f16 MMAs, with the keys as the MMA
// rows and the query heads as its columns (attention_decode_sm90_tma_fp8.cuh).
//
// Loads (TMA path): tile n's page lookups and copies are issued by warp n % 4 (lane i: page i, looked up
// 4 tiles ahead), so they do not all fall on one scheduler. The first row's prologue tiles that hold only
// keys written by earlier steps are issued before the PDL wait (issue_before_wait): launched early, their
// page lookups and copies overlap attn_prep, which writes this step's rows.
//
// Numerics: bf16 products exact (bf16 x bf16 in fp32), fp32 accumulation in the tensor cores, p = 2^(s log2e
// - m) with ex2.approx, P rounded as hi + lo bf16: within the attention tolerance (docs/NUMERICS.md) and 1
// bf16 ulp of the prefill kernel on the same rows; fp8 the same (attention_decode_sm90_tma_fp8.cuh).
#include <algorithm>
#include <type_traits>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_decode_sm90_tma_fp8.cuh"
#include "ops/cuda/attention_decode_sm90_tma_loads.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/tensor_map.h"

#if defined(__CUDA_ARCH__) && !defined(KILN_SM90A)
#pragma nv_diag_suppress 177  // a non-sm_90a device pass compiles no v3 device code: its constants go unused
#endif

namespace kiln::cuda {
namespace {

using namespace decode_sm90;  // the tile geometry and copies (attention_decode_sm90_tma_loads.cuh), the fp8
                              // math
constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;

// The device code is Hopper code (TMA, mbarriers: sm_90a); elsewhere the kernel has an empty body and
// decode_sm90_applies() is false, so v2 runs.
#ifdef KILN_SM90A
// Q of the group as m16n8k16 A fragments (bf16 caches), rows = heads (>= G: zero), one entry per k-step
// (head_dim 16 s .. 16 s + 15): qa[s][0] holds row g's k-slots (2t, 2t + 1), qa[s][1] slots (2t + 8, 2t + 9)
// (the other two A registers, rows 8..15, are zero).
template <int D, int G>
__device__ __forceinline__ void load_q_frags(const uint16_t* q, uint32_t (&qa)[D / 16][2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    qa[s][0] = g < G ? *reinterpret_cast<const uint32_t*>(q + 16 * s + 2 * t) : 0u;
    qa[s][1] = g < G ? *reinterpret_cast<const uint32_t*>(q + 16 * s + 8 + 2 * t) : 0u;
  }
}

// S = Q K^T for this warp's 16 keys of a bf16 tile (rows of sK 16 w ..): acc[n][*] is key tile n (keys
// 16 w + 8 n ..), c0 and c1 at keys 2t, 2t + 1 of it for head g.
template <int D>
__device__ __forceinline__ void scores(const unsigned char* sK, const uint32_t (&qa)[D / 16][2],
                                       float (&acc)[2][4]) {
  constexpr int kTile = TileCfg<D, KvDtype::bf16>::kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[n][c] = 0.0f;
  // ldmatrix x4 per k-step: matrices (keys 0-7, d lo), (keys 0-7, d hi), (keys 8-15, d lo), (keys 8-15, d
  // hi).
  const int m = lane / 8, r = 16 * warp + (m / 2) * 8 + lane % 8;
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    uint32_t kb[4];
    ldmatrix_x4(kb, smem_addr(sK + tile_off<kTile>(r, 2 * s + m % 2)));
    const uint32_t a[4] = {qa[s][0], 0u, qa[s][1], 0u};
    mma_bf16(acc[0], a, kb[0], kb[1]);
    mma_bf16(acc[1], a, kb[2], kb[3]);
  }
}

// O += P V for this warp's 16 keys of a bf16 tile; pa: P as bf16 A fragments, [0] hi and [1] lo. o[j]: n-tile
// j of O, head_dim 8 j .. 8 j + 7 (c0 and c1 at 8 j + 2t, + 1).
template <int D>
__device__ __forceinline__ void accumulate_pv(const unsigned char* sV, const uint32_t (&pa)[2][4],
                                              float (&o)[D / 8][4]) {
  constexpr int kTile = TileCfg<D, KvDtype::bf16>::kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, m = lane / 8;
  // ldmatrix.trans x4: matrices (keys 0-7, piece lo), (keys 8-15, piece lo), (keys 0-7, piece hi), (keys
  // 8-15, hi).
  const int r = 16 * warp + (m % 2) * 8 + lane % 8;
#pragma unroll
  for (int pr = 0; pr < D / 16; ++pr) {  // head_dim 16 pr .. 16 pr + 15: n-tiles 2 pr, 2 pr + 1
    uint32_t vb[4];
    ldmatrix_x4_trans(vb, smem_addr(sV + tile_off<kTile>(r, 2 * pr + m / 2)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mma_bf16(o[2 * pr], pa[h], vb[0], vb[1]);
      mma_bf16(o[2 * pr + 1], pa[h], vb[2], vb[3]);
    }
  }
}

// This block's keys [t_begin, t_end) of a row with context ctx, in n_tiles tiles; false when the split
// starts past the context (uniform over the block).
template <int kTile>
__device__ __forceinline__ bool row_window(int ctx, int splits, int& t_begin, int& t_end, int& n_tiles) {
  const int chunk = decode_chunk(ctx, splits, kTile);
  t_begin = int(blockIdx.x) * chunk;
  t_end = min(ctx, t_begin + chunk);
  n_tiles = (t_end - t_begin + kTile - 1) / kTile;
  return t_begin < ctx;
}

// Prologue tiles i0 .. i1 - 1 (i1 <= kStages - 1) of a row: each tile's K/V copies (and fp8 scale words)
// issued into stage (seq + i) % kStages; cp.async: one commit group per tile, issued or not.
template <int D, KvDtype KT, bool kTma>
__device__ __forceinline__ void issue_prologue(const PagedAttnParams& p, const CUtensorMap& tk,
                                               const CUtensorMap& tv, uint64_t* bars, int b, int t_begin,
                                               int t_end, int n_tiles, int seq, int i0, int i1,
                                               unsigned char* smem, uint32_t* smem_sc) {
  using C = TileCfg<D, KT>;
  constexpr int kTile = C::kTile;
  const int hk = blockIdx.y, warp = threadIdx.x / 32;
  const PagePos pp = page_pos(p.page_size);
#pragma unroll
  for (int i = 0; i < C::kStages - 1; ++i) {
    if (i < i0 || i >= i1) continue;
    const int t0 = t_begin + i * kTile, st = (seq + i) % C::kStages;
    if (i < n_tiles) {
      if constexpr (kTma) {
        if (warp == i % kWarps)
          tma_issue_warp<D, KT>(tk, tv, &bars[st], smem + st * C::kStageBytes, hk, t0, t_end, pp,
                                lane_tile_page<kTile>(p, pp, b, t0, t_end));
      } else {
        int pg[C::kCopies];
        load_pages<D, KT>(p, pp, b, t0, t_end, pg);
        issue_tile<D, KT>(p, pp, hk, t0, t_end, pg, smem + st * C::kStageBytes);
      }
      if constexpr (C::kFp8) {
        issue_scales<D, KT>(p, pp, hk, t0, t_end, key_page(p, pp, b, t0, t_end), smem_sc + st * 2 * kTile);
        if constexpr (kTma) scales_arrive(&bars[st]);
      }
    }
    if constexpr (!kTma) cp_async_commit();
  }
}

// Before the PDL wait: the first row's prologue tiles whose keys all precede position `written` (the first
// K/V row this launch's predecessor may still be writing: earlier steps wrote the rest, and the page table
// and lengths were uploaded before the graph). Returns how many were issued, a prefix of the prologue.
// With a launch early (PDL), their page lookups and copies overlap the predecessor's run.
template <int D, KvDtype KT, bool kTma>
__device__ __forceinline__ int issue_before_wait(const PagedAttnParams& p, const CUtensorMap& tk,
                                                 const CUtensorMap& tv, uint64_t* bars, int splits, int b,
                                                 int ctx, int written, unsigned char* smem,
                                                 uint32_t* smem_sc) {
  using C = TileCfg<D, KT>;
  int t_begin, t_end, n_tiles;
  if (!row_window<C::kTile>(ctx, splits, t_begin, t_end, n_tiles)) return 0;
  int n = 0;
  while (n < C::kStages - 1 && n < n_tiles && min(t_begin + (n + 1) * C::kTile, t_end) <= written) ++n;
  if (n > 0) issue_prologue<D, KT, kTma>(p, tk, tv, bars, b, t_begin, t_end, n_tiles, 0, 0, n, smem, smem_sc);
  return n;
}

// One query row of sequence b (context ctx) over this block's chunk, then the merge of the 4 warps.
// kTma: K/V pages arrive by TMA (tk, tv, one mbarrier per stage in bars); else by cp.async. seq: tiles this
// block streamed before this row (the stage and mbarrier phase of tile it are (seq + it) % kStages and
// ((seq + it) / kStages) & 1); advanced by this row's tiles. issued: the prologue tiles issue_before_wait
// already issued (the first row only).
template <int D, int G, KvDtype KT, bool kTma>
__device__ __forceinline__ void decode_sm90_row(const PagedAttnParams& p, const CUtensorMap& tk,
                                                const CUtensorMap& tv, uint64_t* bars, float* ws, int splits,
                                                int b, int row, int ctx, unsigned char* smem,
                                                uint32_t* smem_sc, int& seq, int issued) {
  using C = TileCfg<D, KT>;
  constexpr int kTile = C::kTile, kNt = C::kWarpKeys / 8;  // a warp's 8-key score tiles
  const int split = blockIdx.x, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int t_begin, t_end, n_tiles;
  if (!row_window<kTile>(ctx, splits, t_begin, t_end, n_tiles)) return;
  const int chunk = decode_chunk(ctx, splits, kTile);

  // Prologue: tiles 0 .. kStages - 2 in flight, the pages of the next one loaded.
  const PagePos pp = page_pos(p.page_size);
  int pg[kTma ? 1 : C::kCopies];
  // kTma: this lane's page (lane_tile_page) of the next tile its warp issues; tile n is issued by warp n %
  // kWarps.
  int tpg = 0;
  int spg = 0;  // fp8: the page of this thread's key in the next tile whose scales are issued
  if constexpr (kTma) {
    fence_proxy_async();  // the previous row's merge scratch (generic writes) before this row's TMA writes
    __syncthreads();
  }
  issue_prologue<D, KT, kTma>(p, tk, tv, bars, b, t_begin, t_end, n_tiles, seq, issued, C::kStages - 1, smem,
                              smem_sc);
  if constexpr (kTma) {
    // The first tile each warp issues in the loop: the first n >= kStages - 1 with n % kWarps == warp.
    const int first = C::kStages - 1 + (warp - (C::kStages - 1) % kWarps + kWarps) % kWarps;
    if (first < n_tiles) tpg = lane_tile_page<kTile>(p, pp, b, t_begin + first * kTile, t_end);
  } else {
    load_pages<D, KT>(p, pp, b, t_begin + (C::kStages - 1) * kTile, t_end, pg);
  }
  if constexpr (C::kFp8) spg = key_page(p, pp, b, t_begin + (C::kStages - 1) * kTile, t_end);
  int sh = 0;  // fp8: the shift of this lane's scale pairs (its keys have the row parity of g)
  if constexpr (C::kFp8) {
    int shifts[2];
    scale_shifts(p, hk, shifts);
    sh = shifts[g & 1];
  }

  const float scale2 = p.scale * kLog2e;
  const uint16_t* qgroup =
      static_cast<const uint16_t*>(p.q) + int64_t(row) * p.q_stride_t + int64_t(hk * G) * p.q_stride_h;
  // bf16: Q as A fragments (rows = heads g), m / l / O of head g: o[j][c] at head_dim 8 j + 2 t + c (c < 2;
  // c 2-3 are rows 8-15, zero). fp8: the transposed mapping's state (attention_decode_sm90_tma_fp8.cuh).
  uint32_t qa[C::kFp8 ? 1 : D / 16][2];
  float m = kNegInf, l = 0.0f;
  float o[C::kFp8 ? 1 : D / 8][4];
  std::conditional_t<C::kFp8, Fp8Row<D, G>, NoFp8Row> fp8;
  if constexpr (C::kFp8) {
    fp8.init(qgroup, p.q_stride_h);
  } else {
    load_q_frags<D, G>(qgroup + int64_t(g) * p.q_stride_h, qa);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[j][c] = 0.0f;
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = (seq + it) % C::kStages, nxt = it + C::kStages - 1,
              nxt_stage = (seq + nxt) % C::kStages;
    if constexpr (kTma) {
      mbar_wait(&bars[stage], uint32_t((seq + it) / C::kStages) & 1u);
      const int valid = t_end - (t_begin + it * kTile);
      if (valid < kTile) zero_v_tail<D, KT>(smem + stage * C::kStageBytes + kTile * C::kRowBytes, valid);
    } else {
      cp_async_wait<C::kStages - 2>();
    }
    __syncthreads();  // tile it has landed for every thread; every warp is done with tile it - 1's stage
    if (nxt < n_tiles) {
      const int t0 = t_begin + nxt * kTile;
      if constexpr (kTma) {
        if (warp == nxt % kWarps) {
          tma_issue_warp<D, KT>(tk, tv, &bars[nxt_stage], smem + nxt_stage * C::kStageBytes, hk, t0, t_end,
                                pp, tpg);
          if (nxt + kWarps < n_tiles) tpg = lane_tile_page<kTile>(p, pp, b, t0 + kWarps * kTile, t_end);
        }
      } else {
        issue_tile<D, KT>(p, pp, hk, t0, t_end, pg, smem + nxt_stage * C::kStageBytes);
        if (nxt + 1 < n_tiles) load_pages<D, KT>(p, pp, b, t0 + kTile, t_end, pg);
      }
      if constexpr (C::kFp8) {
        issue_scales<D, KT>(p, pp, hk, t0, t_end, spg, smem_sc + nxt_stage * 2 * kTile);
        if constexpr (kTma) scales_arrive(&bars[nxt_stage]);
        if (nxt + 1 < n_tiles) spg = key_page(p, pp, b, t0 + kTile, t_end);
      }
    }
    if constexpr (!kTma) cp_async_commit();

    const unsigned char* sK = smem + stage * C::kStageBytes;
    if constexpr (C::kFp8) {
      const int key0 = t_begin + it * kTile + C::kWarpKeys * warp;
      fp8.tile(sK, smem_sc + stage * 2 * kTile, sh, scale2, key0, t_end, key0 + C::kWarpKeys > t_end);
    } else {
      float s[kNt][4];
      scores<D>(sK, qa, s);
      // Mask keys past the chunk, scale to base 2, and update the running max of row g over the quad.
      const int key0 = t_begin + it * kTile + C::kWarpKeys * warp;
      float mt = kNegInf;
      const bool partial = key0 + C::kWarpKeys > t_end;  // uniform over the warp: only the chunk's last tile
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[n][c] = !partial || key0 + 8 * n + 2 * t + c < t_end ? s[n][c] * scale2 : kNegInf;
          mt = fmaxf(mt, s[n][c]);
        }
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      const float m_new = fmaxf(m, mt);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // a warp with no key yet keeps p = 0
      const float corr = exp2f(m - m_use);
      m = m_new;
      l *= corr;
      float p_[kNt][2];  // this lane's p of keys 8 n + 2 t + c
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) l += (p_[n][c] = exp2f(s[n][c] - m_use));
      // A fragments of P: registers 0 (keys 2t, 2t + 1) and 2 (keys 8 + 2t, 9 + 2t); 1 and 3 (rows 8-15)
      // zero; [0] the bf16 rounding of p, [1] the rest.
      uint32_t pa[2][4] = {};
#pragma unroll
      for (int j = 0; j < D / 8; ++j) o[j][0] *= corr, o[j][1] *= corr;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint32_t hi = pack_bf16x2(p_[n][0], p_[n][1]);
        const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
        pa[0][2 * n] = hi;
        pa[1][2 * n] = pack_bf16x2(p_[n][0] - h0, p_[n][1] - h1);
      }
      accumulate_pv<D>(sK + kTile * C::kRowBytes, pa, o);
    }
  }
  seq += n_tiles;
  if constexpr (!kTma) cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: reuse them as the merge scratch

  float* sm_m = reinterpret_cast<float*>(smem);  // [kWarps][G]
  float* sm_l = sm_m + kWarps * G;               // [kWarps][G]
  float* sm_o = sm_l + kWarps * G;               // [kWarps][G][D]
  if constexpr (C::kFp8) {
    fp8.to_scratch(sm_m, sm_l, sm_o);
  } else {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < G) {
      if (t == 0) sm_m[warp * G + g] = m, sm_l[warp * G + g] = l;
      float* dst = sm_o + (warp * G + g) * D;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + 2 * t) = make_float2(o[j][0], o[j][1]);
    }
  }
  __syncthreads();
  const int n_active = (ctx + chunk - 1) / chunk;
  for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int gg = idx / D, d = idx % D;
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w * G + gg]);
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm_m[w * G + gg];
      if (mw != kNegInf) {
        const float c = exp2f(mw - M);
        L = fmaf(sm_l[w * G + gg], c, L);
        O = fmaf(sm_o[(w * G + gg) * D + d], c, O);
      }
    }
    const int h = hk * G + gg;
    if (n_active == 1) {
      static_cast<uint16_t*>(p.out)[int64_t(row) * p.o_stride_t + int64_t(h) * p.o_stride_h + d] =
          uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
    } else {
      // The combine's format (attention_decode_combine.cu): o / l, then the max in natural-log units and l.
      const int64_t part = (int64_t(decode_ws_slot(p, int(blockIdx.z), row)) * p.Hq + h) * splits + split;
      ws[part * D + d] = __fdiv_rn(O, L);
      if (d == 0) {
        float* ml = ws + decode_row_groups(p) * p.Hq * splits * D;
        ml[2 * part] = M * 0.6931471805599453f;
        ml[2 * part + 1] = L;
      }
    }
  }
  __syncthreads();  // the scratch may be reused by the next row
}

#endif  // KILN_SM90A

// Dynamic shared memory: 1024-byte aligned stages (TMA's swizzle needs it), then the fp8 scale tables.
// The register cap matches the blocks per SM the shared memory allows.
template <int D, int G, KvDtype KT, bool kTma>
__global__ void __launch_bounds__(kThreads, TileCfg<D, KT>::kBlocksPerSm)
    decode_sm90_kernel(const __grid_constant__ PagedAttnParams p, const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv, float* ws, int splits, bool all_rows) {
#ifdef KILN_SM90A
  using C = TileCfg<D, KT>;
  extern __shared__ uint4 smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint32_t* smem_sc = reinterpret_cast<uint32_t*>(smem + C::kStages * C::kStageBytes);
  __shared__ uint64_t bars[C::kStages];
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      // The producer's arrival (with the TMA bytes), and for fp8 every thread's scale copies.
      for (int i = 0; i < C::kStages; ++i) sm90::mbar_init(smem_addr(&bars[i]), C::kFp8 ? 1 + kThreads : 1);
      sm90::mbar_init_fence();
    }
    __syncthreads();
  }
  int seq = 0, issued = 0;
  DecodeRows r;
  const bool rows = decode_rows(p, blockIdx.z, all_rows, &r);
  if (rows)
    issued = issue_before_wait<D, KT, kTma>(p, tk, tv, bars, splits, r.b, r.ctx0, r.written, smem, smem_sc);
  pdl_wait();
  // With splits the dependent is the combine: let its blocks launch and read the row metadata as soon as
  // every block of this grid has started (its wait still holds it until this grid is done), rather than
  // after the last block's end. B = 1: 10.94 -> 10.72 us (graph, bf16 ctx 1024), the 4B step 3.06 -> 3.00
  // ms (H200, 2026-12-02, `aacdc54`; bench/results/h200_decode_cluster_merge_early_combine_2026-12-02.txt).
  // One split: the next projection's GEMV, kept at the end.
  if (splits > 1) pdl_launch_dependents();
  if (rows) {
    for (int i = 0; i < r.n; ++i)
      decode_sm90_row<D, G, KT, kTma>(p, tk, tv, bars, ws, splits, r.b, r.row0 + i, r.ctx0 + i, smem, smem_sc,
                                      seq, i == 0 ? issued : 0);
  }
  // With splits the trigger came right after the wait (above).
  if (splits <= 1) pdl_launch_dependents();
#endif  // KILN_SM90A
}

// Whether K/V pages can arrive by TMA: one 128-byte-swizzled box per (page, 128 bytes of the row) needs page
// sizes that tile the 64-key stage (16, 32, 64; rows 16-byte aligned, which decode_sm90_applies requires).
bool tma_applies(const PagedAttnParams& p) {
  return p.page_size == 16 || p.page_size == 32 || p.page_size == 64;
}

// The 4-D view (d, row in page, kv head, page) of a cache, boxes of 128 bytes x page_size rows. L2 fetches
// of 128 bytes, the box's row: with the default 256-byte promotion each bf16 box row also pulled in the other
// half of its 256-byte K/V row, which another box reads later; the L2 then served 25 % more sectors than the
// tile bytes, the extra crossing between its two halves (ncu), and B = 128 at ctx 9216 ran at 1,133 µs bf16
// / 603 fp8 against 1,056 / 576 with 128 (fp8 not profiled; H200, 2026-12-02,
// `8fe5dd7`; bench/results/h200_decode_l2_promotion_2026-12-02.txt).
CUtensorMap cache_map(const PagedAttnParams& p, const void* base) {
  const bool bf16 = p.kv_dtype == KvDtype::bf16;
  const uint64_t esz = bf16 ? 2 : 1;
  const uint64_t dims[4] = {uint64_t(p.D), uint64_t(p.page_size), uint64_t(p.Hkv), uint64_t(p.num_pages)};
  const uint64_t strides[3] = {uint64_t(p.s_row) * esz, uint64_t(p.s_head) * esz, uint64_t(p.s_page) * esz};
  const uint32_t box[4] = {uint32_t(128 / esz), uint32_t(p.page_size), 1, 1};
  return encode_tiled_map(bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, base,
                          dims, strides, box, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
}

template <int D, int G, KvDtype KT, bool kTma>
void launch_gt(const PagedAttnParams& p, float* ws, int splits, bool all_rows, cudaStream_t stream,
               bool pdl) {
  using C = TileCfg<D, KT>;
  constexpr size_t kSmem = 1024 + size_t(C::kStages) * C::kStageBytes + C::kScaleBytes;
  static_assert(kSmem >= sizeof(float) * (2 * kWarps * G + kWarps * G * D), "merge scratch fits the stages");
  // pdl: an early launch (attention.cu: decode_launches_early: a grid of one wave at most 2 blocks an SM)
  // asks for 80 KB of shared memory a block so that no SM takes 3 (fp8 fits 3): launched
  // while attn_prep still runs, fp8 grids with 3 an SM allowed made the 4B step at batch 8, ctx 8192, 2.4 %
  // slower than a plain launch; held to 2 an SM they made it 2.2 % faster (H200, 2026-12-03, `7a2a4c0`;
  // bench/results/h200_decode_early_launch_2026-12-03.txt).
  constexpr size_t kSmemEarly = std::max<size_t>(kSmem, 80 * 1024);
  static const bool attr_set = [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<D, G, KT, kTma>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemEarly)));
    return true;
  }();
  CUtensorMap tk{}, tv{};
  if constexpr (kTma) tk = cache_map(p, p.k), tv = cache_map(p, p.v);
  const LaunchCfg cfg{.grid = dim3(unsigned(splits), unsigned(p.Hkv), unsigned(decode_row_groups(p))),
                      .block = dim3(kThreads),
                      .smem = pdl ? kSmemEarly : kSmem,
                      .stream = stream,
                      .pdl = pdl,
                      .smem_attr_set = attr_set};
  launch(cfg, decode_sm90_kernel<D, G, KT, kTma>, p, tk, tv, ws, splits, all_rows);
}

// TMA or cp.async loads, by page size.
template <int D, int G, KvDtype KT>
void launch_g(const PagedAttnParams& p, float* ws, int splits, bool all_rows, cudaStream_t stream, bool pdl) {
  if (tma_applies(p))
    launch_gt<D, G, KT, true>(p, ws, splits, all_rows, stream, pdl);
  else
    launch_gt<D, G, KT, false>(p, ws, splits, all_rows, stream, pdl);
}

template <int D, KvDtype KT>
void launch_typed(const PagedAttnParams& p, float* ws, int splits, bool all_rows, cudaStream_t stream,
                  bool pdl) {
  switch (p.Hq / p.Hkv) {
    case 1:
      return launch_g<D, 1, KT>(p, ws, splits, all_rows, stream, pdl);
    case 2:
      return launch_g<D, 2, KT>(p, ws, splits, all_rows, stream, pdl);
    case 3:
      return launch_g<D, 3, KT>(p, ws, splits, all_rows, stream, pdl);
    case 4:
      return launch_g<D, 4, KT>(p, ws, splits, all_rows, stream, pdl);
    case 5:
      return launch_g<D, 5, KT>(p, ws, splits, all_rows, stream, pdl);
    case 6:
      return launch_g<D, 6, KT>(p, ws, splits, all_rows, stream, pdl);
    case 8:
      return launch_g<D, 8, KT>(p, ws, splits, all_rows, stream, pdl);
    default:
      KILN_FAIL("paged decode attention v3: unsupported GQA group size ", p.Hq / p.Hkv, " (1-6, 8)");
  }
}

}  // namespace

namespace {

// Whether the current device is sm_90 and runs this build's sm_90a code of the kernel (a build without
// sm_90a, or another GPU, runs v2). Checked once per device.
bool device_runs_decode_sm90() {
  static PerDeviceFlag flag;
  return flag.get([] {
    return current_device_is_sm90() && kernel_binary_version(reinterpret_cast<const void*>(
                                           decode_sm90_kernel<128, 4, KvDtype::bf16, true>)) == 90;
  });
}

}  // namespace

bool decode_sm90_applies(const PagedAttnParams& p) {
  const int esz = p.kv_dtype == KvDtype::bf16 ? 2 : 1;
  // 16-byte pieces of >= 8 per row (bf16: D 64, 128; fp8: D 128), every row start 16-byte aligned.
  const bool aligned = (p.s_page * esz) % 16 == 0 && (p.s_row * esz) % 16 == 0 && (p.s_head * esz) % 16 == 0;
  // fp8: scale pairs inside aligned words at a parity issue_scales can tell (scale_shifts).
  const bool words =
      p.kv_dtype == KvDtype::bf16 ||
      (p.page_size % 2 == 0 && p.sc_page % 4 == 0 && p.sc_row % 2 == 0 && p.sc_head % 2 == 0 &&
       (reinterpret_cast<uintptr_t>(p.k_scale) | reinterpret_cast<uintptr_t>(p.v_scale)) % 4 == 0);
  return aligned && words && p.Hq / p.Hkv <= 8 &&
         (p.D == 128 || (p.D == 64 && p.kv_dtype == KvDtype::bf16)) && device_runs_decode_sm90();
}

int decode_sm90_blocks_per_sm(const PagedAttnParams& p) {
  if (p.D == 64) return TileCfg<64, KvDtype::bf16>::kBlocksPerSm;
  return p.kv_dtype == KvDtype::bf16 ? TileCfg<128, KvDtype::bf16>::kBlocksPerSm
                                     : TileCfg<128, KvDtype::f8e4m3>::kBlocksPerSm;
}

void launch_decode_sm90(const PagedAttnParams& p, float* ws, int splits, bool all_rows, cudaStream_t stream,
                        bool pdl) {
  KILN_CHECK(decode_sm90_applies(p), "paged decode attention v3: unsupported shape (D ", p.D, ")");
  if (p.D == 64) return launch_typed<64, KvDtype::bf16>(p, ws, splits, all_rows, stream, pdl);
  if (p.kv_dtype == KvDtype::bf16)
    return launch_typed<128, KvDtype::bf16>(p, ws, splits, all_rows, stream, pdl);
  launch_typed<128, KvDtype::f8e4m3>(p, ws, splits, all_rows, stream, pdl);
}

}  // namespace kiln::cuda
