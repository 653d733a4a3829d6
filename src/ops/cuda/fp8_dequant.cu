// Block-FP8 weights to bf16 (ops/cuda/fp8_dequant.h). Runs once per weight at load: plain and bitwise.
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/vec.cuh"
#include "ops/fp8.h"

namespace kiln::ops::cuda {
namespace {

constexpr int64_t kBlock = 128;  // weight_block_size [128, 128]

struct DequantParams {
  const uint8_t* q;    // [N, K], row stride ldq
  const float* scale;  // [ceil(N/128), ceil(K/128)]
  uint16_t* out;       // [N, K] contiguous
  int64_t ldq, N, K, kb;
};

// Mapping: grid-stride over the N * K elements, one element per thread per step; the thread reads its e4m3
// byte and its block's scale (shared by 128 x 128 elements: L1/L2 hits) and writes one bf16.
__global__ void dequantize_fp8_kernel(const __grid_constant__ DequantParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.N * p.K;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / p.K, k = i % p.K;
    const float w =
        __fmul_rn(::kiln::e4m3_to_f32(p.q[n * p.ldq + k]), p.scale[(n / kBlock) * p.kb + k / kBlock]);
    p.out[i] = uint16_t(::kiln::cuda::f32_to_bf16_bits(w));
  }
}

}  // namespace

void dequantize_fp8(const Tensor& weight, const Tensor& scale, const Tensor& out) {
  const int64_t N = weight.shape[0], K = weight.shape[1];
  if (N * K == 0) return;
  const DequantParams p{.q = weight.ptr<uint8_t>(),
                        .scale = scale.ptr<float>(),
                        .out = out.ptr<uint16_t>(),
                        .ldq = weight.stride[0],
                        .N = N,
                        .K = K,
                        .kb = (K + kBlock - 1) / kBlock};
  const int64_t blocks = (N * K + 255) / 256;
  ::kiln::cuda::launch({.grid = dim3(unsigned(blocks < 8192 ? blocks : 8192)),
                        .block = dim3(256),
                        .stream = ::kiln::cuda::current_stream()},
                       dequantize_fp8_kernel, p);
}

}  // namespace kiln::ops::cuda
