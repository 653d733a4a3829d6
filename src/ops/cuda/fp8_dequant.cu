// Block-FP8 weights to bf16 (ops/cuda/fp8_dequant.h): once per weight at load (path (c)), or before a bf16
// GEMM on GemmEngine's scratch (gemm.h). Plain and bitwise.
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
  ::kiln::cuda::dequantize_fp8(weight.data, weight.stride[0], scale.ptr<float>(), out.data, weight.shape[0],
                               weight.shape[1], ::kiln::cuda::current_stream());
}

}  // namespace kiln::ops::cuda

namespace kiln::cuda {

void dequantize_fp8(const void* q, int64_t ldq, const float* scale, void* out, int64_t n, int64_t k,
                    cudaStream_t stream) {
  if (n * k == 0) return;
  const ops::cuda::DequantParams p{.q = static_cast<const uint8_t*>(q),
                                   .scale = scale,
                                   .out = static_cast<uint16_t*>(out),
                                   .ldq = ldq,
                                   .N = n,
                                   .K = k,
                                   .kb = (k + ops::cuda::kBlock - 1) / ops::cuda::kBlock};
  const int64_t blocks = (n * k + 255) / 256;
  launch({.grid = dim3(unsigned(blocks < 8192 ? blocks : 8192)), .block = dim3(256), .stream = stream},
         ops::cuda::dequantize_fp8_kernel, p);
}

}  // namespace kiln::cuda
