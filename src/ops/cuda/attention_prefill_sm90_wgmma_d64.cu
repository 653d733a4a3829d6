// Prefill v4 instantiations for head_dim 64 (bf16 and fp8 caches): one build unit per head_dim.
#include "ops/cuda/attention_prefill_sm90_wgmma_kernel.cuh"

namespace kiln::cuda {

template void launch_prefill_sm90_kernel<64, KvDtype::bf16>(const LaunchCfg&, const PrefillSm90Params&, bool);
template void launch_prefill_sm90_kernel<64, KvDtype::f8e4m3>(const LaunchCfg&, const PrefillSm90Params&,
                                                              bool);
template int prefill_sm90_binary_version<64, KvDtype::bf16>();
template int prefill_sm90_binary_version<64, KvDtype::f8e4m3>();

}  // namespace kiln::cuda
