// Paged GQA attention kernels (raw pointers): a decode kernel for one-token rows and a tensor-core
// prefill kernel for rows of sequences with several new tokens. The math is ops/attention.h's contract;
// this header adds the CUDA specifics.
//
// Row routing: sequences with q_len == 1 go to the decode kernel, q_len > 1 to the prefill kernel; with
// decode_rows_per_seq >= 2 (a verify step) every row goes to the decode kernel, one row per block group. The
// host does not read cu_q: when T == B (or the host bound max_q_len == 1) only the decode kernel is
// launched and it also walks the rows of any multi-row sequence (T == B then implies some have none);
// otherwise both kernels run, each skipping the other's sequences (the decode kernel is not launched when
// the host bound min_q_len says no sequence has one row).
//
// Numerics (both kernels): k, v widened exactly to fp32 (fp8: e4m3 * 2^(byte - 127), exact in bf16 and
// fp32); s_j = dot(q, k_j) * scale in fp32; p_j = expf(s_j - m) against a running max m; o = sum p_j v_j /
// sum p_j in fp32; one bf16 rounding at the end. The prefill kernel's P·V uses bf16 tensor-core MMA on
// p split into two bf16 terms (hi + lo, |p - hi - lo| <= 2^-17 p), so both kernels are within fp32
// noise of each other: on the same rows they agree within 1 bf16 ulp.
//
// Decode: grid (splits, Hkv, B), 128 threads. The G = Hq / Hkv query heads of a KV head share every K/V
// load. splits depends only on shapes (B, Hkv, D, the cache dtype, pages_stride * page_size) and the device,
// never on kv_lens, so a captured graph stays valid; with splits > 1 the partial (o / l, m, l) of each row
// go to `workspace` and a combine kernel writes out.
// Three decode kernels (decode_kernel() picks; all keep the split count and workspace layout above):
//   v1: split s walks keys [s c, s c + c), c = ceil(pages_stride * page_size / splits), one dependent
//       page-table -> K/V load chain per key; splits past the context exit at once, the combine reads all.
//   v2: the chunk follows the row's real context on the device, c = max(64, ceil(ctx / splits)
//       rounded up to 32 keys), so only ceil(ctx / c) splits do work; a split streams its keys in 32-key
//       tiles through a 2-stage cp.async pipeline in shared memory (page ids looked up two tiles ahead),
//       then every warp computes from shared memory (G <= 4: scores of a tile first, one softmax rescale per
//       tile; wider groups: v1's per-key update). A row whose context fits one chunk is written out by its
//       block directly; the combine reads only the splits that ran (and skips such rows).
//   v3 (default): v2's chunking in 64-key tiles (fp8: 128), as many splits as fill one wave of resident
//       blocks at small batch and at large batch one (bf16) or the SM-time model of ops/decode_splits.h
//       (fp8), on tensor cores (attention_decode_sm90_tma.cu): the group's query heads are the rows of
//       m16n8k16 MMAs for S = Q K^T and O += P V; tiles 2-4 stages deep (fp8: 2, three blocks an SM) in
//       128-byte-swizzled shared memory, copied by TMA one box per page (pages of 16, 32, 64 rows; else
//       cp.async); each warp takes 16 keys of a tile with its own online softmax, merged at the end. fp8
//       tiles move as bytes and are widened in registers. Within 1 bf16 ulp of prefill v1-v3.
// Token trees (tree_window / tree_mask set): the routing above runs every row as if causal, then one more
// launch (attention_tree.cu; two with splits) rewrites the rows of the sequences whose window W > 0, so a
// tree call may mix them with causal prefill and decode rows at the cost of computing the tree rows twice (a
// tree has at most 64 rows a sequence). Tree kernel: grid (T, Hkv, splits), 128 threads, v1's per-key
// arithmetic (the group's heads share each K/V load) with a visibility predicate: row t of sequence b at
// context position p walks the keys j <= p, j in split s's chunk (decode_chunk(p + 1, splits, 32)), and skips
// a window key j >= kv_len - W whose mask bit j - (kv_len - W) is clear. Summation order: within a split,
// lane slot (warp w, slot) takes keys w * TPW + slot + k * 4 * TPW in ascending k, the slots merge by an xor
// butterfly, then the 4 warps in order, then (splits > 1: tree_combine_kernel) the splits in ascending order.
// splits depends on shapes only: about 16 blocks an SM over T * Hkv blocks, at most 32 and the table's reach
// / 64; its partials follow the decode partials and the fp8 staging copy in the workspace
// (paged_attention_workspace_bytes). The values are not checked on the device (BatchDesc::validate and the
// CPU reference check them): a window outside [0, min(64, kv_len)] is clamped, mask bits past the row's own
// position are never visited, so a bad value never reads outside the sequence's context.
// Prefill: 64 query rows x 64-key tiles, 4 warps (16 rows each) per query head, mma.sync m16n8k16.
// Three prefill kernels (prefill_kernel() picks), bitwise equal (every (row, head) gets the same math in the
// same order):
//   v1: grid (ceil(T / 64), Hq, B); each K/V tile gathered with plain loads between two barriers, no overlap
//       with the MMAs.
//   v2: v1's grid; bf16 caches copy K and V tiles with cp.async so the loads overlap the math (V of tile kt
//       during S = Q K^T and the softmax, K of tile kt + 1 during P V); an fp8 cache runs v1.
//   v3: v2 with 2 query heads of a KV group per block (8 warps, grid (Hkv * ceil(G / 2),
//       ceil(T / 64), B), the last query tile first: longest blocks start first), so each K/V tile is
//       copied into shared memory once for both (an fp8 cache: widened by v1's loads, once for both);
//       where prefill_v3_applies() is false (G == 1, D == 32) it runs v2.
//   v4 (Hopper, sm_90a; attention_prefill_sm90_wgmma_kernel.cuh): the FlashAttention-3 structure. Persistent
//       blocks (one an SM) walk work items of 128 packed (token, head of the KV group) rows, so every K/V
//       tile is loaded once per group; a producer warpgroup loads each item's Q (double-buffered) and fills
//       a 2-4 stage shared-memory pipeline (TMA boxes of whole pages for bf16 tiles inside
//       the context, else gathered loads, fp8 widened exactly to bf16), completed on mbarriers; two
//       consumer warpgroups of 64 rows run S = Q K^T and O += P V with wgmma, the softmax in fp32 and P
//       rounded once to bf16 (not bitwise v1-v3: within a tolerance, docs/NUMERICS.md). Where
//       prefill_sm90_applies() is false it runs v3.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

