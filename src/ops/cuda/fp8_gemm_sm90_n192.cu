// The FP8 GEMM kernel (fp8_gemm_sm90.cuh) with 192-column tiles, in each of its configs (stages, cluster
// size, epilogue); one unit per tile width, so the units compile in parallel.
#include "ops/cuda/fp8_gemm_sm90.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

KILN_FP8_GEMM_INSTANCE(, 192, 5, 1, false)
KILN_FP8_GEMM_INSTANCE(, 192, 5, 2, false)
KILN_FP8_GEMM_INSTANCE(, 192, 4, 2, true)

}  // namespace kiln::cuda::fp8_gemm_sm90
