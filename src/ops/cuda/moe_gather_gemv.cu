// The experts for small batches (moe.h step 4): a gather GEMV that reads each chosen expert's weights once
// for all the sorted rows that chose it (CUDA cores, fp32 accumulation); and the combine (step 5), bitwise
// ops/moe.h's final sum.
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemv.cuh"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 8;  // a block: 8 warps, each one output column pair
// Output column pairs a warp (2 a warp, no faster up to T = 4 and slower from T = 8, was removed after
// `776f1f6`: docs/PERF.md "Mixture of experts", tried and not kept).
constexpr int kPairs = 1;
// Resident blocks an SM is held to (80 registers a thread): the loads of kDepth chunks raise the registers,
// and 3 blocks keep 24 warps' loads in flight an SM.
constexpr int kMinBlocks = 3;
constexpr int kRows = 4;   // sorted rows a pass (the expert's weights re-read from L1/L2 past 4 rows)
constexpr int kDepth = 2;  // chunks a lane loads a row before its first product (moe_kernels.h)

// Grid: (min(L, T k), ceil(column pairs / 8)); block: 8 warps. Block x takes the x-th chosen expert of the
// rank's L (or exits), warp w the column pair q0 = y * 8 + w (kPairs = 1 of them): pair q is, with SiLU,
// weight rows q (gate) and N + q (up) -> act column q, else rows 2q, 2q + 1 -> y columns 2q, 2q + 1. Lanes
// take the 8-element chunks l, l + 32, ... of k; each pass of up to 4 rows keeps 4 x 2 kPairs fp32 sums a
// lane, reduced by an xor butterfly; lane 0 writes. bf16: a lane issues the 16-byte weight loads of kDepth
// of its chunks (2 kPairs kDepth loads in flight) before the first product. e4m3 (block-FP8 rows with their
// scales): kMoeE4m3Wide loads 16 bytes (16 elements) a lane, 4 512-element windows of each row in flight,
// and regroups them through shared memory into the same chunks (moe_fp8_rows_for_each_chunk); kMoeE4m3x8
// loads each chunk's 8 bytes and its scale like the bf16 form; both widen to bf16(f32(q) * s). These forms
// sum the chunks in ascending order: the FP8 kernel is the bf16 kernel on dequantize_fp8's weights, bit for
// bit. kMoeE4m3x16 (path (d)): lane l takes the 16-element chunks l, l + 32, ... instead, a 16-byte e4m3 load
// and its block's scale each, kDepth of them a row in flight before the first product
// (moe_x16_rows_for_each_chunk); per chunk and x row the 16 products from +0, then acc = fmaf(sum, s, acc)
// (moe_x16_chunk_products); the same butterfly: ops::linear_fp8_chunk16 with 32 threads, bit for bit.
template <bool kSilu, int kLoads>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    gather_gemv_kernel(const __grid_constant__ MoeProductParams p) {
  // kMoeE4m3Wide: each warp's staging of its rows' 512-byte windows (moe_fp8_rows_for_each_chunk).
  __shared__ __align__(16) uint2 stage[kLoads == kMoeE4m3Wide ? kWarps : 1][2 * kPairs][64];
  pdl_wait();  // launched with PDL where enabled: nothing global is touched before the predecessor is done
  const int num_active = p.active[p.E];
  if (int(blockIdx.x) >= num_active) return;
  const int e = p.active[blockIdx.x];  // a router index; its weights are w[e - expert_begin]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int pairs = kSilu ? p.N : p.N / 2;
  const int q0 = (int(blockIdx.y) * kWarps + warp) * kPairs;
  if (q0 >= pairs) return;
  const int64_t wrows = kSilu ? 2 * int64_t(p.N) : p.N;
  int64_t wrow[2 * kPairs];  // rows of the whole [E * wrows, K] stack (block-FP8: wrows % 128 == 0, so a
                             // row's scale block never straddles experts)
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int q = min(q0 + j, pairs - 1);  // a pair past the end recomputes the last one, unwritten
    wrow[2 * j] = int64_t(e - p.expert_begin) * wrows + (kSilu ? q : 2 * q);
    wrow[2 * j + 1] = int64_t(e - p.expert_begin) * wrows + (kSilu ? p.N + q : 2 * q + 1);
  }
  const int row0 = p.offsets[e], cnt = p.counts[e];
  for (int rb = 0; rb < cnt; rb += kRows) {
    const uint16_t* src[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) src[r] = rb + r < cnt ? moe_a_row<kSilu>(p, row0 + rb + r) : nullptr;
    float acc[kRows][2 * kPairs] = {};
    // The products of the lane's chunk at kk (its weights widened into f) with the pass's rows.
    const auto consume = [&](int kk, const float(&f)[2 * kPairs][8]) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!src[r]) continue;
        float xf[8];
        unpack8(*reinterpret_cast<const uint4*>(src[r] + kk), xf);
