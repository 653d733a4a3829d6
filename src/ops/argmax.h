// Ranking a row of logits on the device: the argmax (greedy tokens) and the top k with log-probabilities
// (EAGLE tree drafting), each shifted by a per-index offset.
//
// Ranking (both ops): column i ranks above column j when key(i) > key(j), or key(i) == key(j) and i < j, with
// key(i) = logits[r, i], NaN read as -inf (so -0 and +0 tie, and a row of NaN and -inf ranks by column). No
// rounding point: comparisons only, so the ranks, and the tokens, are the CPU oracle's bit for bit.
//
// argmax_rows(logits, offsets, out): out[r] = i* + offsets[i*] for the top-ranked column i* of row r
// (offsets empty: out[r] = i*).
//   logits:  f32 [R, V], last stride 1 (row stride free), V >= 1
//   offsets: i64 [V] contiguous, or an empty Tensor (EAGLE-3's d2t: draft id -> target id = id + d2t[id])
//   out:     i32 [R] contiguous; i* + offsets[i*] must fit in i32 (the caller's table guarantees it)
// It lets a chain of draft passes feed each pass's tokens to the next on the device (model/eagle3_model.h:
// forward_chain), where reading the logits back to the host took a synchronization a pass.
//
// topk_rows(logits, offsets, k, tokens, logprobs): row r's top k columns id_0 .. id_{k-1} by the ranking
// (id_0 = argmax_rows' i*), tokens[r, i] = id_i + offsets[id_i], and their log-softmax over the whole row in
// f32: m = logits[r, id_0] (the raw value), s = the sum over every column j of expf(x_j - m) (each term and
// each partial sum rounded to f32), logprobs[r, i] = (x_{id_i} - m) - logf(s). A row holding a NaN or +inf
// logit gets NaN log-probabilities; a row of -inf and NaN only, NaN ones.
//   logits as argmax_rows'; offsets as argmax_rows'; 1 <= k <= min(V, kMaxTopk)
//   tokens:   i32 [R, k] contiguous;  logprobs: f32 [R, k] contiguous
// The order of s's additions (and the libm) is the backends' only difference:
//   CPU:  j ascending, one add at a time from 0; expf, logf of the C library (the oracle).
//   CUDA: thread t of 512 adds j = t, t + 512, ... ascending from 0, then ops/cuda/block_reduce.cuh's
//         block_sum (a warp xor butterfly 16, 8, 4, 2, 1, then the 16 warp sums in warp order); CUDA's expf
//         and logf (<= 2 and 1 ulp).
// Tolerance, with lp the f64 log-softmax of the same logits (m as above): |lp_cuda - lp| <= 1e-5 max(1, |lp|)
// (its short sums stay near 1e-6 at V = 151936); the CPU's long ascending sum drifts with V (2.7e-4 off lp at
// V = 151936 over N(0, 3^2) logits, 1.4e-6 at V = 1000, in a host emulation of both orders), so
// |lp_cuda - lp_cpu| <= 1e-5 max(1, |lp|) + |lp_cpu - lp|. Entries equal to -inf or NaN on one backend are
// so on the other.
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

inline constexpr int kMaxTopk = 16;

void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out);
void topk_rows(const Tensor& logits, const Tensor& offsets, int k, const Tensor& tokens,
               const Tensor& logprobs);

}  // namespace kiln::ops
