// The GEMV launchers over a weight format (gemv_weights.cuh), shared by gemv.cu (bf16 W) and gemv_fp8.cu
// (block-FP8 W), one build unit per format. gemv.cu validates every call (gemv.h) and builds the
// GemvParams; these pick the kernel for (format, epilogue, tail, M, config) and launch it.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "ops/cuda/gemv_kernels.cuh"
#include "ops/cuda/norm_row.cuh"

namespace kiln::cuda::gemv_detail {
// Internal linkage: each build unit (weight format) has its own kernels and counters, which launches on one
// stream never share at once anyway.
namespace {

// Blocks of the current gemv_add_rms_norm launch that have stored their outputs; the last one resets it to
// 0 (gemv.h: why one word per device is enough). Module globals are per device.
__device__ unsigned int g_norm_blocks_done = 0;

// Add + RMSNorm (gemv.h): counts the block done; the last block runs the add + RMSNorm over the M rows of
// tmp.
template <int kMinBlocks>
struct NormTail {
  using Args = NoArgs;
  static constexpr int kTcMinBlocks = kMinBlocks;  // gemv.h: gemv_tail_min_blocks
  template <int M, int R>
  static __device__ __forceinline__ void finish(const GemvParams& p, const Args&, int64_t, int warps,
                                                int tid) {
    __shared__ bool last;
    __threadfence();  // release: this thread's tmp stores are visible device-wide before the block counts
    __syncthreads();  // ... and every thread of the block has fenced its stores
    if (tid == 0) {
      last = atomicAdd(&g_norm_blocks_done, 1u) == gridDim.x - 1;
      if (last) atomicExch(&g_norm_blocks_done, 0u);  // every block has counted: ready for the next launch
      __threadfence();  // acquire: the other blocks' tmp stores before this block's reads of tmp
    }
    __syncthreads();
    if (!last) return;
    const int lane = tid % 32;
    for (int m = tid / 32; m < M; m += warps) {
      rms_norm_row<true, 0>(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.out) + m * p.ldo),
                            reinterpret_cast<uint4*>(p.residual + m * p.ldr), p.norm_w,
                            reinterpret_cast<uint4*>(p.normed + m * p.ldn), p.n / 8, p.eps, true, lane);
    }
  }
};

using GemvKernel = void (*)(GemvParams, NoArgs);

// The kernel of config cfg for M = m (1..8): FMA, or tensor cores with cfg.tiles tiles (more than one only
// without a tail: gemv_fusable; the prologue, N, runs any: gemv_norm_in_fusable).
template <class WF, GemvEpilogue E, class Tail = PlainTail, bool N = false>
GemvKernel kernel_for(int64_t m, GemvConfig cfg) {
  if constexpr (!WF::kTensorCores) {  // the FMA kernel only (the e4m3 x 16 formats)
    KILN_CHECK(!cfg.tensor_cores && gemv_fusable(cfg), "gemv: this weight format runs the FMA kernel only");
    return kFmaKernels<E, Tail, N, WF>[m - 1];
  } else {
    static constexpr GemvKernel mma[kGemvMaxM] = {
        gemv_tc_kernel<1, E, Tail, N, 1, WF>, gemv_tc_kernel<2, E, Tail, N, 1, WF>,
        gemv_tc_kernel<3, E, Tail, N, 1, WF>, gemv_tc_kernel<4, E, Tail, N, 1, WF>,
        gemv_tc_kernel<5, E, Tail, N, 1, WF>, gemv_tc_kernel<6, E, Tail, N, 1, WF>,
        gemv_tc_kernel<7, E, Tail, N, 1, WF>, gemv_tc_kernel<8, E, Tail, N, 1, WF>};
    if constexpr (std::is_same_v<Tail, PlainTail>) {
      static constexpr GemvKernel mma2[kGemvMaxM] = {
          gemv_tc_kernel<1, E, Tail, N, 2, WF>, gemv_tc_kernel<2, E, Tail, N, 2, WF>,
          gemv_tc_kernel<3, E, Tail, N, 2, WF>, gemv_tc_kernel<4, E, Tail, N, 2, WF>,
          gemv_tc_kernel<5, E, Tail, N, 2, WF>, gemv_tc_kernel<6, E, Tail, N, 2, WF>,
          gemv_tc_kernel<7, E, Tail, N, 2, WF>, gemv_tc_kernel<8, E, Tail, N, 2, WF>};
      static constexpr GemvKernel mma4[kGemvMaxM] = {
          gemv_tc_kernel<1, E, Tail, N, 4, WF>, gemv_tc_kernel<2, E, Tail, N, 4, WF>,
          gemv_tc_kernel<3, E, Tail, N, 4, WF>, gemv_tc_kernel<4, E, Tail, N, 4, WF>,
          gemv_tc_kernel<5, E, Tail, N, 4, WF>, gemv_tc_kernel<6, E, Tail, N, 4, WF>,
          gemv_tc_kernel<7, E, Tail, N, 4, WF>, gemv_tc_kernel<8, E, Tail, N, 4, WF>};
      if (cfg.tensor_cores && cfg.tiles == 2) return mma2[m - 1];
      if (cfg.tensor_cores && cfg.tiles == 4) return mma4[m - 1];
    }
    KILN_CHECK(gemv_fusable(cfg), "gemv: the fused forms run one-tile configs only, got ", cfg.tiles,
               " tiles");
    return cfg.tensor_cores ? mma[m - 1] : kFmaKernels<E, Tail, N, WF>[m - 1];
  }
}