#pragma unroll
        for (int i = 0; i < 2 * kPairs; ++i) acc[r][i] = dot8(xf, f[i], acc[r][i]);
      }
    };
    if constexpr (kLoads == kMoeE4m3x16) {
      moe_x16_rows_for_each_chunk<2 * kPairs, kDepth>(
          p, wrow, lane, [&](int kk, const gemv_detail::Fp8Chunks<uint4>::Raw(&w)[2 * kPairs]) {
            moe_x16_chunk_products(w, src, kk, acc);
          });
    } else if constexpr (kLoads == kMoeE4m3Wide) {
      moe_fp8_rows_for_each_chunk<2 * kPairs, 4>(p, wrow, stage[warp], lane, consume);
    } else {
      constexpr bool kFp8 = kLoads == kMoeE4m3x8;
      for (int kk0 = lane * 8; kk0 < p.K; kk0 += 32 * 8 * kDepth) {
        MoeWeightChunk<kFp8> wc[kDepth][2 * kPairs] = {};
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          if (kk0 + 256 * d >= p.K) break;
#pragma unroll
          for (int i = 0; i < 2 * kPairs; ++i)
            wc[d][i] = moe_load_weight_chunk<kFp8>(p, wrow[i], kk0 + 256 * d);
        }
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          const int kk = kk0 + 256 * d;
          if (kk >= p.K) break;
          float f[2 * kPairs][8];
#pragma unroll
          for (int i = 0; i < 2 * kPairs; ++i) moe_widen_weight_chunk<kFp8>(wc[d][i], f[i]);
          consume(kk, f);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (!src[r]) continue;  // the same for the whole warp: rows past the expert's count
#pragma unroll
      for (int i = 0; i < 2 * kPairs; ++i)
#pragma unroll
        for (int o = 16; o >= 1; o /= 2) acc[r][i] += __shfl_xor_sync(kFull, acc[r][i], o);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!src[r]) continue;
        uint16_t* orow = p.out + int64_t(row0 + rb + r) * p.N;
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int q = q0 + j;
          if (q >= pairs) break;
          const float a = acc[r][2 * j], b = acc[r][2 * j + 1];
          if constexpr (kSilu) {
            orow[q] = uint16_t(f32_to_bf16_bits(silu_mul_f32(round_bf16(a), round_bf16(b))));
          } else {
            *reinterpret_cast<uint32_t*>(orow + 2 * q) = f32_to_bf16_bits(a) | (f32_to_bf16_bits(b) << 16);
          }
        }
      }
    }
  }
}

// The kernel for (kSilu, fp8): path (d) where moe_fp8_e4m3x16() says, else e4m3 16 or 8 bytes a lane as
// moe_fp8_wide_loads() says.
template <bool kSilu>
auto gather_gemv_kernel_for(bool fp8) {
  if (!fp8) return gather_gemv_kernel<kSilu, kMoeBf16>;
  if (moe_fp8_e4m3x16()) return gather_gemv_kernel<kSilu, kMoeE4m3x16>;
  return moe_fp8_wide_loads() ? gather_gemv_kernel<kSilu, kMoeE4m3Wide>
                              : gather_gemv_kernel<kSilu, kMoeE4m3x8>;
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
// fp32 sum from +0 over t's slots (ascending expert index; a slot of another rank's expert, inverse -1,
// skipped) of y * weight: each product of two bf16 values is exact, so the fma is the product then the add
// (ops/moe.h).
__global__ void combine_kernel(const __grid_constant__ CombineParams p) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int v = int(threadIdx.x); v < p.H / 8; v += int(blockDim.x)) {
    float acc[8] = {};
    for (int j = 0; j < p.k; ++j) {
      const int64_t row = p.inverse[t * p.k + j];
      if (row < 0) continue;  // another rank's expert (expert parallelism)
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

void moe_gather_gemv_launch(const MoeShape& s, const MoeProductParams& gate_up, const MoeProductParams* down,
                            cudaStream_t stream) {
  const unsigned experts = unsigned(std::min(s.local_experts(), s.T * s.k));
  const int per_block = kWarps * kPairs;
  LaunchCfg cfg{.grid = dim3(experts, unsigned((s.I + per_block - 1) / per_block)),
                .block = dim3(kWarps * 32),
                .stream = stream,
                .pdl = pdl_for(PdlSite::gemv)};
  const bool fp8 = gate_up.ws != nullptr;
  KILN_CHECK(!down || fp8 == (down->ws != nullptr),
             "moe gather GEMV: gate_up and down must both be block-FP8 or bf16");
  launch(cfg, gather_gemv_kernel_for<true>(fp8), gate_up);
  if (!down) return;
  cfg.grid.y = unsigned((s.H / 2 + per_block - 1) / per_block);
  launch(cfg, gather_gemv_kernel_for<false>(fp8), *down);
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
  launch({.grid = dim3(unsigned(s.T)),
          .block = dim3(threads),
          .stream = stream,
          .pdl = pdl_for(PdlSite::elementwise)},
         combine_kernel, p);
}

}  // namespace kiln::cuda
