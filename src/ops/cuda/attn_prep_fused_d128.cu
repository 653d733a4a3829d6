// Fused attention preparation, head_dim 128: {bf16, f16} activations x {bf16, f16, fp8} cache x {decode,
// prefill}.
#include "ops/cuda/attn_prep_fused.cuh"

namespace kiln::cuda {
void launch_attn_prep_fused_d128(const AttnPrepParams& p, FusedKernel k, cudaStream_t stream) {
  attn::launch_fused_d<128>(p, k, stream);
}
}  // namespace kiln::cuda
