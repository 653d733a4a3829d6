// More Hopper (sm_90a) building blocks, beside sm90.cuh's, written from the PTX ISA: 2-D TMA tile loads
// (plain and multicast to the CTAs of a cluster), the 1-D bulk copy, cluster-scope mbarrier waits and remote
// arrivals, the cluster barrier. Device code for sm_90a only (KILN_SM90A).
#pragma once

#include <cstdint>

#include "ops/cuda/sm90.cuh"

namespace kiln::cuda::sm90 {

#ifdef KILN_SM90A

// A 2-D box of the tensor map at `tmap` (a __grid_constant__ kernel parameter) into shared memory at `dst`,
// completing its bytes on the mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same box written to `dst` in every CTA of `cta_mask` (bit i: cluster rank i), each copy completing on
// the mbarrier at offset `bar` of its own CTA.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const void* tmap, int c0, int c1,
                                                      uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], "
      "[%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global `src` into shared `dst`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// A 2-D box from shared memory at `src` to the tensor map's global tensor at (c0, c1) (clipped at its
// edges), in this thread's current bulk group.
__device__ __forceinline__ void tma_store_2d(const void* tmap, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
// Closes this thread's current bulk group of stores.
__device__ __forceinline__ void bulk_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's committed store groups have read their shared memory (it may be rewritten).
__device__ __forceinline__ void bulk_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Waits until this thread's committed store groups are complete.
__device__ __forceinline__ void bulk_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// mbar_wait with cluster-scope acquire: the phase's arrivals include other CTAs' (remote) releases.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// One arrival (cluster-scope release) on the mbarrier at offset `bar` of the CTA of cluster rank `cta`
// (this CTA's own included).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// Every thread of the cluster arrives (release) and waits (acquire): call it before any thread exits. The
// non-.aligned forms: a warp may arrive diverged.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

#endif  // KILN_SM90A

}  // namespace kiln::cuda::sm90
