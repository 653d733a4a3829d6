// Prefill v4 (Hopper, sm_90a): the kernel's parameters and launch entry points, shared by the launcher
// (attention_prefill_sm90_wgmma.cu) and the per-head_dim instantiation units
// (attention_prefill_sm90_wgmma_d*.cu, which include attention_prefill_sm90_wgmma_kernel.cuh).
#pragma once

#include <cuda.h>

#include "ops/cuda/attention_common.cuh"

namespace kiln::cuda {

namespace prefill_sm90 {
// Block tile: kBM packed query rows (two consumer warpgroups of 64) against kBN keys per pipeline stage.
constexpr int kBM = 128, kBN = 128, kWgRows = 64, kThreads = 384;
// Registers a thread (setmaxnreg): the producer warpgroup gives up what the consumers take, within the
// 384 x 168 = 64512 the block launched with: 128 * 64 + 256 * 216 = 63488. 56 / 224 spilled in the
// producer (its item loop) and measured 0.5 % slower.
constexpr int kProducerRegs = 64, kConsumerRegs = 216;
// Pipeline depth (stages of K and V) beside the two Q buffers (the next work item's Q loads while the
// current one runs): D 128, Q 2 x 32 KB + 2 stages of 64 KB; D 64, Q 2 x 16 KB + 4 stages of 32 KB.
template <int D>
constexpr int stages() {
  return D == 128 ? 2 : 4;
}
// Byte offsets from the 1024-aligned base (the two Q buffers first): K stages, V stages, barriers.
template <int D>
constexpr uint32_t smem_k_offset() {
  return 2 * kBM * D * 2;
}
template <int D>
constexpr uint32_t smem_v_offset() {
  return smem_k_offset<D>() + stages<D>() * kBN * D * 2;
}
template <int D>
constexpr uint32_t smem_bars_offset() {
  return smem_v_offset<D>() + stages<D>() * kBN * D * 2;
}
template <int D>
constexpr size_t smem_bytes() {
  // 1024 bytes of slack to align the base for the 128-byte swizzle; two Q buffers; K and V stages; 4
  // barriers a stage and 2 a Q buffer.
  return 1024 + 2 * size_t(kBM) * D * 2 + 2 * size_t(stages<D>()) * kBN * D * 2 + (4 * stages<D>() + 4) * 8;
}
static_assert(smem_bytes<128>() <= 232448 && smem_bytes<64>() <= 232448,
              "sm_90's 227 KB of shared memory a block");
}  // namespace prefill_sm90

struct PrefillSm90Params {
  // bf16 K and V caches as 4-D tensors for TMA: dim 0 d (D elements), dims 1 and 2 the row in the page and
  // the KV head in ascending stride order (rows_dim1: the row is dim 1, HND), dim 3 the page; box
  // 64 x page_size rows, 128-byte swizzle. Unused (zero) when use_tma is 0.
  CUtensorMap tmap_k;
  CUtensorMap tmap_v;
  // q as the 3-D tensor (d, query head, token), box 64 x G heads x 64 / G tokens (one consumer's 64 packed
  // rows of one column block), 128-byte swizzle. Unused (zero) when use_tma_q is 0.
  CUtensorMap tmap_q;
  PagedAttnParams p;
  int32_t use_tma = 0;    // 1: tiles wholly inside the context arrive by TMA; other tiles by producer loads
  int32_t use_tma_q = 0;  // 1: Q arrives by TMA (G divides 64); 0: the producer threads gather it
  int32_t rows_dim1 = 0;
  int32_t skip_single = 0;  // skip sequences with q_len == 1 (the decode kernel's)
  int32_t G = 1;            // Hq / Hkv
  // The producer thread that issues V's TMA boxes (thread 0 issues K's;
  // attention_prefill_sm90_wgmma_producer.cuh). A parameter rather than a constant: as a compile-time 32,
  // ptxas spilled 4 bytes in the bf16 kernels, and this is the form measured on the H200 (2026-12-02,
  // `164b2c3`; bench/results/h200_decode_cluster_merge_early_combine_2026-12-02.txt).
  int32_t v_issue_thread = 32;
  // The two consumers take turns issuing their products (attention_prefill_sm90_wgmma_kernel.cuh); 0 under
  // KILN_ATTN_PREFILL_NO_PINGPONG=1. A parameter rather than a constant: the compile-time form measured 2.7 %
  // slower at 8192 tokens on the same H200 (2026-12-02, `7c679c9`;
  // bench/results/h200_prefill_pingpong_2026-12-02.txt).
  int32_t pingpong = 1;
};

// Instantiated for D in {64, 128} and both cache dtypes (attention_prefill_sm90_wgmma_d64.cu, _d128.cu).
// overlap: the consumers overlap each tile's softmax with the previous tile's P V product (the default);
// false runs the two products of a tile in turn (KILN_ATTN_PREFILL_SERIAL=1, a debugging aid). cfg.smem must
// be smem_bytes<D>(); cfg.grid is the persistent grid (at most one block an SM: the blocks take the work
// items in a static zigzag order, attention_prefill_sm90_wgmma_kernel.cuh).
template <int D, KvDtype KT>
void launch_prefill_sm90_kernel(const LaunchCfg& cfg, const PrefillSm90Params& prm, bool overlap);
// The binary version (cudaFuncAttributes::binaryVersion) of that instantiation's code for the current
// device: 90 only where sm_90a code was built and the device runs it.
template <int D, KvDtype KT>
int prefill_sm90_binary_version();

}  // namespace kiln::cuda
