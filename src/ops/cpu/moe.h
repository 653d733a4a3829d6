// The CPU oracle of ops/moe.h (called through the dispatchers in src/ops/moe.cpp, which validate first).
#pragma once

#include "ops/moe.h"

namespace kiln::ops::cpu {

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights);
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out);

// The canonical fp32 sum of n values of ops/moe.h (32 lane partials, then an xor butterfly 16 .. 1).
float moe_lane_sum(const float* v, int64_t n);

}  // namespace kiln::ops::cpu
