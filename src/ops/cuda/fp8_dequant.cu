// Block-FP8 weights to bf16 (ops/cuda/fp8_dequant.h): once per weight at load (path (c)), before a bf16
// GEMM on GemmEngine's scratch (gemm.h), or a MoE layer's chosen experts before its grouped GEMM (moe.h).
// Plain and bitwise: every element is dequant_bits.
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/vec.cuh"
#include "ops/fp8.h"

namespace kiln::ops::cuda {
namespace {

constexpr int64_t kBlock = 128;  // weight_block_size [128, 128]

// The one rounding of path (c): bf16(f32(q) * scale), RNE.
__device__ __forceinline__ uint16_t dequant_bits(uint8_t q, float scale) {
  return uint16_t(::kiln::cuda::f32_to_bf16_bits(__fmul_rn(::kiln::e4m3_to_f32(q), scale)));
}

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
    p.out[i] = dequant_bits(p.q[n * p.ldq + k], p.scale[(n / kBlock) * p.kb + k / kBlock]);
  }
}

constexpr int kExpertVec = 16;  // e4m3 a thread a step: one 16-byte load, two 16-byte bf16 stores
constexpr int kExpertThreads = 256;

struct ExpertsDequantParams {
  const uint8_t* q;       // e4m3 [L, N, K] contiguous
  const float* scale;     // f32 [L, N / 128, K / 128] contiguous
  uint16_t* out;          // bf16 [L, N, K] contiguous
  const int32_t* counts;  // i32 [expert_begin + L]: local expert l is skipped when counts[expert_begin + l]
                          // == 0; nullptr: none skipped
  int64_t N, K;
  int expert_begin;
};

// Mapping: blockIdx.y = local expert l (the whole block returns when l has no rows); the blocks of one
// expert grid-stride over its N * K / 16 vectors of 16 consecutive elements of a row (K % 128 == 0, so the
// 16 share one block scale); each thread loads 16 e4m3 bytes, writes 16 bf16 (2 x 16 bytes). 32-bit index
// math within an expert (N * K < 2^31, checked at the launcher): a 64-bit division costs ~10x a 32-bit one.
__global__ void dequantize_fp8_experts_kernel(const __grid_constant__ ExpertsDequantParams p) {
  const int64_t l = blockIdx.y;
  if (p.counts && p.counts[p.expert_begin + l] == 0) return;
  const uint32_t K = uint32_t(p.K), vecs_per_row = K / kExpertVec, vecs = uint32_t(p.N) * vecs_per_row,
                 kb = K / kBlock;
  const int64_t elems = p.N * p.K;
  const uint8_t* q = p.q + l * elems;
  const float* scale = p.scale + l * (p.N / kBlock) * kb;
  uint16_t* out = p.out + l * elems;
  for (uint32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < vecs; v += gridDim.x * blockDim.x) {
    const uint32_t n = v / vecs_per_row, k = (v - n * vecs_per_row) * kExpertVec, i = n * K + k;
    const float s = scale[(n / kBlock) * kb + k / kBlock];
    const uint4 raw = *reinterpret_cast<const uint4*>(q + i);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = w[j / 2] >> (16 * (j % 2));
      o[j] = uint32_t(dequant_bits(uint8_t(word & 0xff), s)) |
             (uint32_t(dequant_bits(uint8_t(word >> 8), s)) << 16);
    }
    reinterpret_cast<uint4*>(out + i)[0] = make_uint4(o[0], o[1], o[2], o[3]);
    reinterpret_cast<uint4*>(out + i)[1] = make_uint4(o[4], o[5], o[6], o[7]);
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

namespace kiln::cuda {

void dequantize_fp8_experts(const void* q, const float* scale, void* out, int64_t experts, int64_t n,
                            int64_t k, const int32_t* counts, int64_t expert_begin, cudaStream_t stream) {
  KILN_CHECK(
      n % ops::cuda::kBlock == 0 && k % ops::cuda::kBlock == 0 && n * k < (int64_t(1) << 31) &&
          experts <= 65535,
      "dequantize_fp8_experts: an expert's [", n, ", ", k,
      "] must fill whole 128 x 128 blocks with fewer than 2^31 elements, and at most 65535 experts, got ",
      experts);
  KILN_CHECK(
      reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
      "dequantize_fp8_experts: e4m3 and bf16 experts must be 16-byte aligned (16-byte loads and stores)");
  if (experts * n * k == 0) return;
  const ops::cuda::ExpertsDequantParams p{.q = static_cast<const uint8_t*>(q),
                                          .scale = scale,
                                          .out = static_cast<uint16_t*>(out),
                                          .counts = counts,
                                          .N = n,
                                          .K = k,
                                          .expert_begin = int(expert_begin)};
  // Enough blocks an expert for ~8 vectors a thread: 30B-A3B's gate_up (1536 x 2048) takes 96 an expert.
  const int64_t per_thread = 8 * ops::cuda::kExpertVec * ops::cuda::kExpertThreads;
  const int64_t blocks = (n * k + per_thread - 1) / per_thread;
  launch({.grid = dim3(unsigned(blocks), unsigned(experts)),
          .block = dim3(ops::cuda::kExpertThreads),
          .stream = stream},
         ops::cuda::dequantize_fp8_experts_kernel, p);
}

}  // namespace kiln::cuda
