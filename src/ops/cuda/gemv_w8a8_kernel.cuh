// The W8A8 GEMV kernel (contract, mapping and rounding points in gemv_w8a8.h). Reuses the W8A16 GEMV's
// parameter block, row mapping and epilogues (gemv_kernels.cuh: block_row, row_groups, store_outputs), the
// streaming loads (gemv_weights.cuh) and the activation quantizer's arithmetic (fp8_act_quant.cuh).
#pragma once

#include "ops/cuda/fp8_act_quant.cuh"
#include "ops/cuda/gemv_kernels.cuh"

namespace kiln::cuda::gemv_w8a8_detail {

using gemv_detail::GemvParams;

constexpr int kBlockK = 128;  // K elements (bytes of e4m3) of a promotion block

// Shared-memory row stride of the quantized x rows (bytes): K rounded up to the quantizer's 256 columns a
// warp step (the columns past K hold zero codes), plus 16 bytes so that the 8 rows' lanes of one quarter-warp
// fall on distinct banks.
__host__ __device__ constexpr int64_t xq_stride(int64_t k) {
  return (k + 255) / 256 * 256 + 16;
}
// The dynamic shared memory: the warps' sums red[warps][M * R] (f32), the x scales [M, kblocks] (f32), then
// the quantized x rows [M, xq_stride] (bytes, 16-byte aligned).
__host__ __device__ constexpr int64_t red_bytes(int64_t m, int rows, int warps) {
  return int64_t(warps) * m * rows * 4;
}
__host__ __device__ constexpr int64_t scale_bytes(int64_t m, int64_t k) {
  return (m * ((k + kBlockK - 1) / kBlockK) * 4 + 15) / 16 * 16;
}
__host__ __device__ constexpr int64_t smem_bytes(int64_t m, int64_t k, int rows, int warps) {
  return red_bytes(m, rows, warps) + scale_bytes(m, k) + m * xq_stride(k);
}
// With the residual-norm prologue (gemv_w8a8_norm_in), then its bf16 rows and norm weight
// (gemv_kernels.cuh: norm_in_smem_bytes).
__host__ __device__ constexpr int64_t norm_in_smem_bytes(int64_t m, int64_t k, int rows, int warps) {
  return smem_bytes(m, k, rows, warps) + gemv_detail::norm_in_smem_bytes(m, k / 8);
}

// The most warps a block of (tiles, K blocks in flight) runs: 8 where the round holds 2 tiles or more and 64
// registers of W (128 registers a thread at 16 warps spilled 150-270 bytes; 8 warps allow 255).
constexpr int w8a8_max_warps(int tiles, int blocks) {
  return tiles > 1 && tiles * blocks >= 4 ? 8 : 16;
}

// D += A · B for one mma.m16n8k32 e4m3 x e4m3 -> f32 (sm_89+): A the tile's 16 W rows, B the 8 x rows.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();  // gemv_w8a8_supported refuses devices without this build's sm_89+ code
#endif
}

// Word i (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Steps whose loads a warp issues together: 4 where the W round holds at most 32 registers, else 2 (the first
// round stays in registers while x is quantized; M = 8 measured latency-bound on these L2 round trips).
constexpr int quant_batch(int tiles, int blocks) {
  return tiles * blocks <= 2 ? 4 : 2;
}

// Every block quantizes the M x rows into shared memory (gemv_w8a8.h): warp steps of 256 columns of one row
// (two 128-groups, one a half-warp), steps w, w + warps, ... over M * ceil(K / 256), kQuantBatch of them with
// their loads issued together (quant_batch); lane l takes columns 256 c + 8 l (8 bf16, one 16-byte load
// through the read-only path). Lanes past K store zero codes (the mma reads them against zeroed W chunks),
// each half-warp inside K stores its group's scale. kShared: x is the residual-norm prologue's rows in shared
// memory (x8, row stride ldx8 in uint4 units), else p.x through the read-only path. kQuantBatch: quant_batch.
template <int M, bool kShared, int kQuantBatch>
__device__ __forceinline__ void quantize_x(const uint4* x8, int64_t ldx8, int64_t k, uint8_t* xq, float* xs,
                                           int warp, int warps, int lane) {
  const int64_t steps_per_row = (k + 255) / 256, kblocks = (k + kBlockK - 1) / kBlockK, lds = xq_stride(k);
  const int64_t steps = M * steps_per_row;
  for (int64_t step0 = warp; step0 < steps; step0 += int64_t(kQuantBatch) * warps) {  // warp-uniform
    uint4 raw[kQuantBatch];
#pragma unroll
    for (int b = 0; b < kQuantBatch; ++b) {
      const int64_t step = step0 + int64_t(b) * warps, m = step / steps_per_row;
      const int64_t col = (step - m * steps_per_row) * 256 + lane * 8;
      raw[b] = step < steps && col < k ? gemv_detail::load_x<kShared>(x8 + m * ldx8 + col / 8)
                                       : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kQuantBatch; ++b) {
      const int64_t step = step0 + int64_t(b) * warps, m = step / steps_per_row;
      const int64_t col = (step - m * steps_per_row) * 256 + lane * 8;
      if (step < steps) {  // warp-uniform: the whole warp takes part in the butterfly
        const ActQuant8 a = quantize_act8(raw[b]);
        const bool in = col < k;
        *reinterpret_cast<uint2*>(xq + m * lds + col) = in ? a.codes : make_uint2(0, 0);
        if (in && lane % 16 == 0) xs[m * kblocks + col / kBlockK] = a.scale;
      }
    }
  }
}

