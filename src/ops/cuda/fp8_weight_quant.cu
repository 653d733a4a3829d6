// The GPU's online weight quantizer (fp8_weight_quant.h): bitwise ops::cpu::quantize_weight_fp8.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_weight_quant.h"
#include "ops/cuda/vec.cuh"
#include "ops/fp8.h"

namespace kiln::cuda {
namespace {

constexpr int kBlock = 128;          // weight_block_size [128, 128]
constexpr float kE4m3Max = 448.0f;   // the largest finite e4m3 value
constexpr float kWeightEps = 1e-4f;  // DeepGEMM's per_block_cast_to_fp8 clamp (the CPU's)
constexpr int kThreads = kBlock;     // a thread a column of the block
constexpr int kWarps = kThreads / 32;

struct QuantParams {
  const uint16_t* w;   // bf16 [n, k] contiguous
  uint8_t* q;          // e4m3 [n, k] contiguous
  float* scale;        // f32 [ceil(n/128), ceil(k/128)] contiguous
  int32_t* nonfinite;  // i32 [1]
  int64_t n, k;
  int32_t tag;
};

// Grid: (ceil(k / 128), ceil(n / 128)); block: 128 threads. Block (x, y) owns the weight block of rows
// [128 y, 128 y + 128) and columns [128 x, 128 x + 128); thread c its column 128 x + c (a warp reads 64
// contiguous bytes of a row). Pass 1: the column's max |w| (max is exact: any order gives the CPU's value),
// a warp butterfly, the 4 warps' maxima through shared memory; then a, m and the scale as the CPU computes
// them (__fdiv_rn, __fmul_rn); pass 2 re-reads the column (L1/L2) and writes q with ops/fp8.h's encoder,
// the CPU's own function.
__global__ void __launch_bounds__(kThreads)
    quantize_weight_fp8_kernel(const __grid_constant__ QuantParams p) {
  __shared__ float warp_max[kWarps];
  const int c = int(threadIdx.x);
  const int64_t col = int64_t(blockIdx.x) * kBlock + c, r0 = int64_t(blockIdx.y) * kBlock;
  const int64_t r1 = min(p.n, r0 + kBlock);
  const bool in = col < p.k;
  float amax = 0.0f;
  bool finite = true;
  if (in)
    for (int64_t r = r0; r < r1; ++r) {
      const float v = bf16_bits_to_f32(p.w[r * p.k + col]);
      finite = finite && isfinite(v);
      amax = fmaxf(amax, fabsf(v));
    }
  if (!finite) atomicMin(p.nonfinite, p.tag);
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (c % 32 == 0) warp_max[c / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kWarps; ++i) amax = fmaxf(amax, warp_max[i]);
  const float a = fmaxf(amax, kWeightEps);
  const float m = __fmul_rn(__fdiv_rn(1.0f, a), kE4m3Max);  // torch's 448.0 / amax: reciprocal, then product
  if (c == 0) p.scale[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = __fdiv_rn(a, kE4m3Max);
  if (!in) return;
  for (int64_t r = r0; r < r1; ++r)
    p.q[r * p.k + col] = ::kiln::f32_to_e4m3(__fmul_rn(bf16_bits_to_f32(p.w[r * p.k + col]), m));
}

}  // namespace

void quantize_weight_fp8(const uint16_t* w, int64_t n, int64_t k, uint8_t* q, float* scale,
                         int32_t* nonfinite, int32_t tag, cudaStream_t stream) {
  KILN_CHECK(n >= 0 && k >= 0, "quantize_weight_fp8: shape [", n, ", ", k, "]");
  if (n == 0 || k == 0) return;
  const QuantParams p{.w = w, .q = q, .scale = scale, .nonfinite = nonfinite, .n = n, .k = k, .tag = tag};
  launch({.grid = dim3(unsigned((k + kBlock - 1) / kBlock), unsigned((n + kBlock - 1) / kBlock)),
          .block = dim3(kThreads),
          .stream = stream},
         quantize_weight_fp8_kernel, p);
}

}  // namespace kiln::cuda
