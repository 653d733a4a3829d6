// Portable split-KV paged decode attention on CUDA cores (any sm_80+ GPU; one query row per sequence), in
// two versions (ops/cuda/attention.h, DecodeKernel): v1 walks a host-sized chunk with one dependent
// page-table -> K/V load per key; v2 sizes the chunk from the row's context and streams it through shared
// memory. The split combine of every version is in attention_decode_combine.cu.
#include "ops/cuda/attention_decode_row.cuh"

namespace kiln::cuda {
namespace {

using namespace portable_decode;  // NOLINT: the per-key helpers these kernels share with attention_tree.cu

// v1: grid (splits, Hkv, B); block 4 warps. Warp w handles keys t_begin + (step * 4 + w) * TPW + slot of
// the host-sized chunk, loading each key's K/V through the page table; splits == 1 writes bf16 out.
template <int D, int G, KvDtype KT>
__device__ __forceinline__ void decode_row(const PagedAttnParams& p, float* ws, int splits, int chunk, int b,
                                           int row, int ctx) {
  constexpr int LPT = D / 8, TPW = 32 / LPT;
  const int split = blockIdx.x, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slot = lane / LPT, sub = lane % LPT;
  const int t_begin = split * chunk, t_end = min(ctx, t_begin + chunk);

  float q[G][8];
  load_q<D, G>(p, row, hk, sub, q);
  SoftmaxState<G> st;
  init_state(st);

  // The trip count is uniform across the warp so every lane takes part in the shuffles.
  for (int t0 = t_begin + warp * TPW; t0 < t_end; t0 += kWarps * TPW) {
    const int t = t0 + slot;
    const bool valid = t < t_end;
    float k[8], v[8];
    if (valid) {
      int64_t sc_off;
      const int64_t off = kv_row_offset(p, b, t, hk, &sc_off);
      load_kv8<KT>(p.k, p.k_scale, off, sc_off, sub * 8, k);
      load_kv8<KT>(p.v, p.v_scale, off, sc_off, sub * 8, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) k[j] = v[j] = 0.0f;
    }
    update_key<D, G>(st, q, k, v, valid, p.scale);
  }
  __shared__ float scratch[finish_scratch_floats<D, G>()];
  finish_row<D, G>(p, st, scratch, ws, decode_row_groups(p), splits == 1, split, splits, row,
                   decode_ws_slot(p, int(blockIdx.z), row), hk);
}

// ---- v2 -------------------------------------------------------------------------------------------------

constexpr int kTile = kDecodeV2Tile;  // keys per pipeline stage
// Up to this group size v2 updates the softmax once per tile (4 blocks of 128 threads per SM: <= 128
// registers); wider groups update it per key as v1 does.
constexpr int kTileSoftmaxMaxG = 4;

// Shared-memory tile geometry: a stage holds kTile K rows then kTile V rows of kRowBytes each, copied in
// kChunk-byte pieces (16 bf16; 8 fp8, the cache alignment validate() guarantees for fp8): thread i copies
// piece i % kCpr of rows i / kCpr + j * kRowsPerPass, j < kPasses.
template <int D, KvDtype KT>
struct TileCfg {
  static constexpr int kRowBytes = D * (KT == KvDtype::bf16 ? 2 : 1);
  static constexpr int kChunk = KT == KvDtype::bf16 ? 16 : 8;
  static constexpr int kCpr = kRowBytes / kChunk;
  static constexpr int kRowsPerPass = kWarps * 32 / kCpr;
  static constexpr int kPasses = kTile / kRowsPerPass;
  static constexpr int kScales = KT == KvDtype::bf16 ? 0 : D / 64;  // scale bytes per row (fp8)
  static constexpr int kStageBytes = 2 * kTile * kRowBytes;
  static_assert(kCpr >= 4 && kPasses >= 1 && kTile % kRowsPerPass == 0, "tile geometry");
  static_assert(kScales * kTile <= kWarps * 32, "one scale byte of K and of V per thread at most");
};

// Page ids of the keys this thread copies in the tile starting at key t0 (keys >= t_end: not looked up),
// and of the key whose scale bytes it loads (fp8).
template <int D, KvDtype KT>
struct TilePages {
  int pg[TileCfg<D, KT>::kPasses];
  int pg_sc;
};

template <int D, KvDtype KT>
__device__ __forceinline__ void load_tile_pages(const PagedAttnParams& p, int b, int t0, int t_end,
                                                TilePages<D, KT>& tp) {
  using C = TileCfg<D, KT>;
  const int r0 = threadIdx.x / C::kCpr;
#pragma unroll
  for (int j = 0; j < C::kPasses; ++j) {
    const int t = t0 + r0 + j * C::kRowsPerPass;
    tp.pg[j] = t < t_end ? kv_page(p, b, t) : 0;
  }
  if constexpr (C::kScales > 0) {
    const int t = t0 + int(threadIdx.x) / C::kScales;
    tp.pg_sc = int(threadIdx.x) < kTile * C::kScales && t < t_end ? kv_page(p, b, t) : 0;
  }
}

// Issues the cp.async copies of the tile's K and V rows into `stage` (rows >= t_end are left as they are
// and never read) and, fp8, loads this thread's K and V scale bytes into sc (stored later: store_scales).
template <int D, KvDtype KT>
__device__ __forceinline__ void issue_tile(const PagedAttnParams& p, int t0, int t_end, int hk,
                                           const TilePages<D, KT>& tp, unsigned char* stage,
                                           uint8_t (&sc)[2]) {
  using C = TileCfg<D, KT>;
  constexpr int kEsz = KT == KvDtype::bf16 ? 2 : 1;
  const int r0 = threadIdx.x / C::kCpr, cc = threadIdx.x % C::kCpr;
#pragma unroll
  for (int j = 0; j < C::kPasses; ++j) {
    const int r = r0 + j * C::kRowsPerPass, t = t0 + r;
    if (t < t_end) {
      int64_t sc_off;
      const int64_t off = kv_offset(p, tp.pg[j], t % p.page_size, hk, &sc_off) * kEsz + cc * C::kChunk;
      unsigned char* dk = stage + r * C::kRowBytes + cc * C::kChunk;
      unsigned char* dv = dk + kTile * C::kRowBytes;
      if constexpr (C::kChunk == 16) {
        cp_async16(dk, static_cast<const unsigned char*>(p.k) + off);
        cp_async16(dv, static_cast<const unsigned char*>(p.v) + off);
      } else {
        cp_async8(dk, static_cast<const unsigned char*>(p.k) + off);
        cp_async8(dv, static_cast<const unsigned char*>(p.v) + off);
      }
    }
  }
  if constexpr (C::kScales > 0) {
    const int r = int(threadIdx.x) / C::kScales, blk = int(threadIdx.x) % C::kScales, t = t0 + r;
    if (int(threadIdx.x) < kTile * C::kScales && t < t_end) {
      int64_t sc_off;
      kv_offset(p, tp.pg_sc, t % p.page_size, hk, &sc_off);
      sc[0] = p.k_scale[sc_off + blk];
      sc[1] = p.v_scale[sc_off + blk];
    }
  }
}

// Publishes the scale bytes issue_tile loaded (fp8) into the stage's scale table [K/V][kTile][kScales].
template <int D, KvDtype KT>
__device__ __forceinline__ void store_scales(uint8_t* stage_sc, const uint8_t (&sc)[2]) {
  using C = TileCfg<D, KT>;
  if constexpr (C::kScales > 0) {
    if (int(threadIdx.x) < kTile * C::kScales) {
      stage_sc[threadIdx.x] = sc[0];
      stage_sc[kTile * C::kScales + threadIdx.x] = sc[1];
    }
  }
}

// This lane's 8 elements of row r of a shared-memory tile (rows of row_bytes; fp8: scales [row][n_sc]),
// widened exactly to fp32; zeros when !valid (the row was never copied and may hold anything).
template <KvDtype KT>
__device__ __forceinline__ void load_row8(const unsigned char* tile, const uint8_t* scales, int r,
                                          int row_bytes, int n_sc, int sub, bool valid, float (&f)[8]) {
  if (!valid) {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = 0.0f;
  } else if constexpr (KT == KvDtype::bf16) {
    unpack8(*reinterpret_cast<const uint4*>(tile + r * row_bytes + sub * 16), f);
  } else {
    widen_fp8x8(*reinterpret_cast<const uint2*>(tile + r * row_bytes + sub * 8),
                ue8m0_to_f32(scales[r * n_sc + sub * 8 / 64]), f);
  }
}

// v2: the keys [split c, split c + c) of the row's context (c = v2_chunk), kTile at a time: while tile i
// is computed from shared memory, tile i + 1's copies are in flight and tile i + 2's page ids are loading.
// Warp w computes keys w * TPW + slot + k * kWarps * TPW of each tile (the per-key math of v1).
template <int D, int G, KvDtype KT>
__device__ __forceinline__ void decode_row_v2(const PagedAttnParams& p, float* ws, int splits, int b, int row,
                                              int ctx, unsigned char* smem, uint8_t* smem_sc) {
  using C = TileCfg<D, KT>;
  constexpr int LPT = D / 8, TPW = 32 / LPT;
  const int split = blockIdx.x, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slot = lane / LPT, sub = lane % LPT;
  const int chunk = decode_chunk(ctx, splits, kTile);
  const int t_begin = split * chunk;
  if (t_begin >= ctx) return;  // uniform over the block: this split has no keys of this row
  const int t_end = min(ctx, t_begin + chunk);
  const int n_tiles = (t_end - t_begin + kTile - 1) / kTile;

  // Prologue: the page ids of tiles 0 and 1 in one round trip, then tile 0's copies.
  TilePages<D, KT> tp0, tp;
  uint8_t sc[2] = {127, 127};
  load_tile_pages<D, KT>(p, b, t_begin, t_end, tp0);
  load_tile_pages<D, KT>(p, b, t_begin + kTile, t_end, tp);  // keys past t_end are not looked up
  issue_tile<D, KT>(p, t_begin, t_end, hk, tp0, smem, sc);
  cp_async_commit();
  store_scales<D, KT>(smem_sc, sc);

  float q[G][8];
  load_q<D, G>(p, row, hk, sub, q);
  SoftmaxState<G> st;
  init_state(st);

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1, t0 = t_begin + it * kTile;
    const bool more = it + 1 < n_tiles;
    if (more) issue_tile<D, KT>(p, t0 + kTile, t_end, hk, tp, smem + (stage ^ 1) * C::kStageBytes, sc);
    cp_async_commit();  // possibly empty: the wait below always leaves exactly the newest group
    if (it + 2 < n_tiles) load_tile_pages<D, KT>(p, b, t0 + 2 * kTile, t_end, tp);
    cp_async_wait<1>();
    __syncthreads();  // tile it (copies of every thread, and its scales) is visible

    const unsigned char* sK = smem + stage * C::kStageBytes;
    const unsigned char* sV = sK + kTile * C::kRowBytes;
    const uint8_t* sSc = smem_sc + stage * 2 * kTile * C::kScales;
    if constexpr (G > kTileSoftmaxMaxG) {
      // Wide groups: v1's per-key update (the tile-wise one would need > 128 registers).
#pragma unroll 1  // unrolled, the compiler hoists every key's loads
      for (int i = 0; i < kTile / (kWarps * TPW); ++i) {
        const int r = (i * kWarps + warp) * TPW + slot;
        const bool valid = t0 + r < t_end;
        float k[8], v[8];
        load_row8<KT>(sK, sSc, r, C::kRowBytes, C::kScales, sub, valid, k);
        load_row8<KT>(sV, sSc + kTile * C::kScales, r, C::kRowBytes, C::kScales, sub, valid, v);
        update_key<D, G>(st, q, k, v, valid, p.scale);
      }
    } else {
      // This lane's kSteps keys of the tile: all scores first, then one running-max update per head for
      // the tile (one rescale of acc instead of one per key), then P V with V re-read from shared memory.
      constexpr int kSteps = kTile / (kWarps * TPW);
      float sc_s[kSteps][G];
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        const int r = (i * kWarps + warp) * TPW + slot;
        float k[8];
        load_row8<KT>(sK, sSc, r, C::kRowBytes, C::kScales, sub, t0 + r < t_end, k);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float s = key_dot<D>(q[g], k);
          sc_s[i][g] = t0 + r < t_end ? s * p.scale : kNegInf;
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float mn = st.m[g];
#pragma unroll
        for (int i = 0; i < kSteps; ++i) mn = fmaxf(mn, sc_s[i][g]);
        if (mn == kNegInf) {  // no key of this lane's slot yet
#pragma unroll
          for (int i = 0; i < kSteps; ++i) sc_s[i][g] = 0.0f;
          continue;
        }
        const float corr = expf(st.m[g] - mn);
        st.l[g] *= corr;
#pragma unroll
        for (int j = 0; j < 8; ++j) st.acc[g][j] *= corr;
        st.m[g] = mn;
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
          sc_s[i][g] = expf(sc_s[i][g] - mn);  // 0 for keys past t_end
          st.l[g] += sc_s[i][g];
        }
      }
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        const int r = (i * kWarps + warp) * TPW + slot;
        float v[8];
        load_row8<KT>(sV, sSc + kTile * C::kScales, r, C::kRowBytes, C::kScales, sub, t0 + r < t_end, v);
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int j = 0; j < 8; ++j) st.acc[g][j] = fmaf(sc_s[i][g], v[j], st.acc[g][j]);
      }
    }
    if (more) store_scales<D, KT>(smem_sc + (stage ^ 1) * 2 * kTile * C::kScales, sc);
    __syncthreads();  // stage `stage` is free for tile it + 2; tile it + 1's scales are published
  }
  const int n_active = (ctx + chunk - 1) / chunk;
  finish_row<D, G>(p, st, reinterpret_cast<float*>(smem), ws, decode_row_groups(p), n_active == 1, split,
                   splits, row, decode_ws_slot(p, int(blockIdx.z), row), hk);
}

