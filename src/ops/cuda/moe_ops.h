// Tensor-level CUDA entry points of ops/moe.h, called by its dispatchers (src/ops/moe.cpp) after they have
// validated shapes, dtypes and devices. On kiln::cuda::current_stream(), no host synchronisation.
#pragma once

#include <cstddef>

#include "kiln/tensor.h"
#include "ops/moe.h"

namespace kiln::ops::cuda {

// Which expert kernels moe_mlp runs (moe.h step 4). by_rows: the gather GEMV for T <= kMoeGemvMaxTokens
// (docs/PERF.md "Mixture of experts" says why that threshold), else the mma.sync grouped GEMM;
// KILN_MOE_EXPERTS=gemm, wgmma (the sm_90a grouped GEMM) or gemv overrides by_rows (read once).
enum class MoeExperts { by_rows, grouped_gemm, grouped_gemm_sm90, gather_gemv };
constexpr int64_t kMoeGemvMaxTokens = 16;

// Device bytes of moe_mlp's scratch for T tokens of w's shape.
size_t moe_scratch_bytes(const MoeWeights& w, int64_t hidden, int64_t T);

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights);
// scratch: a device buffer of at least moe_scratch_bytes(w, H, T) bytes.
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, void* scratch, size_t scratch_bytes,
             MoeExperts experts = MoeExperts::by_rows);

}  // namespace kiln::ops::cuda