template <class WF>
GemvKernel plain_kernel(int64_t m, GemvEpilogue epi, GemvConfig cfg) {
  return epi == GemvEpilogue::bf16  ? kernel_for<WF, GemvEpilogue::bf16>(m, cfg)
         : epi == GemvEpilogue::f32 ? kernel_for<WF, GemvEpilogue::f32>(m, cfg)
                                    : kernel_for<WF, GemvEpilogue::silu_mul>(m, cfg);
}

// gemv (gemv.h), p validated.
template <class WF>
void launch_gemv(const GemvParams& p, int64_t m, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream,
                 bool pdl) {
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? p.n / 2 : p.n;
  const int64_t rows = gemv_block_rows(cfg, m), per_block = epi == GemvEpilogue::silu_mul ? rows / 2 : rows;
  const int64_t blocks = (out_cols + per_block - 1) / per_block;
  KILN_CHECK(blocks <= 0x7fffffff, "gemv: N too large");
  launch(
      {.grid = dim3(unsigned(blocks)), .block = dim3(unsigned(cfg.warps * 32)), .stream = stream, .pdl = pdl},
      plain_kernel<WF>(m, epi, cfg), p, NoArgs{});
}

// gemv_add_rms_norm (gemv.h), p validated; min_blocks: gemv_tail_min_blocks().
template <class WF>
void launch_gemv_add_rms_norm(const GemvParams& p, int64_t m, GemvConfig cfg, int min_blocks,
                              cudaStream_t stream, bool pdl) {
  const int64_t rows = gemv_block_rows(cfg, m), blocks = (p.n + rows - 1) / rows;
  KILN_CHECK(blocks <= 0x7fffffff, "gemv_add_rms_norm: N too large");
  GemvKernel kern = nullptr;
  if constexpr (WF::kTensorCores) {
    kern = cfg.tensor_cores && min_blocks == 3 ? kernel_for<WF, GemvEpilogue::bf16, NormTail<3>>(m, cfg)
                                               : kernel_for<WF, GemvEpilogue::bf16, NormTail<0>>(m, cfg);
  } else {  // an FMA-only format: the cap is the tensor-core kernel's, so one set of kernels
    kern = kernel_for<WF, GemvEpilogue::bf16, NormTail<0>>(m, cfg);
  }
  launch(
      {.grid = dim3(unsigned(blocks)), .block = dim3(unsigned(cfg.warps * 32)), .stream = stream, .pdl = pdl},
      kern, p, NoArgs{});
}

// Resident blocks of `kern` on the whole current device (SMs x blocks per SM) for this block size and
// shared memory, asked of the driver once per (device, kernel, block, smem): the launch is on decode's hot
// path.
inline int64_t norm_in_wave(GemvKernel kern, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, GemvKernel, int, size_t>, int64_t> waves;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, kern, threads, smem);
  if (const auto it = waves.find(key); it != waves.end()) return it->second;
  int sms = 0, per_sm = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
  return waves[key] = int64_t(sms) * std::max(per_sm, 1);
}

// gemv_norm_in (gemv.h), p validated; groups_per_block resolved (0: one wave of resident blocks).
template <class WF>
void launch_gemv_norm_in(const GemvParams& p, int64_t m, GemvEpilogue epi, GemvConfig cfg,
                         int groups_per_block, cudaStream_t stream, bool pdl) {
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? p.n / 2 : p.n;
  const int64_t rows = gemv_block_rows(cfg, m), per_block = epi == GemvEpilogue::silu_mul ? rows / 2 : rows;
  const int64_t groups = (out_cols + per_block - 1) / per_block;
  GemvKernel kern = epi == GemvEpilogue::bf16 ? kernel_for<WF, GemvEpilogue::bf16, PlainTail, true>(m, cfg)
                    : epi == GemvEpilogue::f32
                        ? kernel_for<WF, GemvEpilogue::f32, PlainTail, true>(m, cfg)
                        : kernel_for<WF, GemvEpilogue::silu_mul, PlainTail, true>(m, cfg);
  // Blocks take row groups blockIdx.x, + gridDim.x, ... after their one prologue (gemv_kernels.cuh): one
  // wave of resident blocks by default, else groups_per_block groups each.
  // The kernels' static shared memory (the warps' sums, at most 4 KB, and the prologue's scalars) counts
  // against the 48 KB a launch gets without raising the limit.
  const size_t smem = size_t(norm_in_smem_bytes(m, p.k8));
  if (smem > 40 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int64_t blocks = groups;
  if (groups_per_block > 0) {
    blocks = (groups + groups_per_block - 1) / groups_per_block;
  } else {
    blocks = std::min<int64_t>(groups, norm_in_wave(kern, cfg.warps * 32, smem));
  }
  KILN_CHECK(blocks <= 0x7fffffff, "gemv_norm_in: N too large");
  launch({.grid = dim3(unsigned(blocks)),
          .block = dim3(unsigned(cfg.warps * 32)),
          .smem = smem,
          .stream = stream,
          .pdl = pdl,
          .smem_attr_set = true},
         kern, p, NoArgs{});
}

}  // namespace

// The block-FP8 launchers (gemv_fp8.cu): launch_gemv / launch_gemv_add_rms_norm / launch_gemv_norm_in for
// Fp8Weights, or for the e4m3 x 16 configs Fp8x16Weights / Fp8x16LightWeights (GemvConfig::x16_rows).
void launch_gemv_fp8(const GemvParams& p, int64_t m, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream,
                     bool pdl);
void launch_gemv_add_rms_norm_fp8(const GemvParams& p, int64_t m, GemvConfig cfg, int min_blocks,
                                  cudaStream_t stream, bool pdl);
void launch_gemv_norm_in_fp8(const GemvParams& p, int64_t m, GemvEpilogue epi, GemvConfig cfg,
                             int groups_per_block, cudaStream_t stream, bool pdl);

}  // namespace kiln::cuda::gemv_detail
