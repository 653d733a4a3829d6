// The down projection and the combine (moe.h steps 4 down and 5) in one kernel for decode-sized batches:
// each block owns a few output columns of one token for all its k experts, so it can sum them in ascending
// expert index itself. Bitwise the gather GEMV's y and the combine kernel's out: every y is the same lane
// order, butterfly and bf16 rounding as gather_gemv_kernel's, every out the same fmaf chain from +0.
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemv.cuh"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 8;  // warp w computes slots w, w + 8, ... of the token
// Resident blocks an SM is held to (80 registers a thread): the loads of kDepth chunks raise the registers,
// and 3 blocks keep 24 warps' loads in flight an SM. FP8: 2 (128 registers: its 2 windows of 4 rows, 32
// registers of loads, spilled at 80) for the 16-byte e4m3 loads, 16 warps of 4 KB in flight an SM; path (d)
// (kMoeE4m3x16) the same 2: kDepth chunks of 4 rows, 16 bytes and a scale each, are 40 registers of loads.
constexpr int kMinBlocks = 3, kMinBlocksFp8 = 2;
constexpr int min_blocks(int loads) {
  return loads == kMoeE4m3Wide || loads == kMoeE4m3x16 ? kMinBlocksFp8 : kMinBlocks;
}
constexpr int kPairs = 2;  // output column pairs a block
constexpr int kMaxK = 32;  // top_k the shared y tile holds
constexpr int kDepth = 2;  // chunks a lane loads before its first product (moe_kernels.h)

struct DownCombineParams {
  const int32_t* experts;   // i32 [T, k]
  const uint16_t* weights;  // bf16 [T, k]
  const int32_t* inverse;   // i32 [T * k]: the pair's sorted row; -1: another rank's expert (skipped)
  uint16_t* out;            // bf16 [T, H] row stride os
  int64_t os;
  int k;
};

