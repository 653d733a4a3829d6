// Paged attention launchers: validation, decode split choice, row routing (see attention.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "ops/cuda/attention_common.cuh"
#include "ops/decode_splits.h"

namespace kiln::cuda {

int sm_count() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

namespace {

void validate(const PagedAttnParams& p) {
  KILN_CHECK(p.D == 32 || p.D == 64 || p.D == 128, "paged attention: head_dim must be 32, 64 or 128, got ",
             p.D);
  KILN_CHECK(p.Hq > 0 && p.Hkv > 0 && p.Hq % p.Hkv == 0, "paged attention: Hq ", p.Hq,
             " must be a multiple of Hkv ", p.Hkv);
  KILN_CHECK(p.B >= 0 && p.T >= 0, "paged attention: negative B or T");
  KILN_CHECK(p.page_size > 0 && p.pages_stride > 0 && p.num_pages > 0, "paged attention: page_size ",
             p.page_size, ", pages_stride ", p.pages_stride, " and num_pages ", p.num_pages,
             " must be positive");
  KILN_CHECK(p.q && p.out && p.k && p.v && p.cu_q && p.kv_lens && p.page_table,
             "paged attention: null pointer");
  KILN_CHECK(p.out != p.q, "paged attention: out must not alias q");
  const auto al16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  KILN_CHECK(al16(p.q) && al16(p.out) && p.q_stride_t % 8 == 0 && p.q_stride_h % 8 == 0 &&
                 p.o_stride_t % 2 == 0 && p.o_stride_h % 2 == 0,
             "paged attention: q rows must be 16-byte aligned and out rows 4-byte aligned");
  const int elem_align = 8;  // 8 elements: 16 bytes of bf16, 8 bytes of fp8 (one lane's load)
  KILN_CHECK(al16(p.k) && al16(p.v) && p.s_page % elem_align == 0 && p.s_row % elem_align == 0 &&
                 p.s_head % elem_align == 0,
             "paged attention: cache rows must be aligned (16 bytes bf16, 8 bytes fp8)");
  if (p.kv_dtype == KvDtype::f8e4m3)
    KILN_CHECK(p.k_scale && p.v_scale, "paged attention: an fp8 cache needs k_scale and v_scale");
  KILN_CHECK(p.scale > 0.0f, "paged attention: scale must be positive");
  KILN_CHECK(p.decode_rows_per_seq >= 0 && p.decode_rows_per_seq <= kMaxDecodeRowsPerSeq,
             "paged attention: decode_rows_per_seq must be in [0, ", kMaxDecodeRowsPerSeq, "], got ",
             p.decode_rows_per_seq);
  KILN_CHECK(p.decode_rows_per_seq < 2 || p.max_q_len <= p.decode_rows_per_seq, "paged attention: max_q_len ",
             p.max_q_len, " exceeds decode_rows_per_seq ", p.decode_rows_per_seq);
  KILN_CHECK((p.tree_window == nullptr) == (p.tree_mask == nullptr),
             "paged attention: tree_window and tree_mask must both be given or both be null");
  KILN_CHECK(reinterpret_cast<uintptr_t>(p.tree_mask) % 8 == 0 &&
                 reinterpret_cast<uintptr_t>(p.tree_window) % 4 == 0,
             "paged attention: tree_mask must be 8-byte and tree_window 4-byte aligned");
}

// Splits depend only on shapes (never on kv_lens, which live on the device), so a graph stays valid.
// The page table's reach (pages_stride * page_size) bounds the context, so chunks are sized from it:
// up to 128 splits of >= 32 keys, enough blocks (~16 per SM) that a short context inside a wide table
// still spreads over the GPU; splits past a sequence's length exit at once. v1 uses `chunk`; v2 ignores it
// and sizes its chunks from each row's context on the device (attention_decode_portable.cu, v2_chunk).
void decode_split(const PagedAttnParams& p, int force_splits, int* splits, int* chunk) {
  const int64_t max_ctx = int64_t(p.pages_stride) * p.page_size;
  int s = force_splits;
  if (s <= 0) {
    const int64_t blocks = int64_t(std::max(p.B, 1)) * p.Hkv;
    const int64_t want = (16 * int64_t(sm_count()) + blocks - 1) / blocks;
    s = int(std::clamp<int64_t>(want, 1, std::min<int64_t>(128, (max_ctx + 31) / 32)));
  }
  *splits = s;
  *chunk = int((max_ctx + s - 1) / s);
}

std::atomic<int> g_decode_kernel{-1}, g_prefill_kernel{-1};  // -1: not chosen yet
std::atomic<int> g_verify_decode_rows{-1};                   // verify_decode_max_rows(); -1: not chosen yet

// The kernel variant held by `choice`, or (first use) the environment variable `env`: "v1" -> 0, "v2" -> 1,
// ..., up to "v<count>"; unset -> `dflt`; anything else an error. A concurrent setter wins over the
// environment.
int variant(std::atomic<int>& choice, const char* env, int count, int dflt) {
  int k = choice.load(std::memory_order_relaxed);
  if (k >= 0) return k;
  const char* val = std::getenv(env);
  k = dflt;
  if (val && *val) {
    k = -1;
    for (int i = 0; i < count; ++i)
      if (std::string("v") + std::to_string(i + 1) == val) k = i;
    KILN_CHECK(k >= 0, env, " must be one of v1 .. v", count, ", got '", val, "'");
  }
  int expected = -1;
  return choice.compare_exchange_strong(expected, k) ? k : expected;
}

}  // namespace

DecodeKernel decode_kernel() {
  return DecodeKernel(variant(g_decode_kernel, "KILN_ATTN_DECODE", 3, 2));
}
void set_decode_kernel(DecodeKernel k) {
  g_decode_kernel.store(int(k));
}
const char* decode_kernel_name(DecodeKernel k) {
  return k == DecodeKernel::v1 ? "v1" : k == DecodeKernel::v2 ? "v2" : "v3";
}

PrefillKernel prefill_kernel() {
  return PrefillKernel(variant(g_prefill_kernel, "KILN_ATTN_PREFILL", 4, 3));
}
void set_prefill_kernel(PrefillKernel k) {
  g_prefill_kernel.store(int(k));
}
const char* prefill_kernel_name(PrefillKernel k) {
  return k == PrefillKernel::v1 ? "v1" : k == PrefillKernel::v2 ? "v2" : k == PrefillKernel::v3 ? "v3" : "v4";
}

namespace {

// v2 sizes chunks from each row's context (>= kDecodeV2MinChunk keys), so splits past the table's reach /
// kDecodeV2MinChunk never get keys: launching them only adds blocks that exit. Dropping them changes no
// chunk (for ctx <= reach, ceil(ctx / splits) stays <= kDecodeV2MinChunk), so no output bit. Still a function
// of shapes only; the workspace stays sized by decode_split (the larger v1 count).
//
// v3 keeps 2-4 long-lived blocks per SM streaming many tiles each, so it wants about one wave: splits =
// the resident block slots over the (sequence, KV head) pairs (B = 1: a split per slot; B * Hkv >= slots:
// the wave model below), at most v2's count (so the workspace, sized by decode_split, still holds them).
int launched_splits(const PagedAttnParams& p, int splits, DecodeKernel k) {
  if (k == DecodeKernel::v1) return splits;
  const int64_t reach = int64_t(p.pages_stride) * p.page_size;
  int s = int(std::min<int64_t>(splits, (reach + kDecodeV2MinChunk - 1) / kDecodeV2MinChunk));
  if (k == DecodeKernel::v3) {
    const int64_t pairs = int64_t(std::max(p.B, 1)) * p.Hkv;
    // Splits for at most 2 blocks per SM: fp8 blocks reside 3 to an SM, but splitting for 3 made B = 1
    // and 8 slower (more, shorter splits; H200, docs/PERF.md).
    const int64_t sms = sm_count(), per_sm = decode_sm90_blocks_per_sm(p),
                  slots = sms * std::min<int64_t>(2, per_sm);
    if (pairs < slots) return int(std::clamp<int64_t>(slots / pairs, 1, s));
    // Large batches: the wave model of ops/decode_splits.h over this device's SMs and the blocks an SM holds
    // (shared memory bound), tiles from the table's reach. FP8 caches only: bf16 measured one split best
    // at B = 64 and 128 (H200, docs/PERF.md), which the model picks there too.
    if (p.kv_dtype == KvDtype::bf16) return 1;
    return ops::decode_wave_splits(pairs, s, sms, per_sm,
                                   (reach + kDecodeSm90TileFp8 - 1) / kDecodeSm90TileFp8);
  }
  return s;
}

// Whether the decode kernel itself launches with PDL. v3 issues its first K/V tiles of the context written
// by earlier steps before its wait, so launched early their page lookups and copies overlap the
// predecessor (attn_prep): done where the grid is one wave of at most 2 blocks an SM (B = 1 .. 32 at
// Qwen3-4B's heads), which such a launch enforces (launch_decode_sm90). 4B step, graph + PDL: batch 1 ctx
// 1024 3.00 -> 2.96 ms, ctx 8192 3.28 -> 3.22, batch 8 fp8 ctx 8192 4.59 -> 4.49, batch 32 ctx 8192
// 12.26 -> 12.03 (fp8 8.02 -> 7.91); 0.6B 0.97 -> 0.93 (H200, 2026-12-03, `7a2a4c0`;
// bench/results/h200_decode_early_launch_2026-12-03.txt). Larger grids wait for a plain launch: launched
// early, blocks of several waves land unevenly (fp8 steps of 32 sequences were 2-7 % slower before the
// 2-an-SM cap and the early loads: 2026-12-02, bench/results/h200_pdl_decode_step_2026-12-02.txt).
// KILN_ATTN_DECODE_EARLY=0 turns it off (A/B), read once.
bool decode_launches_early(const PagedAttnParams& p, DecodeKernel k, int splits) {
  static const bool on = [] {
    const char* e = std::getenv("KILN_ATTN_DECODE_EARLY");
    return !(e && std::string(e) == "0");
  }();
  if (!on || k != DecodeKernel::v3) return false;
  const int64_t slots = int64_t(sm_count()) * std::min(2, decode_sm90_blocks_per_sm(p));
  return std::max<int64_t>(decode_row_groups(p), 1) * p.Hkv * splits <= slots;
}

// The splits (and v1's chunk) decode() launches: force_splits when > 0, else the shape rule.
int decode_launch_splits(const PagedAttnParams& p, int force_splits, DecodeKernel k, int* chunk) {
  int splits = 0;
  decode_split(p, force_splits, &splits, chunk);
  return force_splits > 0 ? splits : launched_splits(p, splits, k);
}

// The decode kernel that runs for p: the chosen one, v2 where v3 does not apply.
DecodeKernel effective_decode_kernel(const PagedAttnParams& p) {
  const DecodeKernel k = decode_kernel();
  return k == DecodeKernel::v3 && !decode_sm90_applies(p) ? DecodeKernel::v2 : k;
}

// Whether a verify launch's rows go through the decode kernel (attention.h: decode_rows_per_seq).
bool verify_rows_decoded(const PagedAttnParams& p) {
  return p.decode_rows_per_seq >= 2 && p.decode_rows_per_seq <= verify_decode_max_rows();
}

}  // namespace

int verify_decode_max_rows() {
  int k = g_verify_decode_rows.load(std::memory_order_relaxed);
  if (k >= 0) return k;
  const char* e = std::getenv("KILN_ATTN_VERIFY_DECODE");
  k = kVerifyDecodeMaxRowsDefault;
  if (e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    KILN_CHECK(*end == '\0' && v >= 0 && v <= kMaxDecodeRowsPerSeq, "KILN_ATTN_VERIFY_DECODE must be 0 .. ",
               kMaxDecodeRowsPerSeq, ", got '", e, "'");
    k = int(v);
  }
  int expected = -1;
  return g_verify_decode_rows.compare_exchange_strong(expected, k) ? k : expected;
}
void set_verify_decode_max_rows(int rows) {
  KILN_CHECK(rows >= 0 && rows <= kMaxDecodeRowsPerSeq, "verify decode rows must be 0 .. ",
             kMaxDecodeRowsPerSeq, ", got ", rows);
  g_verify_decode_rows.store(rows);
}

int paged_attention_decode_splits(const PagedAttnParams& p) {
  int chunk = 0;
  return decode_launch_splits(p, 0, effective_decode_kernel(p), &chunk);
}

namespace {

// The decode partials' bytes (force_splits > 0: that many splits), rounded up to 256: the fp8 prefill
// staging copy follows them in the workspace.
size_t decode_workspace_bytes(const PagedAttnParams& p, int force_splits) {
  int splits = force_splits, chunk = 0;
  if (splits <= 0) decode_split(p, 0, &splits, &chunk);
  // One entry per row group (attention_common.cuh decode_ws_slot), however many prefill rows the step has.
  const size_t bytes =
      splits <= 1 ? 0 : size_t(decode_row_groups(p)) * p.Hq * splits * (p.D + 2) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

// Whether paged_attention launches the prefill kernel for p (see its routing).
bool has_prefill_rows(const PagedAttnParams& p) {
  return !(p.T == p.B || p.max_q_len == 1 || verify_rows_decoded(p));
}

}  // namespace

namespace {

// Where the tree kernel's partials start: past the decode partials (force_splits > 0: that many splits) and
// the staging copy, 256-byte aligned.
size_t tree_workspace_offset(const PagedAttnParams& p, int force_splits) {
  const size_t staging = has_prefill_rows(p) ? prefill_fp8_staging_bytes(p) : 0;
  return (decode_workspace_bytes(p, force_splits) + staging + 255) / 256 * 256;
}

}  // namespace

int paged_attention_tree_splits(const PagedAttnParams& p) {
  return tree_splits(p);
}

size_t paged_attention_workspace_bytes(const PagedAttnParams& p) {
  // Callers size the workspace before they capture graphs: probing here which decode kernel runs (its
  // once-per-device query of the loaded sm_90a code) keeps that query out of any capture.
  (void)effective_decode_kernel(p);
  if (const size_t tree = tree_workspace_bytes(p); tree > 0) return tree_workspace_offset(p, 0) + tree;
  const size_t staging = has_prefill_rows(p) ? prefill_fp8_staging_bytes(p) : 0;
  return staging == 0 && decode_workspace_bytes(p, 0) == 0 ? 0 : decode_workspace_bytes(p, 0) + staging;
}

size_t paged_attention_prefill_workspace_bytes(const PagedAttnParams& p) {
  return prefill_fp8_staging_bytes(p);
}

namespace {

// The prefill rows: through the fp8 staging copy where it applies, else the chosen kernel.
void prefill(const PagedAttnParams& p, bool skip_single_rows, void* staging, cudaStream_t stream, bool pdl) {
  if (launch_prefill_fp8_staged(p, skip_single_rows, staging, stream, pdl)) return;
  launch_prefill(p, skip_single_rows, prefill_kernel(), stream, pdl);
}

void decode(const PagedAttnParams& p, void* workspace, cudaStream_t stream, int force_splits, bool all_rows,
            bool pdl) {
  const DecodeKernel k = effective_decode_kernel(p);
  int chunk = 0;
  const int splits = decode_launch_splits(p, force_splits, k, &chunk);
  KILN_CHECK(splits <= 128, "paged attention: at most 128 decode splits, asked for ", splits);
  if (splits > 1) KILN_CHECK(workspace != nullptr, "paged attention: split-KV decode needs a workspace");
  launch_decode(p, static_cast<float*>(workspace), splits, chunk, all_rows, k, stream,
                pdl && decode_launches_early(p, k, splits));
  if (splits > 1) launch_decode_combine(p, static_cast<float*>(workspace), splits, all_rows, k, stream, pdl);
}

}  // namespace

void paged_attention_decode(const PagedAttnParams& p, void* workspace, cudaStream_t stream, int force_splits,
                            bool pdl) {
  validate(p);
  if (p.B == 0 || p.T == 0) return;
  decode(p, workspace, stream, force_splits, /*all_rows=*/false, pdl);
}

void paged_attention_prefill(const PagedAttnParams& p, bool skip_single_rows, void* workspace,
                             cudaStream_t stream, bool pdl) {
  validate(p);
  if (p.B == 0 || p.T == 0) return;
  prefill(p, skip_single_rows, workspace, stream, pdl);
}

namespace {

// The causal routing of paged_attention (attention.h), every row of a tree call included.
void causal_rows(const PagedAttnParams& p, void* workspace, cudaStream_t stream, int force_splits, bool pdl) {
  // T == B: every sequence has one row, or some have none and others several (rare): the decode kernel
  // then walks those rows too, so one launch suffices and graphs of decode steps hold no prefill node.
  // A verify step: every row through the decode kernel, each on its own (bitwise the plain decode step's).
  if (verify_rows_decoded(p)) {
    decode(p, workspace, stream, force_splits, /*all_rows=*/false, pdl);
    return;
  }
  // Else the routing above, with the rows per sequence no longer bounded (verify rows turned off).
  PagedAttnParams q = p;
  q.decode_rows_per_seq = 0;
  if (q.T == q.B || q.max_q_len == 1) {
    decode(q, workspace, stream, force_splits, /*all_rows=*/true, pdl);
    return;
  }
  if (q.min_q_len < 2) decode(q, workspace, stream, force_splits, /*all_rows=*/false, pdl);
  void* staging =
      workspace ? static_cast<uint8_t*>(workspace) + decode_workspace_bytes(q, force_splits) : nullptr;
  prefill(q, /*skip_single_rows=*/true, staging, stream, pdl);
}

}  // namespace

void paged_attention(const PagedAttnParams& p, void* workspace, cudaStream_t stream, int force_splits,
                     bool pdl) {
  validate(p);
  if (p.B == 0 || p.T == 0) return;
  causal_rows(p, workspace, stream, force_splits, pdl);
  // Token trees: the tree sequences' rows, just written causally, are rewritten with their masks (stream
  // order, or PDL's wait, puts the tree writes last).
  if (p.tree_window == nullptr) return;
  const bool split = tree_workspace_bytes(p) > 0;
  KILN_CHECK(!split || workspace != nullptr, "paged attention: a split tree launch needs a workspace");
  launch_tree(p,
              split ? reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) +
                                               tree_workspace_offset(p, force_splits))
                    : nullptr,
              stream, pdl);
}

}  // namespace kiln::cuda
