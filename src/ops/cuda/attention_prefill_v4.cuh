// Prefill v4 (Hopper, sm_90a): the kernel's parameters and launch entry points, shared by the launcher
// (attention_prefill_v4.cu) and the per-head_dim instantiation units (attention_prefill_v4_d*.cu, which
// include attention_prefill_v4_kernel.cuh).
#pragma once

#include <cuda.h>

#include "ops/cuda/attention_common.cuh"

namespace kiln::cuda {

namespace v4 {
// Block tile: kBM packed query rows (two consumer warpgroups of 64) against kBN keys per pipeline stage.
constexpr int kBM = 128, kBN = 128, kWgRows = 64, kThreads = 384;
// Registers a thread (setmaxnreg): the producer warpgroup gives up what the consumers take; 128 * 56 +
// 256 * 224 = 64512 <= 65536.
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
// Pipeline depth (stages of K and V): D 64 fits 4 beside Q (16 KB); D 128 fits 2 or 3 of 64 KB beside Q
// (32 KB): 3 fill 225 KB of the 227 an sm_90 block may take (KILN_ATTN_V4_STAGES, attention_prefill_v4.cu).
template <int D>
constexpr int max_stages() {
  return D == 128 ? 3 : 4;
}
template <int D>
constexpr size_t smem_bytes(int stages) {
  // 1024 bytes of slack to align the base for the 128-byte swizzle; Q; K and V stages; 4 barriers a stage.
  return 1024 + size_t(kBM) * D * 2 + 2 * size_t(stages) * kBN * D * 2 + 4 * size_t(stages) * 8;
}
static_assert(smem_bytes<128>(max_stages<128>()) <= 232448 && smem_bytes<64>(max_stages<64>()) <= 232448,
              "sm_90's 227 KB of shared memory a block");
}  // namespace v4

struct PrefillV4Params {
  // bf16 K and V caches as 4-D tensors for TMA: dim 0 d (D elements), dims 1 and 2 the row in the page and
  // the KV head in ascending stride order (rows_dim1: the row is dim 1, HND), dim 3 the page; box
  // 64 x page_size rows, 128-byte swizzle. Unused (zero) when use_tma is 0.
  CUtensorMap tmap_k;
  CUtensorMap tmap_v;
  PagedAttnParams p;
  int32_t use_tma = 0;  // 1: tiles wholly inside the context arrive by TMA; other tiles by producer loads
  int32_t rows_dim1 = 0;
  int32_t skip_single = 0;  // skip sequences with q_len == 1 (the decode kernel's)
  int32_t G = 1;            // Hq / Hkv
};

// Instantiated for D in {64, 128} and both cache dtypes (attention_prefill_v4_d64.cu, _d128.cu). overlap:
// the consumers overlap each tile's softmax with the previous tile's P V product (the default); false
// runs the two products of a tile in turn (KILN_ATTN_V4_SERIAL=1, a debugging aid). stages: D 128 2 or 3,
// D 64 4; cfg.smem must be smem_bytes<D>(stages).
template <int D, KvDtype KT>
void launch_prefill_v4_kernel(const LaunchCfg& cfg, const PrefillV4Params& prm, bool overlap, int stages);
// The binary version (cudaFuncAttributes::binaryVersion) of that instantiation's code for the current
// device: 90 only where sm_90a code was built and the device runs it.
template <int D, KvDtype KT>
int prefill_v4_binary_version();

}  // namespace kiln::cuda
