// The GEMV family on block-FP8 weights (gemv.h: "Block-FP8 weights"): the kernels of gemv_kernels.cuh over
// Fp8Weights, and the FMA kernel over Fp8x16Weights / Fp8x16LightWeights for the e4m3 x 16 configs (8 / 4
// rows a block at M <= 2: GemvConfig::x16_rows), in a build unit of their own.
#include "ops/cuda/gemv_launch.cuh"

namespace kiln::cuda::gemv_detail {

void launch_gemv_fp8(const GemvParams& p, int64_t m, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream,
                     bool pdl) {
  if (cfg.e4m3x16 && cfg.x16_rows == 4) return launch_gemv<Fp8x16LightWeights>(p, m, epi, cfg, stream, pdl);
  if (cfg.e4m3x16) return launch_gemv<Fp8x16Weights>(p, m, epi, cfg, stream, pdl);
  launch_gemv<Fp8Weights>(p, m, epi, cfg, stream, pdl);
}

void launch_gemv_add_rms_norm_fp8(const GemvParams& p, int64_t m, GemvConfig cfg, int min_blocks,
                                  cudaStream_t stream, bool pdl) {
  if (cfg.e4m3x16 && cfg.x16_rows == 4)
    return launch_gemv_add_rms_norm<Fp8x16LightWeights>(p, m, cfg, min_blocks, stream, pdl);
  if (cfg.e4m3x16) return launch_gemv_add_rms_norm<Fp8x16Weights>(p, m, cfg, min_blocks, stream, pdl);
  launch_gemv_add_rms_norm<Fp8Weights>(p, m, cfg, min_blocks, stream, pdl);
}

void launch_gemv_norm_in_fp8(const GemvParams& p, int64_t m, GemvEpilogue epi, GemvConfig cfg,
                             int groups_per_block, cudaStream_t stream, bool pdl) {
  if (cfg.e4m3x16 && cfg.x16_rows == 4)
    return launch_gemv_norm_in<Fp8x16LightWeights>(p, m, epi, cfg, groups_per_block, stream, pdl);
  if (cfg.e4m3x16) return launch_gemv_norm_in<Fp8x16Weights>(p, m, epi, cfg, groups_per_block, stream, pdl);
  launch_gemv_norm_in<Fp8Weights>(p, m, epi, cfg, groups_per_block, stream, pdl);
}

}  // namespace kiln::cuda::gemv_detail
