// Fused QKV GEMV + attention preparation, head_dim 128, block-FP8 weights (gemv_attn_prep_kernel.cuh), both
// e4m3 formats (gemv.h).
#include "ops/cuda/gemv_attn_prep_kernel.cuh"

namespace kiln::cuda {
void launch_gemv_attn_prep_fp8_d128(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                                    GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl) {
  if (cfg.e4m3x16)
    return gemv_attn_prep_detail::launch_d<128, gemv_detail::Fp8x16Weights>(g, p, m, cfg, capped, stream,
                                                                            pdl);
  gemv_attn_prep_detail::launch_d<128, gemv_detail::Fp8Weights>(g, p, m, cfg, capped, stream, pdl);
}
}  // namespace kiln::cuda
