// Greedy tokens on the device: each logit row's argmax, shifted by a per-index offset.
//
// argmax_rows(logits, offsets, out): for each row r,
//   i* = the lowest i with logits[r, i] >= logits[r, j] for every j (NaN ranks below every number: a row of
//        NaN and -inf gives 0), and out[r] = i* + offsets[i*] (offsets empty: out[r] = i*).
//   logits:  f32 [R, V], last stride 1 (row stride free), V >= 1
//   offsets: i64 [V] contiguous, or an empty Tensor (EAGLE-3's d2t: draft id -> target id = id + d2t[id])
//   out:     i32 [R] contiguous; i* + offsets[i*] must fit in i32 (the caller's table guarantees it)
// No rounding point: comparisons only, so the CUDA kernel equals the CPU oracle bit for bit.
// All tensors on one device. It lets a chain of draft passes feed each pass's tokens to the next on the
// device (model/eagle3_model.h: forward_chain), where reading the logits back to the host took a
// synchronization a pass.
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out);

}  // namespace kiln::ops