enum class KvDtype : uint8_t { bf16, f8e4m3 };

struct PagedAttnParams {
  const void* q = nullptr;  // bf16 [T, Hq, D], strides below (last stride 1)
  int64_t q_stride_t = 0, q_stride_h = 0;
  void* out = nullptr;  // bf16 [T, Hq, D]
  int64_t o_stride_t = 0, o_stride_h = 0;
  const void* k =
      nullptr;  // cache: element (page, row, head, d) at page*s_page + row*s_row + head*s_head + d
  const void* v = nullptr;
  int64_t s_page = 0, s_row = 0, s_head = 0;  // elements, shared by k and v
  const uint8_t* k_scale = nullptr;           // f8e4m3 only: UE8M0 byte of (page, row, head, d / 64)
  const uint8_t* v_scale = nullptr;
  int64_t sc_page = 0, sc_row = 0, sc_head = 0;
  KvDtype kv_dtype = KvDtype::bf16;
  const int32_t* cu_q = nullptr;        // [B + 1]
  const int32_t* kv_lens = nullptr;     // [B]
  const int32_t* page_table = nullptr;  // [B, pages_stride]
  int32_t pages_stride = 0;
  int32_t page_size = 0;
  int32_t num_pages = 0;  // pages beyond are never read (a bad table entry is clamped, not followed)
  int32_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;
  int32_t max_q_len = 0;  // host bound on q_len over sequences; 0 = unknown
  // Host bound: every sequence has at least min_q_len rows (0 = unknown). >= 2: no one-row sequence, so
  // paged_attention launches no decode kernel (a prefill-only step; graphs hold decode steps only).
  int32_t min_q_len = 0;
  // Host bound (>= the exact count) on sum over the sequences the prefill kernel runs of
  // ceil(kv_len / page_size); 0 = unknown. With an fp8 cache and prefill v4 it sizes the bf16 staging copy
  // of those pages (prefill_fp8_staging_bytes); unknown: v4 widens the fp8 rows in its producer warpgroup.
  int32_t prefill_pages = 0;
  // Verify steps (speculative decoding): >= 2 bounds every sequence's q_len (the host guarantees it; rows
  // past it are not written) and sends every row through the decode kernel alone, as a one-row sequence of
  // its own causal length with the split count of a B-sequence decode step (row groups: B x this; no
  // prefill launch), so row i is bitwise the plain decode step's row at position kv_len - q_len + i with the
  // same B and page-table width. 0 or 1: the routing above. Up to kMaxDecodeRowsPerSeq.
  int32_t decode_rows_per_seq = 0;
  // Token trees (ops/attention.h tree_window / tree_mask): both null (every row causal), or i32 [B] and the
  // masks' bits [T] (8-byte aligned). The rows of sequences with a window > 0 are then written by the tree
  // kernel after the routing above has run (attention_tree.cu); the host never reads either.
  const int32_t* tree_window = nullptr;
  const uint64_t* tree_mask = nullptr;
};

