// The FP8 GEMM kernel (fp8_gemm_sm90.cuh) with 128-column tiles and 6 stages, for each cluster size (one
// unit per tile width: the units compile in parallel).
#include "ops/cuda/fp8_gemm_sm90.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

KILN_FP8_GEMM_INSTANCE(, 128, 6, 1)
KILN_FP8_GEMM_INSTANCE(, 128, 6, 2)

}  // namespace kiln::cuda::fp8_gemm_sm90
