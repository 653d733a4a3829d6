// The expert kernels behind moe_experts_launch (moe.h), one unit each: internal to src/ops/cuda.
#pragma once

#include "ops/cuda/moe.h"

namespace kiln::cuda {

// Both: gate_up with SiLU-and-multiply into b.act, then down into b.y (moe.h step 4).
void moe_grouped_gemm_launch(const uint16_t* x, int64_t xs, const uint16_t* gate_up, const uint16_t* down,
                             const MoeShape& s, const MoeBuffers& b, cudaStream_t stream);
// sm_90a wgmma; only where moe_grouped_gemm_sm90_applies() (an sm_90 device running the build's sm_90a code).
void moe_grouped_gemm_sm90_launch(const uint16_t* x, int64_t xs, const uint16_t* gate_up,
                                  const uint16_t* down, const MoeShape& s, const MoeBuffers& b,
                                  cudaStream_t stream);
void moe_gather_gemv_launch(const uint16_t* x, int64_t xs, const uint16_t* gate_up, const uint16_t* down,
                            const MoeShape& s, const MoeBuffers& b, cudaStream_t stream);

}  // namespace kiln::cuda