// Grid (splits, Hkv, row groups: decode_row_groups); block 4 warps (see decode_row).
template <int D, int G, KvDtype KT>
__global__ void __launch_bounds__(kWarps * 32)
    decode_kernel(const __grid_constant__ PagedAttnParams p, float* ws, int splits, int chunk,
                  bool all_rows) {
  pdl_wait();
  DecodeRows r;
  if (decode_rows(p, blockIdx.z, all_rows, &r)) {
    for (int i = 0; i < r.n; ++i) decode_row<D, G, KT>(p, ws, splits, chunk, r.b, r.row0 + i, r.ctx0 + i);
  }
  pdl_launch_dependents();
}

// Grid (splits, Hkv, row groups); block 4 warps (see decode_row_v2). Shared memory: two K/V stages, reused as
// the merge scratch once a row's keys are done.
template <int D, int G, KvDtype KT>
__global__ void __launch_bounds__(kWarps * 32, G <= kTileSoftmaxMaxG ? 4 : 1)
    decode_kernel_v2(const __grid_constant__ PagedAttnParams p, float* ws, int splits, bool all_rows) {
  using C = TileCfg<D, KT>;
  constexpr int kBytes = 2 * C::kStageBytes > finish_scratch_floats<D, G>() * 4
                             ? 2 * C::kStageBytes
                             : finish_scratch_floats<D, G>() * 4;
  __shared__ alignas(16) unsigned char smem[kBytes];
  __shared__ uint8_t smem_sc[C::kScales > 0 ? 2 * 2 * kTile * C::kScales : 1];  // [stage][K/V][kTile][scales]
  pdl_wait();
  DecodeRows r;
  if (decode_rows(p, blockIdx.z, all_rows, &r)) {
    for (int i = 0; i < r.n; ++i)
      decode_row_v2<D, G, KT>(p, ws, splits, r.b, r.row0 + i, r.ctx0 + i, smem, smem_sc);
  }
  pdl_launch_dependents();
}