constexpr int32_t kMaxDecodeRowsPerSeq = 16;

enum class DecodeKernel : uint8_t { v1, v2, v3 };

// The decode kernel paged_attention and paged_attention_decode launch: set_decode_kernel's choice, else the
// environment variable KILN_ATTN_DECODE ("v1", "v2" or "v3", read once; unset: v3; anything else is an
// error). Where v3 does not apply (decode_sm90_applies: D 32, an fp8 cache at D 64, rows not 16-byte aligned)
// v2 runs. Graphs keep the kernel they captured.
DecodeKernel decode_kernel();
void set_decode_kernel(DecodeKernel k);  // tests and benchmarks
const char* decode_kernel_name(DecodeKernel k);

// The most rows a sequence of a launch with decode_rows_per_seq >= 2 may have for its rows to go through the
// decode kernel; above it (or at 0) the routing above runs as if decode_rows_per_seq were 0 (the prefill
// kernel). set_verify_decode_max_rows's choice, else KILN_ATTN_VERIFY_DECODE (0 .. 16, read once; unset:
// kVerifyDecodeMaxRowsDefault). 4B shape, batch 1, ctx 1024 (H100, 2026-12-06, docs/PERF.md "Speculative
// decoding"): the verify step of 4 rows 4.223 ms with decode attention against 4.455 with prefill's, of 8
// rows 4.607 against 4.541. Graphs keep what they captured.
constexpr int kVerifyDecodeMaxRowsDefault = 4;
int verify_decode_max_rows();
void set_verify_decode_max_rows(int rows);  // tests and benchmarks

enum class PrefillKernel : uint8_t { v1, v2, v3, v4 };

