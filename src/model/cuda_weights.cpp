// Random weights generated on the GPU (`--load-format random`): the values of fill_random_weight, bit for
// bit, written by a kernel instead of a host loop plus a multi-GB upload.
#include "kiln/error.h"
#include "model/weights.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/elementwise.h"
#endif

namespace kiln {

void fill_random_weight_cuda(const WeightSpec& spec, uint64_t seed, void* device_out) {
#ifdef KILN_HAVE_CUDA
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  const RandomWeightParams rp = random_weight_params(spec, seed);
  cuda::fill_uniform_splitmix_bf16(device_out, n, rp.key, rp.center, rp.half_width, nullptr);
  const cudaError_t e = cudaStreamSynchronize(nullptr);  // the loader's later copies are synchronous too
  KILN_CHECK(e == cudaSuccess, "random weight fill for ", spec.name, ": ", cudaGetErrorString(e));
#else
  (void)spec, (void)seed, (void)device_out;
  KILN_FAIL("kiln was built without CUDA: cannot fill weights on a GPU");
#endif
}

void fill_random_weight_range_cuda(const WeightSpec& spec, uint64_t seed, int64_t offset, int64_t n,
                                   void* device_out) {
#ifdef KILN_HAVE_CUDA
  const RandomWeightParams rp = random_weight_params(spec, seed);
  cuda::fill_uniform_splitmix_bf16(device_out, n, rp.key + uint64_t(offset), rp.center, rp.half_width,
                                   nullptr);
#else
  (void)spec, (void)seed, (void)offset, (void)n, (void)device_out;
  KILN_FAIL("kiln was built without CUDA: cannot fill weights on a GPU");
#endif
}

}  // namespace kiln
