// The FP8 GEMM kernel (fp8_gemm_sm90.cuh) with 128-column tiles and 6 stages (one unit per instantiation:
// the units compile in parallel).
#include "ops/cuda/fp8_gemm_sm90.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

template void launch<128, 6>(const Params&, int, cudaStream_t);
template bool prepare<128, 6>();

}  // namespace kiln::cuda::fp8_gemm_sm90
