// Fused QKV GEMV + attention preparation, head_dim 128, block-FP8 weights (gemv_attn_prep_kernel.cuh), the
// e4m3 formats (gemv.h; e4m3 x 16 in both of its forms).
#include "ops/cuda/gemv_attn_prep_kernel.cuh"

namespace kiln::cuda {
void launch_gemv_attn_prep_fp8_d128(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                                    GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl) {
  using namespace gemv_detail;
  if (cfg.e4m3x16 && cfg.x16_rows == 4)
    return gemv_attn_prep_detail::launch_d<128, Fp8x16LightWeights>(g, p, m, cfg, capped, stream, pdl);
  if (cfg.e4m3x16)
    return gemv_attn_prep_detail::launch_d<128, Fp8x16Weights>(g, p, m, cfg, capped, stream, pdl);
  gemv_attn_prep_detail::launch_d<128, Fp8Weights>(g, p, m, cfg, capped, stream, pdl);
}
}  // namespace kiln::cuda