// Mapping (gemv_w8a8.h): grid = ceil(output columns / (R or R / 2 for silu_mul)) blocks of `warps` warps
// (kNormIn: one wave of resident blocks, block b taking row groups b, b + gridDim.x, ... after its one
// prologue and quantization), row group b owns W rows block_row(b, r) for r < R = 16 NT; lane (g, t) holds
// tile j's rows r = 16 j + g and 16 j + g + 8 ("A" and "B"), streams their bytes [32 t, 32 t + 32) of each
// 128-K block kb = w, w + warps, ... (warp w), and accumulates D[j] = {(A, x row 2t), (A, 2t + 1), (B, 2t),
// (B, 2t + 1)}. Writes the outputs through gemv_kernels.cuh's store_outputs (bf16, f32 or silu_mul),
// red[warp][m * R + r] its input.
// kPrefetch: before the PDL wait, after its first round, each warp also prefetches the rest of its W slice
// towards L2 (one prefetch a row and 128-K block), so the later rounds, issued only once x is quantized and
// the first round consumed, find W in L2 (KILN_GEMV_W8A8_PREFETCH, gemv_w8a8.cu).
template <int M, GemvEpilogue E, int NT, int U, bool kNormIn, bool kPrefetch>
__global__ void __launch_bounds__(w8a8_max_warps(NT, U) * 32)
    gemv_w8a8_kernel(const __grid_constant__ GemvParams p, const __grid_constant__ gemv_detail::NoArgs) {
  static_assert(NT * U <= 4, "a round holds at most 64 registers of W");
  constexpr int R = 16 * NT;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, warps = int(blockDim.x) / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t k = p.k8 * 8, kblocks = (k + kBlockK - 1) / kBlockK;
  int64_t base = 0;
  // Tile j's rows A (g) and B (g + 8) as row indices (N < 2^31): 64-bit pointers for 4 tiles would hold 32
  // registers (measured: 130-270 bytes of spills a thread).
  int row[NT][2];
  const auto rows_of = [&](int64_t grp) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        row[j][h] = int(gemv_detail::block_row<R, E>(p, grp, 16 * j + g + 8 * h, base));
  };
  rows_of(int64_t(blockIdx.x));
  const uint8_t* const w = static_cast<const uint8_t*>(p.w) + 32 * t;
  const int64_t ldw = p.ldw8 * 8;
  // A round: U K blocks of the warp, per tile the 2 rows x 2 chunks and the 2 rows' block scales.
  uint4 wv[U][NT][2][2];
  float ws[U][NT][2];
  const auto load_round = [&](int64_t kb0, auto pinned) {
    constexpr bool kPinned = decltype(pinned)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kb = kb0 + int64_t(u) * warps;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ws[u][j][h] = kb < kblocks
                            ? gemv_detail::load_scale<kPinned>(p.w_scale + (row[j][h] / 128) * p.w_kb + kb)
                            : 0.0f;
          const uint4* const chunk = reinterpret_cast<const uint4*>(w + row[j][h] * ldw + kb * kBlockK);
#pragma unroll
          for (int c = 0; c < 2; ++c)
            wv[u][j][h][c] = kb < kblocks && kb * kBlockK + 32 * t + 16 * c < k
                                 ? gemv_detail::load_stream<kPinned>(chunk + c)
                                 : make_uint4(0, 0, 0, 0);
        }
    }
  };
  load_round(warp, std::true_type{});  // before the PDL wait: W is never written by an earlier kernel
  if constexpr (kPrefetch) {
    if (t == 0)
      for (int64_t kb = warp + int64_t(U) * warps; kb < kblocks; kb += warps)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) gemv_detail::prefetch_l2(w + row[j][h] * ldw + kb * kBlockK);
  }

  extern __shared__ __align__(16) uint8_t smem[];
  float(*red)[M * R] = reinterpret_cast<float(*)[M * R]>(smem);
  float* xs = reinterpret_cast<float*>(smem + red_bytes(M, R, warps));
  uint8_t* xq = smem + red_bytes(M, R, warps) + scale_bytes(M, k);
  // kNormIn: the prologue's bf16 rows, then the norm weight (gemv_kernels.cuh's layout).
  uint4* const norm_x = reinterpret_cast<uint4*>(xq + M * xq_stride(k));
  uint4* const norm_w = norm_x + M * gemv_detail::norm_in_lds8(p.k8);
  if constexpr (kNormIn) gemv_detail::norm_in_stage_weight(p, norm_w, tid, int(blockDim.x));
  pdl_wait();
  pdl_launch_dependents();  // gemv.h: PDL
  if constexpr (kNormIn) {
    // x = rms_norm(residual + delta) * norm_w into shared memory, bitwise the rms_norm kernel (gemv.h:
    // gemv_norm_in), then quantized from there.
    gemv_detail::norm_in_prologue<M>(p, norm_x, norm_w, tid, int(blockDim.x));
    quantize_x<M, true, quant_batch(NT, U)>(norm_x, gemv_detail::norm_in_lds8(p.k8), k, xq, xs, warp, warps,
                                            lane);
  } else {
    quantize_x<M, false, quant_batch(NT, U)>(p.x, p.ldx8, k, xq, xs, warp, warps, lane);
  }
  __syncthreads();

  const uint8_t* xrow = xq + (g < M ? g : 0) * xq_stride(k) + 32 * t;
  // One row group (row, base): the dot products, the warps' sums, the outputs.
  const auto run_group = [&] {
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int64_t kb0 = warp; kb0 < kblocks; kb0 += int64_t(U) * warps) {
      if (kb0 != warp) load_round(kb0, std::false_type{});  // each group's first round came before
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kb = kb0 + int64_t(u) * warps;
        if (kb < kblocks) {  // warp-uniform: every lane takes part in the mma
          uint4 xv[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
          if (g < M) {
            xv[0] = *reinterpret_cast<const uint4*>(xrow + kb * kBlockK);
            xv[1] = *reinterpret_cast<const uint4*>(xrow + kb * kBlockK + 16);
          }
          const float a0 = 2 * t < M ? xs[(2 * t) * kblocks + kb] : 0.0f;
          const float a1 = 2 * t + 1 < M ? xs[(2 * t + 1) * kblocks + kb] : 0.0f;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s = 0; s < 4; ++s) {  // step s: words 2s (a0/a1, b0) and 2s + 1 (a2/a3, b1)
              const int c = s / 2, i = 2 * (s % 2);
              mma_e4m3(d, word(wv[u][j][0][c], i), word(wv[u][j][1][c], i), word(wv[u][j][0][c], i + 1),
                       word(wv[u][j][1][c], i + 1), word(xv[c], i), word(xv[c], i + 1));
            }
            // The promotion (gemv_w8a8.h): D's rows are W rows A, A, B, B and its columns x rows 2t, 2t + 1.
            acc[j][0] = fmaf(d[0], a0 * ws[u][j][0], acc[j][0]);
            acc[j][1] = fmaf(d[1], a1 * ws[u][j][0], acc[j][1]);
            acc[j][2] = fmaf(d[2], a0 * ws[u][j][1], acc[j][2]);
            acc[j][3] = fmaf(d[3], a1 * ws[u][j][1], acc[j][3]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (2 * t < M) {
        red[warp][(2 * t) * R + 16 * j + g] = acc[j][0];
        red[warp][(2 * t) * R + 16 * j + g + 8] = acc[j][2];
      }
      if (2 * t + 1 < M) {
        red[warp][(2 * t + 1) * R + 16 * j + g] = acc[j][1];
        red[warp][(2 * t + 1) * R + 16 * j + g + 8] = acc[j][3];
      }
    }
    __syncthreads();
    gemv_detail::store_outputs<M, R, E>(p, base, red, warps, tid);
  };
  if constexpr (kNormIn) {  // row groups blockIdx.x, + gridDim.x, ... after the one prologue
    const int64_t groups = gemv_detail::row_groups<R, E>(p);
    for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
      if (grp != blockIdx.x) {
        __syncthreads();  // the previous group's outputs are stored: red is free
        rows_of(grp);
        load_round(warp, std::false_type{});
      }
      run_group();
    }
  } else {
    run_group();  // the plain kernel: one group (a loop here cost registers and spills)
  }
}

}  // namespace kiln::cuda::gemv_w8a8_detail
