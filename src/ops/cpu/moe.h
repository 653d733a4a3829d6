// The CPU oracle of ops/moe.h (called through the dispatchers in src/ops/moe.cpp, which validate first).
#pragma once

#include "ops/moe.h"

namespace kiln::ops::cpu {

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights);
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, MoeFp8Path fp8 = MoeFp8Path::w8a8);

// The router logits of ops/moe.h in their canonical order: logits[t, e] = bf16 of x[t] . router[e], lane l
// of 32 taking the 8-element chunks l, l + 32, ... (fmaf chain from +0, chunks and their elements
// ascending; a ragged last chunk shorter), then an xor butterfly 16 .. 1. x bf16 [T, H], router bf16 [E, H],
// logits bf16 [T, E]; last strides 1.
void moe_router_logits(const Tensor& x, const Tensor& router, const Tensor& logits);

// The canonical fp32 sum of n values of ops/moe.h (32 lane partials, then an xor butterfly 16 .. 1).
float moe_lane_sum(const float* v, int64_t n);

}  // namespace kiln::ops::cpu
