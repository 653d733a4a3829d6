// Row argmax (ops/argmax.h). Comparisons only: bitwise the CPU oracle.
#include <cfloat>

#include "ops/cuda/argmax.h"
#include "ops/cuda/common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

struct ArgmaxParams {
  const float* logits;  // [R, V], row stride ld
  int64_t ld, V;
  const int64_t* offsets;  // [V] or null
  int32_t* out;            // [R]
};

// (value, index) b replaces a when it ranks higher: a larger value, or the same value at a lower index.
__device__ __forceinline__ bool ranks_higher(float bv, int64_t bi, float av, int64_t ai) {
  return bv > av || (bv == av && bi < ai);
}

// Grid: (R); block 256 threads, one row. Thread t scans columns t, t + 256, ... keeping its first maximum
// (strict >, NaN read as -inf); the warps then the block reduce (value, index) pairs by ranks_higher, which
// is order-free, so the result is the row's lowest maximal index whatever the reduction's shape.
__global__ void __launch_bounds__(kThreads) argmax_kernel(const __grid_constant__ ArgmaxParams p) {
  pdl_wait();
  const float* x = p.logits + int64_t(blockIdx.x) * p.ld;
  float v = -FLT_MAX;
  int64_t idx = p.V;  // none yet: ranks below every real column
  bool any = false;
  for (int64_t i = threadIdx.x; i < p.V; i += kThreads) {
    float xi = x[i];
    xi = xi == xi ? xi : -__int_as_float(0x7f800000);  // NaN -> -inf
    if (!any || xi > v) v = xi, idx = i, any = true;
  }
  if (!any) v = -__int_as_float(0x7f800000);  // a thread without columns holds (-inf, V): never chosen
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (ranks_higher(ov, oi, v, idx)) v = ov, idx = oi;
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int64_t si[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[warp] = v, si[warp] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (ranks_higher(sv[w], si[w], v, idx)) v = sv[w], idx = si[w];
    // A row of NaN and -inf: every thread holds -inf at its first column, so idx is 0.
    p.out[blockIdx.x] = int32_t(idx + (p.offsets ? p.offsets[idx] : 0));
  }
  pdl_launch_dependents();
}

}  // namespace

void argmax_rows(const float* logits, int64_t ld, int64_t R, int64_t V, const int64_t* offsets, int32_t* out,
                 cudaStream_t stream, bool pdl) {
  KILN_CHECK(R >= 0 && V >= 1 && ld >= V, "argmax_rows: bad shape R ", R, " V ", V, " ld ", ld);
  KILN_CHECK(R <= 0x7fffffff, "argmax_rows: at most 2^31 - 1 rows, got ", R);
  if (R == 0) return;
  const ArgmaxParams p{.logits = logits, .ld = ld, .V = V, .offsets = offsets, .out = out};
  launch({.grid = dim3(unsigned(R)), .block = dim3(kThreads), .stream = stream, .pdl = pdl}, argmax_kernel,
         p);
}

}  // namespace kiln::cuda
