// ops/moe.h's moe_mlp re-derived for one token from the other ops (the unit tests' composition of the
// contract), with the experts' projections passed in: linear for bf16 experts, a block-FP8 path for FP8 ones.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "ops/activation.h"
#include "ops/cpu/moe.h"
#include "ops/moe.h"

namespace kiln::test_support {

// Expert e's gate_up (down false: in bf16 [1, H], out bf16 [1, 2I]) or down (down true: in [1, I], out [1,
// H]).
using MoeProjection = std::function<void(int64_t e, bool down, const Tensor& in, const Tensor& out)>;

// The token row's output (bf16 [H]) as ops/moe.h composes it: the router logits in the canonical order
// (ops::cpu::moe_router_logits), moe_route (its experts checked ascending), each chosen expert's
// project(gate_up), silu_and_mul, project(down), then the fp32 sum from +0 of y * weight in ascending expert
// index and one bf16 rounding.
inline std::vector<bf16_t> moe_compose_token(std::vector<bf16_t> row, const ops::MoeWeights& w,
                                             const MoeProjection& project) {
  const int64_t H = int64_t(row.size()), E = w.num_experts(), k = w.top_k, I = w.intermediate();
  std::vector<bf16_t> logits(static_cast<size_t>(E)), wts(static_cast<size_t>(k));
  std::vector<int32_t> ex(static_cast<size_t>(k));
  const Tensor xr(row.data(), DType::bf16, {1, H});
  ops::cpu::moe_router_logits(xr, w.router, Tensor(logits.data(), DType::bf16, {1, E}));
  ops::moe_route(Tensor(logits.data(), DType::bf16, {1, E}), k, w.norm_topk_prob,
                 Tensor(ex.data(), DType::i32, {1, k}), Tensor(wts.data(), DType::bf16, {1, k}));
  std::vector<float> acc(static_cast<size_t>(H), 0.0f);
  for (int64_t j = 0; j < k; ++j) {
    EXPECT_TRUE(j == 0 || ex[size_t(j)] > ex[size_t(j - 1)]) << "experts not in ascending order";
    std::vector<bf16_t> gu(static_cast<size_t>(2 * I)), act(static_cast<size_t>(I)),
        y(static_cast<size_t>(H));
    project(ex[size_t(j)], false, xr, Tensor(gu.data(), DType::bf16, {1, 2 * I}));
    ops::silu_and_mul(Tensor(gu.data(), DType::bf16, {1, 2 * I}), Tensor(act.data(), DType::bf16, {1, I}));
    project(ex[size_t(j)], true, Tensor(act.data(), DType::bf16, {1, I}),
            Tensor(y.data(), DType::bf16, {1, H}));
    for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += bf16_to_f32(y[size_t(h)]) * bf16_to_f32(wts[size_t(j)]);
  }
  std::vector<bf16_t> out(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) out[size_t(h)] = f32_to_bf16(acc[size_t(h)]);
  return out;
}

}  // namespace kiln::test_support
