// Row-wise bf16 arithmetic of the Qwen3-VL paths: residual adds in the vision tower, and the image
// embeddings placed into (or added onto) the decoder's hidden states at the image-token rows.
//
// add(a, b, out): out = bf16(float(a) + float(b)) elementwise (torch's bf16 add: one rounding).
//   a, b, out: bf16 [T, H], last stride 1 (row strides free); out may alias a or b.
//
// scatter_rows(dst, rows, src, accumulate): for i in [0, n):
//   accumulate false: dst[rows[i], :] = src[i, :]                          (a copy: masked_scatter)
//   accumulate true:  dst[rows[i], :] = bf16(float(dst[rows[i], :]) + float(src[i, :]))
//                                                  (HF's deepstack: hidden_states[mask] + visual_embeds)
//   dst: bf16 [T, H], last stride 1; rows: i32 [n] contiguous, each in [0, T), distinct; src: bf16 [n, H],
//   last stride 1, not overlapping dst. All on one device; rows are checked on the host where they are
//   host memory, else the kernel skips a row outside [0, T).
// CUDA: kiln::ops::cuda::add / scatter_rows (ops/cuda/rows.cu): bitwise the CPU results (one fp32 add,
// round to nearest even).
#pragma once

#include "kiln/tensor.h"

namespace kiln::ops {

void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scatter_rows(const Tensor& dst, const Tensor& rows, const Tensor& src, bool accumulate);

}  // namespace kiln::ops
