// Fused QKV GEMV + attention preparation, head_dim 64 (gemv_attn_prep_kernel.cuh).
#include "ops/cuda/gemv_attn_prep_kernel.cuh"

namespace kiln::cuda {
void launch_gemv_attn_prep_d64(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                               GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl) {
  gemv_attn_prep_detail::launch_d<64, gemv_detail::Bf16Weights>(g, p, m, cfg, capped, stream, pdl);
}
}  // namespace kiln::cuda
