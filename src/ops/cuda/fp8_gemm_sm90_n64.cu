// The FP8 GEMM kernel (fp8_gemm_sm90.cuh) with 64-column tiles and 8 stages, for each cluster size (one
// unit per tile width: the units compile in parallel).
#include "ops/cuda/fp8_gemm_sm90.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

KILN_FP8_GEMM_INSTANCE(, 64, 8, 1)

}  // namespace kiln::cuda::fp8_gemm_sm90
