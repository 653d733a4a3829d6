// The FP8 GEMM kernel (fp8_gemm_sm90.cuh) with 64-column tiles and 8 stages (one unit per instantiation:
// the units compile in parallel).
#include "ops/cuda/fp8_gemm_sm90.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

template void launch<64, 8>(const Params&, int, cudaStream_t);
template bool prepare<64, 8>();

}  // namespace kiln::cuda::fp8_gemm_sm90
