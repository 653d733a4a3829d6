// The fused QKV GEMV + attention-preparation kernels for one head_dim (gemv_attn_prep.h: the contract and
// the scheme); included by gemv_attn_prep_d{64,128}.cu, one build unit per head_dim.
//
// The block that completes head h runs attn::prep_head on it (attn_prep_head.cuh: the mapping), so every
// output byte is attn_prep_decode_kernel's.
#pragma once

#include "ops/cuda/attn_prep_head.cuh"
#include "ops/cuda/gemv_attn_prep.h"
#include "ops/cuda/gemv_kernels.cuh"

// Everything here has internal linkage: each build unit (head_dim) has its own kernels and counters.
namespace kiln::cuda::gemv_attn_prep_detail {
namespace {

using namespace gemv_detail;

// Blocks of head h of the current launch that have stored their qkv outputs; the block that completes the
// head resets its word to 0 (gemv_attn_prep.h). Module globals are per device; each build unit (head_dim)
// has its own array, which launches on one stream never share at once anyway.
__device__ unsigned int g_head_blocks_done[kGemvAttnPrepMaxHeads];

template <int D, int kMinBlocks>
struct AttnPrepTail {
  using Args = AttnPrepParams;
  static constexpr int kTcMinBlocks = kMinBlocks;
  template <int M, int R>
  static __device__ __forceinline__ void finish(const GemvParams&, const AttnPrepParams& a, int64_t base,
                                                int warps, int tid) {
    static_assert(D % R == 0, "a block's rows must lie in one head");
    __shared__ bool last;
    const int h = int(base / D);
    __threadfence();  // release: this thread's qkv stores are visible device-wide before the block counts
    __syncthreads();  // ... and every thread of the block has fenced its stores
    if (tid == 0) {
      last = atomicAdd(&g_head_blocks_done[h], 1u) == unsigned(D / R) - 1;
      if (last) atomicExch(&g_head_blocks_done[h], 0u);  // the head is complete: ready for the next launch
      __threadfence();  // acquire: the head's other blocks' stores before this block's reads
    }
    __syncthreads();
    if (!last) return;
    if (a.cache == CacheKind::fp8) {
      attn::prep_head<M, D, CacheKind::fp8>(a, h, warps * 32, tid);
    } else {
      attn::prep_head<M, D, CacheKind::bf16>(a, h, warps * 32, tid);
    }
  }
};

using PrepKernel = void (*)(GemvParams, AttnPrepParams);

template <int D, int kMinBlocks, class WF>
PrepKernel kernel_for(int64_t m, bool tc) {
  using T = AttnPrepTail<D, kMinBlocks>;
  using F = AttnPrepTail<D, 0>;  // the FMA kernel takes no cap (kTcMinBlocks is the mma kernel's)
  constexpr GemvEpilogue E = GemvEpilogue::bf16;
  if constexpr (!WF::kTensorCores) {  // an FMA-only format (e4m3 x 16): gemv_attn_prep refused tc
    return kFmaKernels<E, F, false, WF>[m - 1];
  } else {
    static constexpr PrepKernel mma[kGemvMaxM] = {
        gemv_tc_kernel<1, E, T, false, 1, WF>, gemv_tc_kernel<2, E, T, false, 1, WF>,
        gemv_tc_kernel<3, E, T, false, 1, WF>, gemv_tc_kernel<4, E, T, false, 1, WF>,
        gemv_tc_kernel<5, E, T, false, 1, WF>, gemv_tc_kernel<6, E, T, false, 1, WF>,
        gemv_tc_kernel<7, E, T, false, 1, WF>, gemv_tc_kernel<8, E, T, false, 1, WF>};
    return tc ? mma[m - 1] : kFmaKernels<E, F, false, WF>[m - 1];
  }
}

// Launches the D-instantiation for weight format WF (p validated by the caller).
template <int D, class WF>
void launch_d(const GemvParams& g, const AttnPrepParams& p, int64_t m, GemvConfig cfg, bool capped,
              cudaStream_t stream, bool pdl) {
  const int64_t blocks = g.n / gemv_block_rows(cfg, m);  // D % rows == 0: whole heads
  const bool tc = cfg.tensor_cores;
  const PrepKernel kern = capped ? kernel_for<D, 3, WF>(m, tc) : kernel_for<D, 0, WF>(m, tc);
  launch(
      {.grid = dim3(unsigned(blocks)), .block = dim3(unsigned(cfg.warps * 32)), .stream = stream, .pdl = pdl},
      kern, g, p);
}

}  // namespace
}  // namespace kiln::cuda::gemv_attn_prep_detail
