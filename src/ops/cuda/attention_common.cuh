// Device helpers shared by the paged-attention kernels: KV row loads (bf16 or fp8 + UE8M0 scale),
// page lookup, and the compile-time dispatch of head_dim / group size / cache dtype.
#pragma once

#include <cuda_fp8.h>

#include "ops/cuda/attention.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/vec.cuh"
#include "ops/fp8.h"

namespace kiln::cuda {

// A page id from a table entry, clamped into the pool so a corrupt table can never send a load outside the
// cache.
__device__ __forceinline__ int clamp_page(const PagedAttnParams& p, int page) {
  return page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
}
// Page of context position t of sequence b.
__device__ __forceinline__ int kv_page(const PagedAttnParams& p, int b, int t) {
  return clamp_page(p, p.page_table[int64_t(b) * p.pages_stride + t / p.page_size]);
}

// Element offset of (page, row in the page, kv head hk, d = 0); *sc_off: its scale byte offset (fp8).
__device__ __forceinline__ int64_t kv_offset(const PagedAttnParams& p, int page, int row, int hk,
                                             int64_t* sc_off) {
  *sc_off = int64_t(page) * p.sc_page + int64_t(row) * p.sc_row + int64_t(hk) * p.sc_head;
  return int64_t(page) * p.s_page + int64_t(row) * p.s_row + int64_t(hk) * p.s_head;
}

// Element offset of (context position t, kv head hk, d = 0) for sequence b.
__device__ __forceinline__ int64_t kv_row_offset(const PagedAttnParams& p, int b, int t, int hk,
                                                 int64_t* sc_off) {
  return kv_offset(p, kv_page(p, b, t), t % p.page_size, hk, sc_off);
}

// 8 e4m3 values (raw, little-endian in a uint2) times the power-of-two scale s, widened exactly to fp32.
__device__ __forceinline__ void widen_fp8x8(uint2 raw, float s, float (&f)[8]) {
  const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw h2 =
        __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((w[i / 2] >> (16 * (i % 2))) & 0xffffu), __NV_E4M3);
    const __half2 hv(h2);
    f[2 * i] = __low2float(hv) * s;  // a power-of-two scaling of an e4m3 value: exact
    f[2 * i + 1] = __high2float(hv) * s;
  }
}

// 8 consecutive elements d0 .. d0+7 (d0 % 8 == 0) of a cached row, widened exactly to fp32.
template <KvDtype KT>
__device__ __forceinline__ void load_kv8(const void* base, const uint8_t* scales, int64_t off, int64_t sc_off,
                                         int d0, float (&f)[8]) {
  if constexpr (KT == KvDtype::bf16) {
    unpack8(*reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + off + d0), f);
  } else {
    widen_fp8x8(*reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + off + d0),
                ue8m0_to_f32(scales[sc_off + d0 / 64]), f);
  }
}

// kernel: v1 walks a host-sized chunk (pages_stride * page_size / splits keys) per split; v2 sizes the
// chunk on the device from the row's context and pipelines K/V through shared memory
// (attention_decode_portable.cu). The fewest keys a v2 decode split takes (below it the combine costs more
// than it saves): v2 never runs more than ceil(table reach / kDecodeV2MinChunk) splits with keys.
constexpr int kDecodeV2MinChunk = 64;
constexpr int kDecodeV2Tile = 32;    // v2's keys per pipeline stage; its chunks are multiples of it
constexpr int kDecodeSm90Tile = 64;  // v3's keys per pipeline stage (bf16); its chunks are multiples of it
constexpr int kDecodeSm90TileFp8 = 128;  // the same for fp8 caches (32 keys per warp: the k of an FP8 MMA)

// Inclusive prefix sum of v over the warp's lanes (lane i: v of lanes 0..i); every lane of the warp calls it.
__device__ __forceinline__ int warp_inclusive_sum(int v) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xffffffffu, v, o);
    if (int(threadIdx.x % 32) >= o) v += t;
  }
  return v;
}

