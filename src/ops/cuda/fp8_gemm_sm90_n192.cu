// The FP8 GEMM kernel (fp8_gemm_sm90.cuh) with 192-column tiles and 5 stages (one unit per instantiation:
// the units compile in parallel).
#include "ops/cuda/fp8_gemm_sm90.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

template void launch<192, 5>(const Params&, int, cudaStream_t);
template bool prepare<192, 5>();

}  // namespace kiln::cuda::fp8_gemm_sm90
