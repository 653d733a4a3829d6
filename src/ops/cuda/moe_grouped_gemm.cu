// The experts as a grouped GEMM on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), for
// prefill and large batches (moe.h step 4). Row tiles come from the device-side offsets: the grid is sized
// for the worst case and a tile past the step's tile count exits, so no host synchronisation is needed.
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBM = kMoeRowTile;  // rows of a tile (one expert's)
constexpr int kBN = 128;          // weight rows of a tile: 64 gate + 64 up (SiLU), or 128 output columns
constexpr int kBK = 32;           // k of a stage
constexpr int kLds = kBK + 8;  // smem row stride in bf16: 80 bytes, 16-byte aligned, ldmatrix conflict-free
constexpr int kThreads = 128;  // 4 warps, 2 x 2: a warp owns 32 rows x 64 weight rows

// The smem row of weight-tile row n (0..127) for warp column wn's 8-column group i (0..7).
template <bool kSilu>
__device__ __forceinline__ int b_row(int wn, int i) {
  if constexpr (kSilu) return (i < 4 ? 0 : 64) + wn * 32 + (i % 4) * 8;
  return wn * 64 + i * 8;
}

// Grid: (max_tiles, ceil(N / (kSilu ? 64 : 128))); block: 128 threads. Block (tile, nb) computes the tile's
// 64 sorted rows x 64 act columns (gate and up rows n, I + n; SiLU-and-multiply in the epilogue) or x 128
// y columns. Stages of 32 k by cp.async (double buffered), 16-byte chunks; rows or k past the ends are
// zero-filled, padding rows (sorted_pair -1) read zeros. Writes every row of the tile (padding rows too).
template <bool kSilu>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(const __grid_constant__ MoeProductParams p) {
  const int tile = int(blockIdx.x);
  if (tile >= *p.num_tiles) return;
  __shared__ __align__(16) uint16_t sa[2][kBM * kLds];
  __shared__ __align__(16) uint16_t sb[2][kBN * kLds];
  const int e = p.tile_expert[tile];
  const int row0 = tile * kBM;
  const int n0 = int(blockIdx.y) * (kSilu ? 64 : kBN);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / 2, wn = warp % 2;
  const int64_t wrows = kSilu ? 2 * int64_t(p.N) : p.N;
  const uint16_t* we = p.w + int64_t(e - p.expert_begin) * wrows * p.K;  // EP: w from expert_begin

  // This thread's sources: 2 A chunks and 4 B chunks a stage (row r, 16-byte chunk c of the 4 in 32 k).
  const uint16_t* a_src[2];
  const uint16_t* b_src[4];
#pragma unroll
  for (int i = 0; i < 2; ++i) a_src[i] = moe_a_row<kSilu>(p, row0 + (tid + i * kThreads) / 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = (tid + i * kThreads) / 4;
    int n = n0 + r;
    bool ok = n < p.N;
    if constexpr (kSilu) {
      n = n0 + r % 64;
      ok = n < p.N;
      n += r < 64 ? 0 : p.N;
    }
    b_src[i] = ok ? we + int64_t(n) * p.K : nullptr;
  }
  const auto load_stage = [&](int st, int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = (tid + i * kThreads), r = c / 4, kc = (c % 4) * 8;
      uint16_t* dst = &sa[st][r * kLds + kc];
      if (a_src[i] && k0 + kc < p.K)
        cp_async16(dst, a_src[i] + k0 + kc);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = (tid + i * kThreads), r = c / 4, kc = (c % 4) * 8;
      uint16_t* dst = &sb[st][r * kLds + kc];
      if (b_src[i] && k0 + kc < p.K)
        cp_async16(dst, b_src[i] + k0 + kc);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();
  };

  float acc[2][8][4] = {};
  const int nk = (p.K + kBK - 1) / kBK;
  load_stage(0, 0);
  for (int kt = 0; kt < nk; ++kt) {
    if (kt + 1 < nk) {
      load_stage((kt + 1) & 1, (kt + 1) * kBK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* A = sa[kt & 1];
    const uint16_t* B = sb[kt & 1];
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wm * 32 + mi * 16 + lane % 16, c = ks + (lane / 16) * 8;
        ldmatrix_x4(af[mi], smem_addr(A + r * kLds + c));
      }
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        uint32_t bf[4];
        const int r = b_row<kSilu>(wn, i) + lane % 8 + (lane / 16) * 8, c = ks + ((lane / 8) % 2) * 8;
        ldmatrix_x4(bf, smem_addr(B + r * kLds + c));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(acc[mi][i], af[mi], bf[0], bf[1]);
          mma_bf16(acc[mi][i + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: accumulator (mi, i) element h: row g (+8 for h >= 2), columns 2 (lane % 4) + h % 2.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + wm * 32 + mi * 16 + lane / 4 + half * 8;
      uint16_t* orow = p.out + int64_t(row) * p.N;
#pragma unroll
      for (int i = 0; i < (kSilu ? 4 : 8); ++i) {
        const int col = n0 + (kSilu ? wn * 32 : wn * 64) + i * 8 + (lane % 4) * 2;
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float a = acc[mi][i][half * 2 + h];
          if constexpr (kSilu) {
            v[h] = silu_mul_f32(round_bf16(a), round_bf16(acc[mi][i + 4][half * 2 + h]));
          } else {
            v[h] = a;
          }
        }
        if (col + 1 < p.N) {
          *reinterpret_cast<uint32_t*>(orow + col) = pack_bf16x2(v[0], v[1]);
        } else if (col < p.N) {
          orow[col] = uint16_t(f32_to_bf16_bits(v[0]));
        }
      }
    }
  }
}

}  // namespace

void moe_grouped_gemm_launch(const MoeShape& s, const MoeProductParams& gate_up, const MoeProductParams& down,
                             cudaStream_t stream) {
  const unsigned tiles = unsigned(s.max_tiles());
  launch({.grid = dim3(tiles, unsigned((s.I + 63) / 64)), .block = dim3(kThreads), .stream = stream},
         grouped_gemm_kernel<true>, gate_up);
  launch({.grid = dim3(tiles, unsigned((s.H + kBN - 1) / kBN)), .block = dim3(kThreads), .stream = stream},
         grouped_gemm_kernel<false>, down);
}

}  // namespace kiln::cuda
