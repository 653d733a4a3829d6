// The Qwen3-VL vision tower's input side: the learned position embedding bilinearly interpolated to an
// image's patch grid (transformers' Qwen3VLVisionModel.fast_pos_embed_interpolate), and the pixel rows'
// rounding to the tower's dtype (pixel_values.type(visual.dtype)).
//
// pos_embed_linspace(side, grid_h, grid_w): host f32 [grid_h + grid_w]: torch.linspace(0, side - 1, grid_h)
//   then torch.linspace(0, side - 1, grid_w), in fp32 as ATen's CPU kernel computes them (step = end /
//   (steps - 1); the first steps / 2 values step * i, the rest end - step * (steps - 1 - i); steps == 1
//   gives 0). O(grid_h + grid_w): the caller uploads it where the table lives.
//
// pos_embed_interpolate(table, lin, grid_t, grid_h, grid_w, merge, out):
//   table: bf16 [side * side, C] contiguous (pos_embed.weight: a side x side grid of learned positions)
//   lin:   f32 [grid_h + grid_w] contiguous, on table's device: pos_embed_linspace(side, grid_h, grid_w)
//   out:   bf16 [grid_t * grid_h * grid_w, C], last stride 1 (row stride free), on table's device, not
//          overlapping table or lin. grid_h and grid_w are positive multiples of merge, grid_t > 0.
//   Per patch (i, j) of the grid: v = lin[i], fh = int(v) (truncation: v >= 0), ch = min(fh + 1, side - 1),
//   dh = v - float(fh) (exact); likewise fw, cw, dw from u = lin[grid_h + j]. Corners and weights, each
//   weight one fp32 product rounded to bf16 (transformers builds them in fp32, then .to(bf16)):
//     k = 0: (fh, fw), w0 = bf16((1 - dh) * (1 - dw))     k = 1: (fh, cw), w1 = bf16((1 - dh) * dw)
//     k = 2: (ch, fw), w2 = bf16(dh * (1 - dw))           k = 3: (ch, cw), w3 = bf16(dh * dw)
//   Per channel c, in this order, every intermediate rounded to bf16 (round to nearest even), no fma:
//     p_k = bf16(float(E[idx_k, c]) * w_k),  acc = p_0,  acc = bf16(acc + p_k) for k = 1, 2, 3
//   (transformers: pos_embeds * weights in bf16, then p0 + p1 + p2 + p3 left to right, each add in bf16).
//   Output rows: the grid repeated per frame and reordered into merge blocks (t, h/m, w/m, m, m), the
//   processor's patch order: row r = ((t * (grid_h/m) + bh) * (grid_w/m) + bw) * m * m + ir * m + ic holds
//   patch (i, j) = (bh * m + ir, bw * m + ic).
//   lin is checked (finite, in [0, side - 1]) where it is host memory; on the device a bad value only
//   clamps its corner indices into the table (never a read outside it).
// CUDA: kiln::ops::cuda::pos_embed_interpolate (ops/cuda/vision.cu): the same fp32 operations (__fmul_rn,
// __fadd_rn, __fsub_rn) and the same bf16 rounding, so bitwise the CPU reference.
//
// cast_to_bf16(in, out): out[r, c] = bf16(in[r, c]) with kiln's f32_to_bf16 (round to nearest even, a NaN
//   stays a quiet NaN with its payload's top bits). in: f32 [M, K], out: bf16 [M, K], last strides 1 (row
//   strides free), one device. CUDA: bitwise the CPU (the same conversion function).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::ops {

std::vector<float> pos_embed_linspace(int64_t side, int64_t grid_h, int64_t grid_w);
void pos_embed_interpolate(const Tensor& table, const Tensor& lin, int64_t grid_t, int64_t grid_h,
                           int64_t grid_w, int64_t merge, const Tensor& out);
void cast_to_bf16(const Tensor& in, const Tensor& out);

}  // namespace kiln::ops