// Likewise for the prefill kernel: set_prefill_kernel's choice, else KILN_ATTN_PREFILL ("v1" .. "v4", read
// once; unset: v4, which runs v3 where it does not apply; anything else is an error).
PrefillKernel prefill_kernel();
void set_prefill_kernel(PrefillKernel k);
const char* prefill_kernel_name(PrefillKernel k);
// Whether PrefillKernel::v3 runs its own kernel for these params (Hq / Hkv >= 2, D >= 64; bf16 or fp8 cache);
// otherwise it runs v2.
bool prefill_v3_applies(const PagedAttnParams& p);
// Whether PrefillKernel::v4 runs its own kernel for these params (D 64 or 128, an sm_90 device running the
// build's sm_90a code); otherwise it runs v3. prefill_sm90_uses_tma: whether its full K/V tiles come by TMA
// (bf16 cache, page_size a multiple of 16 dividing 128; not with KILN_ATTN_PREFILL_NO_TMA=1); otherwise its
// producer warpgroup gathers them. KILN_ATTN_PREFILL_SERIAL=1 turns off its softmax / P V overlap and
// KILN_ATTN_PREFILL_NO_PINGPONG=1 its consumers' turn-taking (debugging, A/B).
bool prefill_sm90_applies(const PagedAttnParams& p);
bool prefill_sm90_uses_tma(const PagedAttnParams& p);
// FP8 prefill through staging (attention_prefill_sm90_fp8_staging.cu): with an fp8 cache, prefill v4 chosen
// and applying, prefill_pages > 0, pages of 16, 32, 64 or 128 rows and tensor maps available, the pages v4
// will read are first widened (exactly) into a bf16 copy in the workspace, which v4 then reads with TMA:
// bitwise the unstaged output, about twice as fast (docs/PERF.md). The bytes that copy needs (the page table
// of the copy, then its K and V pages), or 0 where staging does not apply or would exceed
// KILN_ATTN_FP8_STAGING_MB (MiB, default 256; 0 turns it off).
size_t prefill_fp8_staging_bytes(const PagedAttnParams& p);

// Bytes of workspace paged_attention needs for these shapes: the decode splits' partials (0 when no split is
// used; one entry per sequence, whatever the number of prefill rows), rounded up to 256 bytes, then the fp8
// prefill staging copy where it applies (prefill_fp8_staging_bytes; only when the launch has prefill rows),
// then, with tree fields and more than one tree split, the tree kernel's partials (256-byte aligned:
// T * Hq * splits * (D + 2) floats).
size_t paged_attention_workspace_bytes(const PagedAttnParams& p);
// Bytes of workspace paged_attention_prefill needs (the staging copy alone, at offset 0).
size_t paged_attention_prefill_workspace_bytes(const PagedAttnParams& p);
// The decode splits paged_attention launches for these shapes with the current decode kernel (1: no combine).
int paged_attention_decode_splits(const PagedAttnParams& p);
// The splits of the tree kernel for these shapes (1: it writes out itself, no workspace); 0 without tree
// fields.
int paged_attention_tree_splits(const PagedAttnParams& p);

// Validates p (D in {32, 64, 128} (fp8: 64, 128), Hq % Hkv == 0, Hq / Hkv in 1..6 or 8, page_size > 0,
// alignment) and launches. workspace: device memory of paged_attention_workspace_bytes(p) bytes (may be null
// when that is 0). force_splits in [1, 128] overrides the decode split count (tests; the workspace must then
// hold B * Hq * force_splits * (D + 2) floats, rounded up to 256 bytes, before the staging copy and the tree
// partials; the tree kernel's splits stay its own). pdl: programmatic dependent launch for the prefill
// kernels, the decode splits' combine and the tree launches (the decode kernel itself always launches
// plainly: measured faster so, attention.cu).
void paged_attention(const PagedAttnParams& p, void* workspace, cudaStream_t stream, int force_splits = 0,
                     bool pdl = false);

// The kernels alone (tests: decode vs prefill on the same rows). Routing as above is bypassed: the decode
// kernel handles sequences with q_len == 1, the prefill kernel every sequence with q_len >= 1; both ignore
// the tree fields (every row causal).
void paged_attention_decode(const PagedAttnParams& p, void* workspace, cudaStream_t stream,
                            int force_splits = 0, bool pdl = false);
void paged_attention_prefill(const PagedAttnParams& p, bool skip_single_rows, void* workspace,
                             cudaStream_t stream, bool pdl = false);

}  // namespace kiln::cuda