// Grid: (ceil(H / 2 / kPairs), T); block: 8 warps. Block (x, t) owns columns [2 kPairs x, 2 kPairs (x + 1))
// of token t. Warp w, for each slot j = w, w + 8, ... of t: the 2 kPairs down rows of expert experts[t, j]
// dotted with act row inverse[t k + j] (gather_gemv_kernel's lane order and butterfly; bf16: a lane issues
// the act and weight loads of kDepth of its chunks before the first product (e4m3 8 bytes a chunk alike);
// e4m3 16 bytes a lane: two 512-element windows of the 4 rows in flight, regrouped into the same chunks
// through shared memory; no form changes a sum; kMoeE4m3x16, path (d): gather_gemv_kernel's 16-element
// chunks, products and order), rounded to
// bf16 into y (the scratch, as the unfused path leaves it) and into shared memory; then one thread a column
// sums y * weight over j ascending (ascending expert index; the rank's experts only) from +0 and rounds once.
template <int kLoads>
__global__ void __launch_bounds__(kWarps * 32, min_blocks(kLoads))
    down_combine_kernel(const __grid_constant__ MoeProductParams p,
                        const __grid_constant__ DownCombineParams c) {
  __shared__ float ys[kMaxK][2 * kPairs];
  // kMoeE4m3Wide: each warp's staging of its rows' 512-byte windows (moe_fp8_rows_for_each_chunk).
  __shared__ __align__(16) uint2 stage[kLoads == kMoeE4m3Wide ? kWarps : 1][2 * kPairs][64];
  pdl_wait();
  const int t = int(blockIdx.y), warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int pairs = p.N / 2, q0 = int(blockIdx.x) * kPairs;
  for (int j = warp; j < c.k; j += kWarps) {
    const int row = c.inverse[t * c.k + j];
    if (row < 0) continue;  // the same for the whole warp: another rank's expert
    const int64_t e = c.experts[t * c.k + j] - p.expert_begin;
    const uint16_t* a = p.a + int64_t(row) * p.as;
    int64_t wrow[2 * kPairs];
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int q = min(q0 + i, pairs - 1);  // a pair past the end recomputes the last one, unwritten
      wrow[2 * i] = e * p.N + 2 * q;
      wrow[2 * i + 1] = e * p.N + 2 * q + 1;
    }
    float sums[1][2 * kPairs] = {};  // one x row: the act row a
    float(&acc)[2 * kPairs] = sums[0];
    if constexpr (kLoads == kMoeE4m3x16) {
      const uint16_t* const rows[1] = {a};
      moe_x16_rows_for_each_chunk<2 * kPairs, kDepth>(
          p, wrow, lane, [&](int kk, const gemv_detail::Fp8Chunks<uint4>::Raw(&w)[2 * kPairs]) {
            moe_x16_chunk_products(w, rows, kk, sums);
          });
    } else if constexpr (kLoads == kMoeE4m3Wide) {
      moe_fp8_rows_for_each_chunk<2 * kPairs, 2>(p, wrow, stage[warp], lane,
                                                 [&](int kk, const float(&f)[2 * kPairs][8]) {
                                                   float xf[8];
                                                   unpack8(*reinterpret_cast<const uint4*>(a + kk), xf);
#pragma unroll
                                                   for (int i = 0; i < 2 * kPairs; ++i)
                                                     acc[i] = dot8(xf, f[i], acc[i]);
                                                 });
    } else {
      constexpr bool kFp8 = kLoads == kMoeE4m3x8;
      for (int kk0 = lane * 8; kk0 < p.K; kk0 += 32 * 8 * kDepth) {
        uint4 av[kDepth] = {};
        MoeWeightChunk<kFp8> wc[kDepth][2 * kPairs] = {};
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          const int kk = kk0 + 256 * d;
          if (kk >= p.K) break;
          av[d] = *reinterpret_cast<const uint4*>(a + kk);
#pragma unroll
          for (int i = 0; i < 2 * kPairs; ++i) wc[d][i] = moe_load_weight_chunk<kFp8>(p, wrow[i], kk);
        }
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          if (kk0 + 256 * d >= p.K) break;
          float xf[8];
          unpack8(av[d], xf);
#pragma unroll
          for (int i = 0; i < 2 * kPairs; ++i) {
            float f[8];
            moe_widen_weight_chunk<kFp8>(wc[d][i], f);
            acc[i] = dot8(xf, f, acc[i]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2 * kPairs; ++i)
#pragma unroll
      for (int o = 16; o >= 1; o /= 2) acc[i] += __shfl_xor_sync(kFull, acc[i], o);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const int q = q0 + i;
        const uint32_t lo = f32_to_bf16_bits(acc[2 * i]), hi = f32_to_bf16_bits(acc[2 * i + 1]);
        ys[j][2 * i] = bf16_bits_to_f32(lo);
        ys[j][2 * i + 1] = bf16_bits_to_f32(hi);
        if (q < pairs) *reinterpret_cast<uint32_t*>(p.out + int64_t(row) * p.N + 2 * q) = lo | (hi << 16);
      }
    }
  }
  __syncthreads();
  const int col = 2 * q0 + int(threadIdx.x);
  if (int(threadIdx.x) < 2 * kPairs && col < p.N) {
    float acc = 0.0f;
    for (int j = 0; j < c.k; ++j)
      if (c.inverse[t * c.k + j] >= 0)
        acc = fmaf(ys[j][threadIdx.x], bf16_bits_to_f32(c.weights[t * c.k + j]), acc);
    c.out[int64_t(t) * c.os + col] = uint16_t(f32_to_bf16_bits(acc));
  }
}

}  // namespace

void moe_down_combine_launch(const MoeShape& s, const MoeProductParams& down, const MoeBuffers& b,
                             uint16_t* out, int64_t os, cudaStream_t stream) {
  KILN_CHECK(s.k <= kMaxK, "moe fused down + combine: top_k ", s.k, " above ", kMaxK);
  if (s.T == 0) return;
  const DownCombineParams c{
      .experts = b.experts, .weights = b.weights, .inverse = b.inverse, .out = out, .os = os, .k = int(s.k)};
  const LaunchCfg cfg{.grid = dim3(unsigned((s.H / 2 + kPairs - 1) / kPairs), unsigned(s.T)),
                      .block = dim3(kWarps * 32),
                      .stream = stream,
                      .pdl = pdl_for(PdlSite::gemv)};
  const auto kernel = !down.ws               ? down_combine_kernel<kMoeBf16>
                      : moe_fp8_e4m3x16()    ? down_combine_kernel<kMoeE4m3x16>
                      : moe_fp8_wide_loads() ? down_combine_kernel<kMoeE4m3Wide>
                                             : down_combine_kernel<kMoeE4m3x8>;
  launch(cfg, kernel, down, c);
}

}  // namespace kiln::cuda
