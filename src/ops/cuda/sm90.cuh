// Hopper (sm_90a) building blocks written from the PTX ISA: mbarriers, TMA tile loads, the async-proxy
// fence, named barriers, setmaxnreg, and the wgmma shared-memory matrix descriptor. Every function here is
// device code for sm_90a only; KILN_SM90A is defined where it may be used (elsewhere the kernels that need
// it compile to an empty body and their launchers never run them).
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_SM90A 1
#endif

namespace kiln::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

#ifdef KILN_SM90A

// ---- mbarrier (64-bit object in shared memory) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the other threads and to the async proxy (TMA complete_tx);
// follow with a block-wide barrier.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also announces `bytes` of asynchronous (TMA) writes the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Blocks until the phase with the given parity has completed (acquire). A fresh barrier is in phase 0:
// waiting for parity 1 returns at once (the "previous" phase counts as complete).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA: a 3-D or 4-D box of the tensor map at `tmap` (a __grid_constant__ kernel parameter) into shared
// memory at `dst`, completing its bytes on the mbarrier `bar` (their expect_tx was announced). ----
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* tmap, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Generic-proxy writes to shared memory (st.shared) made visible to the async proxy (wgmma operand reads,
// TMA): every writing thread runs it after its stores, before the barrier that hands the data over.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32). The non-.aligned
// form: a warp may reach it diverged (the producer's thread 0 issues TMA while its warp-mates run ahead).
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` (of `threads` threads) without waiting.
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register rebalancing between warpgroups (every warp of the warpgroup executes it).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- wgmma ordering ----
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

#endif  // KILN_SM90A

// ---- the wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format") ----
//   bits  0-13: start address >> 4 (shared window, 18-bit address)
//   bits 16-29: leading-dimension byte offset >> 4
//   bits 32-45: stride-dimension byte offset >> 4
//   bits 49-51: base offset (0: every swizzle pattern we use starts on a 1024-byte boundary)
//   bits 62-63: swizzle mode, 1 = 128-byte swizzle
// Our tiles are all "128-byte swizzled rows": a tile of R rows x 64 bf16 (128 bytes a row) occupies R * 128
// contiguous bytes, 1024-byte aligned, and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the
// Swizzle<3,4,3> pattern TMA's SWIZZLE_128B writes). A wider row (D = 128) is two such tiles ("column
// blocks") one after the other.
//   K-major operand (Q and K: the reduction dimension d runs along the row): SBO = 1024 (8 rows to the next
//     8), LBO unused (1). A k16 step inside a column block advances the start address by 32 bytes.
//   MN-major operand (V: the reduction dimension, keys, runs down the rows; N = d along the row): SBO = 1024
//     (8 keys to the next 8), LBO = the byte distance between column blocks (d 0-63 -> d 64-127). A k16
//     step advances the start address by 16 rows = 2048 bytes.
// Held as its two 32-bit halves, packed into the 64-bit operand inside the wgmma asm: lo = start address and
// LBO, hi = SBO and the swizzle mode, a constant of the layout. A k-step's offset is then one 32-bit add to
// lo (plus(); the 14-bit address field never carries while shared addresses stay below 256 KB) where a 64-bit
// value took an add with carry and register moves: prefill v4 has 48 fewer SASS instructions and runs 0.1-0.3
// % faster (H200, 2026-12-03, `b40a9c3`;
// bench/results/h200_prefill_wait_staged_inputs_2026-12-03.txt). ptxas still moves both halves to uniform
// registers with R2UR (272 in the kernel, as before).
struct WgmmaDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ WgmmaDesc plus(uint32_t byte_offset) const {
    return {lo + (byte_offset >> 4), hi};
  }
};
__device__ __forceinline__ WgmmaDesc sw128_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return {((smem_addr & 0x3ffff) >> 4) | (((lbo_bytes & 0x3ffff) >> 4) << 16),
          ((sbo_bytes & 0x3ffff) >> 4) | (1u << 30)};
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside a 128-byte-swizzled column block.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return uint32_t(row) * 128u + uint32_t((chunk ^ (row & 7)) << 4);
}

}  // namespace kiln::cuda::sm90