// The chunk of keys each split of a v2 / v3 decode row with context ctx takes over `splits` splits: a
// multiple of `tile`, at least kDecodeV2MinChunk; only ceil(ctx / chunk) splits get keys. The decode and
// combine kernels both derive the splits that ran from it.
__device__ __forceinline__ int decode_chunk(int ctx, int splits, int tile) {
  const int per = (ctx + splits - 1) / splits;
  return max(kDecodeV2MinChunk, (per + tile - 1) / tile * tile);
}

// The decode launch's row groups (grid z of the decode kernel, y of the combine, workspace entries): a
// verify launch (decode_rows_per_seq >= 2) has one per (sequence, row index < decode_rows_per_seq), any
// other one per sequence.
__host__ __device__ __forceinline__ int64_t decode_row_groups(const PagedAttnParams& p) {
  return p.decode_rows_per_seq >= 2 ? int64_t(p.B) * p.decode_rows_per_seq : int64_t(p.B);
}

// The workspace entry of query row `row` of row group z: z itself in a verify launch (one row each); else
// the row when T <= B (then every row is a decode row, T of them), else the sequence z (only single-row
// sequences are decoded then, one row each). So the workspace holds decode_row_groups(p) entries
// (paged_attention_workspace_bytes), not T: a prefill step's thousands of rows take none.
__device__ __forceinline__ int decode_ws_slot(const PagedAttnParams& p, int z, int row) {
  return p.decode_rows_per_seq >= 2 || p.T > p.B ? z : row;
}

// What one decode block (row group z) computes: rows row0 .. row0 + n - 1 of sequence b, row i with the
// causal context ctx0 + i; `written`: the first context position this step wrote (attn_prep), every key
// before it was written by earlier steps.
struct DecodeRows {
  int b = 0, row0 = 0, n = 0, ctx0 = 0, written = 0;
};

// The rows of row group z: sequence z's one row when q_len == 1; with all_rows (a launch where T == B, so
// no prefill kernel runs) every row of sequence z, each with its causal context. A verify launch
// (decode_rows_per_seq = R >= 2): row z % R of sequence z / R alone, as a one-row sequence of context
// kv_len - q_len + 1 + z % R, so its arithmetic is the plain decode step's at that length (none past
// q_len). False: nothing to do.
__device__ __forceinline__ bool decode_rows(const PagedAttnParams& p, int z, bool all_rows, DecodeRows* r) {
  const int R = p.decode_rows_per_seq;
  const int b = R >= 2 ? z / R : z;
  const int row0 = p.cu_q[b], q_len = p.cu_q[b + 1] - row0, kv_len = p.kv_lens[b];
  // kv_lens beyond the page table's reach violate the contract: such a sequence is skipped, never read.
  if (q_len < 1 || kv_len < q_len || kv_len > int64_t(p.pages_stride) * p.page_size) return false;
  r->b = b;
  r->written = kv_len - q_len;
  if (R >= 2) {
    const int i = z % R;
    r->row0 = row0 + i, r->n = 1, r->ctx0 = kv_len - q_len + 1 + i;
    return i < q_len;
  }
  r->row0 = row0, r->n = q_len, r->ctx0 = kv_len - q_len + 1;
  return q_len == 1 || all_rows;
}
void launch_decode(const PagedAttnParams& p, float* workspace, int splits, int chunk, bool all_rows,
                   DecodeKernel kernel, cudaStream_t stream, bool pdl);
// v3 (attention_decode_sm90_tma.cu): tensor-core decode; decode_sm90_applies says where it runs (else v2
// runs). The current device's SM count (132 where the query fails).
int sm_count();
bool decode_sm90_applies(const PagedAttnParams& p);
int decode_sm90_blocks_per_sm(const PagedAttnParams& p);  // resident v3 blocks per SM (shared memory bound)
void launch_decode_sm90(const PagedAttnParams& p, float* workspace, int splits, bool all_rows,
                        cudaStream_t stream, bool pdl);
void launch_decode_combine(const PagedAttnParams& p, const float* workspace, int splits, bool all_rows,
                           DecodeKernel kernel, cudaStream_t stream, bool pdl);
// kernel: v1 loads each K/V tile synchronously; v2 (bf16 caches; fp8 runs v1) with cp.async, overlapped;
// v3 as v2 with two query heads of a KV group per block sharing each tile, fp8 too (prefill_v3_applies;
// else v2).
// v4: launch_prefill runs launch_prefill_sm90 first, which returns false (launching nothing) where
// prefill_sm90_applies is false; v3 then runs.
void launch_prefill(const PagedAttnParams& p, bool skip_single_rows, PrefillKernel kernel,
                    cudaStream_t stream, bool pdl);
