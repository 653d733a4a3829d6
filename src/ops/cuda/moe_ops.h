// Tensor-level CUDA entry points of ops/moe.h, called by its dispatchers (src/ops/moe.cpp) after they have
// validated shapes, dtypes and devices. On kiln::cuda::current_stream(), no host synchronisation.
#pragma once

#include <cstddef>

#include "kiln/tensor.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace kiln::ops::cuda {

// Which expert kernels moe_mlp runs (moe.h step 4). by_rows: the gather GEMV for T <= kMoeGemvMaxTokens,
// else the wgmma grouped GEMM where it applies (an sm_90 device running sm_90a code), else the mma.sync
// one; KILN_MOE_EXPERTS=gemm, wgmma or gemv overrides by_rows (read once). The threshold: on the H100
// (docs/PERF.md "Mixture of experts") the GEMV beats the wgmma GEMM up to T = 16 by 17-22 % and ties it at
// T = 64 (509 vs 520 us for 30B-A3B's experts); the mma.sync GEMM is slower than both there. Block-FP8
// experts run the gather GEMV under by_rows whatever KILN_MOE_EXPERTS says; an explicit other kernel is
// an error for them.
enum class MoeExperts { by_rows, grouped_gemm, grouped_gemm_sm90, gather_gemv };
constexpr int64_t kMoeGemvMaxTokens = 64;
// Up to this many tokens the gather GEMV's down projection and the combine run as one kernel (the same
// bits; one launch and the y round trip fewer a layer). Batch 1 until measured above it.
constexpr int64_t kMoeFusedCombineMaxTokens = 1;

// Device bytes of moe_mlp's scratch for T tokens of w's shape.
size_t moe_scratch_bytes(const MoeWeights& w, int64_t hidden, int64_t T);

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights);
// scratch: a device buffer of at least moe_scratch_bytes(w, H, T) bytes.
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, void* scratch, size_t scratch_bytes,
             MoeExperts experts = MoeExperts::by_rows);
// True when moe_mlp_norm_in takes a ResidualNorm for T tokens of hidden size H (the router's prologue).
bool moe_norm_in_applies(int64_t T, int64_t H);
// moe_mlp after add_rms_norm(in->delta, in->residual, in->weight, in->eps, in->normed), the add and the norm
// in the router's launch (moe.h MoeNormIn), bitwise the two ops; x must be in->normed (written here, then
// read by the experts). in nullptr: moe_mlp. The tensors validated by ops/moe.cpp: 16-byte aligned, row
// strides multiples of 8, moe_norm_in_applies.
void moe_mlp_norm_in(const ResidualNorm* in, const Tensor& x, const MoeWeights& w, const Tensor& out,
                     void* scratch, size_t scratch_bytes, MoeExperts experts = MoeExperts::by_rows);

}  // namespace kiln::ops::cuda
