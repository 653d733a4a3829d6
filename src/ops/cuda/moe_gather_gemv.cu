// The experts for small batches (moe.h step 4): a gather GEMV that reads each chosen expert's weights once
// for all the sorted rows that chose it (CUDA cores, fp32 accumulation); and the combine (step 5), bitwise
// ops/moe.h's final sum.
#include "ops/cuda/common.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 8;  // a block: 8 warps, each one output column pair
constexpr int kRows = 4;   // sorted rows a pass (the expert's weights re-read from L1/L2 past 4 rows)

__device__ __forceinline__ float dot8(const float (&a)[8], const float (&b)[8], float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(a[i], b[i], acc);
  return acc;
}

// Grid: (min(E, T k), ceil(column pairs / 8)); block: 8 warps. Block x takes the x-th chosen expert (or
// exits), warp w the column pair q = y * 8 + w: SiLU: weight rows q (gate) and N + q (up) -> act column
// q; else rows 2q, 2q + 1 -> y columns 2q, 2q + 1. Lanes stride k by 8 bf16 (16-byte loads); each pass
// of up to 4 rows keeps 2 x 4 fp32 sums a lane, reduced by an xor butterfly; lane 0 writes.
template <bool kSilu>
__global__ void __launch_bounds__(kWarps * 32)
    gather_gemv_kernel(const __grid_constant__ MoeProductParams p) {
  const int num_active = p.active[p.E];
  if (int(blockIdx.x) >= num_active) return;
  const int e = p.active[blockIdx.x];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int q = int(blockIdx.y) * kWarps + warp;
  if (q >= (kSilu ? p.N : p.N / 2)) return;
  const int64_t wrows = kSilu ? 2 * int64_t(p.N) : p.N;
  const uint16_t* we = p.w + int64_t(e) * wrows * p.K;
  const uint16_t* w0 = we + int64_t(kSilu ? q : 2 * q) * p.K;
  const uint16_t* w1 = we + int64_t(kSilu ? p.N + q : 2 * q + 1) * p.K;
  const int row0 = p.offsets[e], cnt = p.counts[e];
  for (int rb = 0; rb < cnt; rb += kRows) {
    const uint16_t* src[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + rb + r;
      src[r] = rb + r < cnt ? moe_a_row<kSilu>(p, row) : nullptr;
    }
    float acc[kRows][2] = {};
#pragma unroll 2
    for (int kk = lane * 8; kk < p.K; kk += 32 * 8) {
      float f0[8], f1[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(w0 + kk)), f0);
      unpack8(__ldg(reinterpret_cast<const uint4*>(w1 + kk)), f1);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!src[r]) continue;
        float xf[8];
        unpack8(*reinterpret_cast<const uint4*>(src[r] + kk), xf);
        acc[r][0] = dot8(xf, f0, acc[r][0]);
        acc[r][1] = dot8(xf, f1, acc[r][1]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int o = 16; o >= 1; o /= 2) {
        acc[r][0] += __shfl_xor_sync(kFull, acc[r][0], o);
        acc[r][1] += __shfl_xor_sync(kFull, acc[r][1], o);
      }
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!src[r]) continue;
        uint16_t* orow = p.out + int64_t(row0 + rb + r) * p.N;
        if constexpr (kSilu) {
          orow[q] = uint16_t(f32_to_bf16_bits(silu_mul_f32(round_bf16(acc[r][0]), round_bf16(acc[r][1]))));
        } else {
          *reinterpret_cast<uint32_t*>(orow + 2 * q) =
              f32_to_bf16_bits(acc[r][0]) | (f32_to_bf16_bits(acc[r][1]) << 16);
        }
      }
    }
  }
}

struct CombineParams {
  const uint16_t* y;        // bf16 [max_rows, H] contiguous
  const uint16_t* weights;  // bf16 [T, k]
  const int32_t* inverse;   // i32 [T * k]
  uint16_t* out;            // bf16 [T, H] row stride os
  int64_t os;
  int H, k;
};

// Grid: T blocks; block: up to 256 threads striding the row's H / 8 16-byte vectors. out[t] = bf16 of the
// fp32 sum from +0 over t's slots (ascending expert index) of y * weight: each product of two bf16 values
// is exact, so the fma is the product then the add (ops/moe.h).
__global__ void combine_kernel(const __grid_constant__ CombineParams p) {
  const int64_t t = blockIdx.x;
  for (int v = int(threadIdx.x); v < p.H / 8; v += int(blockDim.x)) {
    float acc[8] = {};
    for (int j = 0; j < p.k; ++j) {
      const int64_t row = p.inverse[t * p.k + j];
      const float w = bf16_bits_to_f32(p.weights[t * p.k + j]);
      float yf[8];
      unpack8(*reinterpret_cast<const uint4*>(p.y + row * p.H + v * 8), yf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(yf[i], w, acc[i]);
    }
    *reinterpret_cast<uint4*>(p.out + t * p.os + v * 8) = pack8(acc);
  }
}

}  // namespace

void moe_gather_gemv_launch(const MoeShape& s, const MoeProductParams& gate_up, const MoeProductParams& down,
                            cudaStream_t stream) {
  const unsigned experts = unsigned(std::min(s.E, s.T * s.k));
  LaunchCfg cfg{.grid = dim3(experts, unsigned((s.I + kWarps - 1) / kWarps)),
                .block = dim3(kWarps * 32),
                .stream = stream};
  launch(cfg, gather_gemv_kernel<true>, gate_up);
  cfg.grid.y = unsigned((s.H / 2 + kWarps - 1) / kWarps);
  launch(cfg, gather_gemv_kernel<false>, down);
}

void moe_combine_launch(const MoeShape& s, const MoeBuffers& b, uint16_t* out, int64_t os,
                        cudaStream_t stream) {
  if (s.T == 0) return;
  const CombineParams p{.y = b.y,
                        .weights = b.weights,
                        .inverse = b.inverse,
                        .out = out,
                        .os = os,
                        .H = int(s.H),
                        .k = int(s.k)};
  const unsigned threads = unsigned(std::min<int64_t>(256, (s.H / 8 + 31) / 32 * 32));
  launch({.grid = dim3(unsigned(s.T)), .block = dim3(threads), .stream = stream}, combine_kernel, p);
}

}  // namespace kiln::cuda
