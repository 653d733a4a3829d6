// launch()'s one host-side fact: a kernel's static shared memory, read once per kernel (common.cuh).
#include <mutex>
#include <unordered_map>

#include "ops/cuda/common.cuh"

namespace kiln::cuda {

size_t kernel_static_smem(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<const void*, size_t> known;
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = known.find(kernel); it != known.end()) return it->second;
  cudaFuncAttributes a{};
  KILN_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  known.emplace(kernel, a.sharedSizeBytes);
  return a.sharedSizeBytes;
}

}  // namespace kiln::cuda
