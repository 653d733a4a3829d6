// Causal GQA attention over the paged KV cache: prefill (cached prefix + new tokens, variable lengths)
// and decode rows in one call.
//
// Sequence b owns query rows [cu_q[b], cu_q[b+1]) and a context of kv_lens[b] tokens whose last
// q_len = cu_q[b+1] - cu_q[b] are its new tokens (already written to the cache by attn_prep). Query row
// i of b sits at context position p = kv_lens[b] - q_len + i and attends to context positions [0, p] (a
// token tree's rows to a subset of them: tree_window / tree_mask below).
// Context position j lives in page page_table[b, j / page_size], row j % page_size.
// Query head h reads KV head h / (Hq / Hkv).
//
//   q:          bf16 [T, Hq, D], last stride 1 (token and head strides free: Q may sit in the QKV buffer)
//   cache:      one layer's KvCacheView (bf16 | f16 | f8e4m3 with UE8M0 scales; NHD or HND)
//   cu_q:       i32 [B + 1], kv_lens: i32 [B], page_table: i32 [B, pages_stride] (all contiguous)
//   out:        bf16 [T, Hq, D], last stride 1; must not alias q
//   scale:      softmax scale, normally 1 / sqrt(D)
// Numerics: k and v widen exactly to fp32 (fp8: e4m3 value * 2^(scale_byte - 127), exact); each score
// s_j = (sum_d q_d * k_jd) * scale in fp32; softmax in fp32 with the running max subtracted
// (p_j = exp(s_j - max)); o = (sum_j p_j * v_j) / (sum_j p_j) in fp32; one rounding to bf16 at the end.
// Summation order is implementation-defined (tolerance against fp64: relative Frobenius error <= 2^-7);
// the CPU reference computes each (row, head) independently, in ascending j (dot products over d with 8
// lane partials, lane d mod 8, then a pairwise tree), so its result is bitwise independent of the batch
// composition, the page size and the cache layout.
// Rows with q_len == 0 sequences, or kv_lens[b] == 0, produce nothing.
//
// CUDA: the dispatcher's CUDA branch is to call kiln::ops::cuda::paged_attention(args).
#pragma once

#include "kiln/tensor.h"
#include "ops/kv_cache.h"

namespace kiln::ops {

struct PagedAttentionArgs {
  Tensor q;           // bf16 [T, Hq, D]
  KvCacheView cache;  // [num_pages, page_size, Hkv, D] (NHD) or [num_pages, Hkv, page_size, D] (HND)
  Tensor cu_q;        // i32 [B + 1]
  Tensor kv_lens;     // i32 [B]
  Tensor page_table;  // i32 [B, pages_stride]
  Tensor out;         // bf16 [T, Hq, D]
  float scale = 0.0f;
  // Host bound on sum over the sequences with q_len >= 2 of ceil(kv_len / page_size) (0 = unknown): lets the
  // CUDA backend stage an fp8 cache's prefill pages as bf16 (ops/cuda/attention.h). Ignored on the CPU.
  int32_t prefill_pages = 0;
  // Host bound: every sequence has at least min_q_len new tokens (0 = unknown); >= 2 lets the CUDA backend
  // skip its decode launch in a prefill-only step. Ignored on the CPU.
  int32_t min_q_len = 0;
  // Verify steps (speculative decoding): >= 2 is a host bound on every sequence's q_len that lets the CUDA
  // backend run each row through its decode kernel alone, as a plain decode step of that row's causal length
  // would (bitwise that step's output for the same sequence count and page-table width;
  // ops/cuda/attention.h). At most 16. Ignored on the CPU, whose rows are bitwise independent of the batch
  // anyway.
  int32_t decode_rows_per_seq = 0;
  // Token trees (kiln/batch.h tree_window / tree_mask): both empty (every row causal) or i32 [B] and i64 [T]
  // (the mask's bits) on the attention's device. Row t of sequence b at context position p attends to the
  // positions j <= p before b's window [kv_lens[b] - W, kv_lens[b]) and to window position kv_lens[b] - W + i
  // where bit i of tree_mask[t] is set. W = 0: b is causal and its masks are 0; else q_len(b) <= W <=
  // min(64, kv_lens[b]), and each row's own bit is set and none above it (BatchDesc::validate's rules; the
  // CPU reference checks them too, naming the field). The CPU reference visits the attended positions in
  // ascending j, so a row equals the causal row of the sequence made of its visible positions, bit for bit,
  // and a chain's masks give the causal rows. CUDA: the causal kernels run every row, then a tree kernel
  // rewrites the rows of sequences with W > 0 (ops/cuda/attention.h: v1's per-key fp32 arithmetic over the
  // visible keys, split over the context, the splits merged in ascending order; within the 2^-7 bound, not
  // bitwise the CPU); bf16 and fp8 caches, NHD and HND, any page size, D 32 / 64 / 128 (fp8: 64, 128), Hq /
  // Hkv in 1..6 or 8 as the causal kernels. Its values are not checked on the device (the host's
  // BatchDesc::validate does): a value the rules forbid gives that row unspecified output but no read outside
  // its sequence's context.
  Tensor tree_window;
  Tensor tree_mask;
};

void paged_attention(const PagedAttentionArgs& args);

}  // namespace kiln::ops