template <int D, int G, KvDtype KT>
void launch_decode_g(const LaunchCfg& cfg, const PagedAttnParams& p, float* ws, int splits, int chunk,
                     bool all_rows, DecodeKernel kernel) {
  if (kernel == DecodeKernel::v1) {
    launch(cfg, decode_kernel<D, G, KT>, p, ws, splits, chunk, all_rows);
  } else if (kernel == DecodeKernel::v3) {
    KILN_FAIL("paged decode attention: v3 is launched by launch_decode_sm90");
  } else if constexpr (KT == KvDtype::bf16 || D % 64 == 0) {  // fp8 D 32 is refused before launch
    launch(cfg, decode_kernel_v2<D, G, KT>, p, ws, splits, all_rows);
  }
}

template <int D, KvDtype KT>
void launch_decode_typed(const PagedAttnParams& p, float* ws, int splits, int chunk, bool all_rows,
                         DecodeKernel kernel, cudaStream_t stream, bool pdl) {
  const LaunchCfg cfg{.grid = dim3(unsigned(splits), unsigned(p.Hkv), unsigned(decode_row_groups(p))),
                      .block = dim3(kWarps * 32),
                      .stream = stream,
                      .pdl = pdl};
  KILN_DISPATCH_GROUP(p.Hq / p.Hkv, "paged decode attention",
                      launch_decode_g<D, kG, KT>(cfg, p, ws, splits, chunk, all_rows, kernel);)
}

}  // namespace

void launch_decode(const PagedAttnParams& p, float* ws, int splits, int chunk, bool all_rows,
                   DecodeKernel kernel, cudaStream_t stream, bool pdl) {
  if (kernel == DecodeKernel::v3) return launch_decode_sm90(p, ws, splits, all_rows, stream, pdl);
  KILN_DISPATCH_HEAD_DIM(
      p.D, KILN_DISPATCH_KV_DTYPE(p.kv_dtype, launch_decode_typed<kD, kKT>(p, ws, splits, chunk, all_rows,
                                                                           kernel, stream, pdl);))
}

}  // namespace kiln::cuda
