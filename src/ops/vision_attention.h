// The Qwen3-VL vision tower's attention: 2-D rotary embedding on Q and K, then full (bidirectional)
// attention within each image (variable lengths, cu_seqlens).
//
// rope_2d(qkv, pos, table, num_heads): rotates the Q and K parts of the fused QKV rows in place.
//   qkv:   bf16 [T, 3 * Hn * D], last stride 1: per row q (Hn heads of D), then k, then v (untouched)
//   pos:   i32 [T, 2] contiguous, on qkv's device: (row, column) of each patch in its image's patch grid
//          (checked against the table on a host copy)
//   table: the RopeTable2d below (f32 [P, D / 2]: cos at column j, sin at column D / 4 + j)
//   For head element i in [0, D / 2): angle index j = i for i < D / 4 with position pos[t, 0], else
//   j = i - D / 4 with position pos[t, 1] (transformers: cat(row freqs, col freqs), then cat(emb, emb));
//   NeoX halves: x_i' = x_i c - x_{i+D/2} s,  x_{i+D/2}' = x_{i+D/2} c + x_i s, fp32 products and one fp32
//   add (no fma), rounded once to bf16 (transformers: q.float() * cos + rotate_half(q).float() * sin).
//   D % 4 == 0; positions in [0, P).
//
// varlen_attention(q, k, v, cu_seqlens, out, scale): segment s owns rows [cu[s], cu[s+1]); each row attends
// to every row of its segment (no mask inside it, nothing across segments). Heads are independent (no GQA).
//   q, k, v: bf16 [T, Hn, D], last stride 1 (token and head strides free: they sit in the QKV buffer)
//   cu_seqlens: i32 [S + 1] on q's device, cu[0] = 0, non-decreasing, cu[S] = T (checked on a host copy)
//   out: bf16 [T, Hn, D], last stride 1, not aliasing q, k or v
//   Numerics (the CPU reference, as paged_attention in ops/attention.h): fp32 scores (dot products with 8
//   lane partials, then a pairwise tree) times scale, softmax in fp32 with the max subtracted, fp32 weighted
//   sum of V, one rounding to bf16. Tolerance against fp64: relative Frobenius error <= 2^-7.
//   stop (optional; the CPU backend only): polled on the worker threads every 64 (row, head) pairs; once it
//   returns true the remaining pairs are skipped and `out` is left partly written (the caller discards it).
//   One image's pass is minutes of this op on the CPU, so a caller can give up within a fraction of a second.
//   CUDA ignores it: its launches are asynchronous, the host has nothing to stop.
// CUDA (ops/cuda/vision.cu dispatches; raw-pointer launchers in ops/cuda/vision_attention.h): rope_2d bitwise
// the CPU (the same fp32 operations, no fma). varlen_attention, within the tolerance above:
//   - head_dim 64 and 128 (16-byte aligned q/k/v, strides multiples of 8): tensor cores (ops/cuda/
//     vision_attention.cu), FlashAttention-2 style: one block per (64- or 128-row query tile of a segment,
//     head), each block finding its segment in the device's cu_seqlens (no host copy, no sync); S = Q K^T by
//     bf16 MMA with fp32 accumulation; an online softmax over 64-key tiles in fp32, the scale folded into
//     the exponent: P = 2^(S c - m c) with c = scale * log2(e) (one fma, ex2.approx; scale finite and > 0,
//     else the SIMT kernel), m the running max; P rounded to bf16 for the P V MMA (fp32 accumulation; the row
//     sum l keeps the unrounded fp32 P), as FlashAttention does: each weight within 2^-8 relative, so an
//     output element within 2^-8 (sum_j p_j |v_j| / l) of the fp32-P result; O / l rounded once to bf16.
//   - other head dims (16, 32, 72, 80): a SIMT kernel, one thread per (query row, head) with an online
//     softmax. `kiln bench kernels --filter vision_attention` times both.
#pragma once

#include <cstdint>
#include <functional>

#include "kiln/tensor.h"

namespace kiln::ops {

struct RopeTable2d {
  Tensor cos_sin;  // f32 [P, D / 2]
  int head_dim = 0;
};
// inv_freq_j = 1 / theta^(2j / (D / 2)) for j < D / 4, computed as transformers does in fp32
// (Qwen3VLVisionRotaryEmbedding(D / 2, theta)); angle = fp32(p * inv_freq_j); cos and sin in double of that
// fp32 angle, rounded to fp32. Rows p in [0, max_pos).
Buffer build_rope_2d_table(int head_dim, double theta, int64_t max_pos, Device device);
RopeTable2d rope_2d_table_view(const Buffer& table, int head_dim, int64_t max_pos);

void rope_2d(const Tensor& qkv, const Tensor& pos, const RopeTable2d& table, int num_heads);
void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      const Tensor& out, float scale, const std::function<bool()>& stop = {});

}  // namespace kiln::ops
