// Shared CUDA helpers for every kernel family: error checks with source locations, the one launch
// helper (stream, dynamic shared memory, optional PDL), and 16-byte vector types.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kiln/cuda_check.h"
#include "kiln/error.h"

namespace kiln::cuda {

struct LaunchCfg {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  bool pdl = false;  // programmatic dependent launch: may start before the previous kernel ends
  // The kernel's dynamic-smem limit was already raised (cudaFuncSetAttribute once, outside graph capture):
  // launch() then leaves it alone, so the launch is capture-safe and costs no extra driver call.
  bool smem_attr_set = false;
};

// The kernel's static shared memory (cudaFuncGetAttributes, cached per kernel: it is fixed at compile time).
size_t kernel_static_smem(const void* kernel);

// Launches kernel<<<cfg>>>(args...) through cudaLaunchKernelEx; raises the dynamic shared memory limit where
// static + dynamic pass the 48 KB a block gets without opting in (a kernel's default dynamic limit is 48 KB
// less its static part, so 40 KB static + 16 KB dynamic is refused with "invalid argument"); checks the
// launch.
template <typename... KArgs, typename... Args>
void launch(const LaunchCfg& cfg, void (*kernel)(KArgs...), Args&&... args) {
  constexpr size_t kDefaultSmem = 48 * 1024;
  if (cfg.smem > 0 && !cfg.smem_attr_set &&
      (cfg.smem > kDefaultSmem ||
       cfg.smem + kernel_static_smem(reinterpret_cast<const void*>(kernel)) > kDefaultSmem)) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(cfg.smem)));
  }
  cudaLaunchConfig_t lc{};
  lc.gridDim = cfg.grid;
  lc.blockDim = cfg.block;
  lc.dynamicSmemBytes = cfg.smem;
  lc.stream = cfg.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = cfg.pdl ? 1 : 0;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, std::forward<Args>(args)...));
}

// In a kernel launched with pdl: wait for the previous kernel's writes / let the next one start.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

#ifdef __CUDACC__  // device code only (host files include this header for launch())
// Asynchronous global -> shared copies (sm_80+): 16 bytes bypass L1 (.cg); 4 and 8 bytes go through it.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

}  // namespace kiln::cuda
