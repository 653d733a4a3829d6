// Embedding gather (also used to pick rows of a hidden-state matrix).
//
// embedding(table, ids, out): out[t, :] = table[ids[t], :]
//   table: bf16 [V, H], last stride 1 (row stride free)
//   ids:   i32 [T] contiguous, each in [0, V) (out-of-range ids are a kiln::Error, never a read)
//   out:   bf16 or f32 [T, H], last stride 1. f32 output is the exact widening of the bf16 value.
// No rounding point: a copy. All tensors on one device.
// CUDA: the dispatcher's CUDA branch is to call kiln::ops::cuda::embedding(table, ids, out)
// (src/ops/cuda); ids must then be checked by the kernel (it traps nothing: out-of-range rows are zeroed
// and the error is reported through the model's validation of BatchDesc, which checks every id first).
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out);

}  // namespace kiln::ops