bool launch_prefill_sm90(const PagedAttnParams& p, bool skip_single_rows, cudaStream_t stream, bool pdl);
// Stages an fp8 cache's pages into `staging` (prefill_fp8_staging_bytes(p) bytes) and runs v4 on the copy;
// false (launching nothing) where staging does not apply or staging is null.
bool launch_prefill_fp8_staged(const PagedAttnParams& p, bool skip_single_rows, void* staging,
                               cudaStream_t stream, bool pdl);

// Token trees (attention_tree.cu): the splits of the tree kernel for p (0 without tree fields), its
// workspace bytes (0 where it needs none), and its launch (plus its combine where splits > 1) over the rows
// of the sequences with a window, after the causal routing has run.
int tree_splits(const PagedAttnParams& p);
size_t tree_workspace_bytes(const PagedAttnParams& p);
void launch_tree(const PagedAttnParams& p, float* workspace, cudaStream_t stream, bool pdl);

// KILN_DISPATCH_HEAD_DIM(d, statements): the statements see `constexpr int kD` (32, 64 or 128); any other
// head_dim is an error. KILN_DISPATCH_KV_DTYPE likewise with `constexpr KvDtype kKT`.
#define KILN_DISPATCH_HEAD_DIM(d, ...)                                          \
  switch (d) {                                                                  \
    case 32: {                                                                  \
      constexpr int kD = 32;                                                    \
      __VA_ARGS__                                                               \
    } break;                                                                    \
    case 64: {                                                                  \
      constexpr int kD = 64;                                                    \
      __VA_ARGS__                                                               \
    } break;                                                                    \
    case 128: {                                                                 \
      constexpr int kD = 128;                                                   \
      __VA_ARGS__                                                               \
    } break;                                                                    \
    default:                                                                    \
      KILN_FAIL("paged attention: unsupported head_dim ", d, " (32, 64, 128)"); \
  }

// KILN_DISPATCH_GROUP(g, what, statements): the statements see `constexpr int kG`, the query heads a KV head
// serves (1-6 or 8, the portable kernels' instantiations); any other is an error naming `what`.
#define KILN_DISPATCH_GROUP_CASE(n, ...) \
  case n: {                              \
    constexpr int kG = n;                \
    __VA_ARGS__                          \
  } break;
#define KILN_DISPATCH_GROUP(g, what, ...)                               \
  switch (g) {                                                          \
    KILN_DISPATCH_GROUP_CASE(1, __VA_ARGS__)                            \
    KILN_DISPATCH_GROUP_CASE(2, __VA_ARGS__)                            \
    KILN_DISPATCH_GROUP_CASE(3, __VA_ARGS__)                            \
    KILN_DISPATCH_GROUP_CASE(4, __VA_ARGS__)                            \
    KILN_DISPATCH_GROUP_CASE(5, __VA_ARGS__)                            \
    KILN_DISPATCH_GROUP_CASE(6, __VA_ARGS__)                            \
    KILN_DISPATCH_GROUP_CASE(8, __VA_ARGS__)                            \
    default:                                                            \
      KILN_FAIL(what, ": unsupported GQA group size ", g, " (1-6, 8)"); \
  }

// An fp8 cache needs head_dim % 64 == 0 (one scale per 64 elements): D 32 with fp8 is refused at run time
// (the instantiation exists but is never launched).
#define KILN_DISPATCH_KV_DTYPE(t, ...)                                                            \
  if ((t) == KvDtype::bf16) {                                                                     \
    constexpr KvDtype kKT = KvDtype::bf16;                                                        \
    __VA_ARGS__                                                                                   \
  } else {                                                                                        \
    KILN_CHECK(kD % 64 == 0, "paged attention: an fp8 cache needs head_dim % 64 == 0, got ", kD); \
    constexpr KvDtype kKT = KvDtype::f8e4m3;                                                      \
    __VA_ARGS__                                                                                   \
  }

}  // namespace kiln::cuda
