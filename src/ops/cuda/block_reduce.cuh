// Block-wide float reductions for kernels whose block is kThreads threads (a multiple of 32): every thread
// calls, every thread gets the result. Order: a warp xor butterfly 16, 8, 4, 2, 1, then the warps' values in
// warp order (deterministic). `sm` holds kThreads / 32 floats; consecutive calls may share it (the first
// barrier of a call waits until every thread has read the previous result).
#pragma once

namespace kiln::cuda {

template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* sm) {
  for (int o = 16; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) t += sm[w];
  return t;
}

template <int kThreads>
__device__ __forceinline__ float block_max(float v, float* sm) {
  for (int o = 16; o >= 1; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = v;
  __syncthreads();
  float t = sm[0];
  for (int w = 1; w < kThreads / 32; ++w) t = fmaxf(t, sm[w]);
  return t;
}

}  // namespace kiln::cuda
