// The W8A8 block-scaled FP8 GEMM kernel (fp8_gemm.h's launch 2) on Hopper: wgmma e4m3 from shared memory
// filled by TMA through an mbarrier pipeline, one producer warpgroup and two consumer warpgroups. Included
// only by the instantiation units (fp8_gemm_sm90_n*.cu).
//
// Work mapping.
//   Tiles: 128 rows (M) x BN columns (N), numbered t = tm + tiles_m * tn (M fastest: the blocks resident at
//   once share few weight tiles, each read from HBM once and from L2 by many blocks). Grid: persistent
//   (min(tiles, SMs) blocks, block b takes tiles b, b + grid, ...) or one block per tile; one block an SM
//   (the stages take ~200 KB of shared memory).
//   Block: 384 threads = 3 warpgroups; the stage counter (stage it % S, phase (it / S) & 1) runs on across
//   the block's tiles, so the producer loads the next tile while the consumers run the epilogue.
//     warpgroup 0, producer (setmaxnreg 40; thread 0 alone works): per tile and K block kb, waits until the
//       8 consumer warps released the stage (empty barrier), announces its bytes on the full barrier, then
//       issues three copies completing on it: xq rows m0 .. m0 + 127 x K kb*128 .. +127 (TMA box, 128-byte
//       swizzle: one 128-byte row of e4m3 per M row; rows past M and columns past K zero-filled), wq rows
//       n0 .. n0 + BN - 1 likewise, and the 128 activation scales xs[kb, m0 .. m0 + 127] (one 512-byte bulk
//       copy; xs is padded to 128 rows, fp8_gemm.h).
//     warpgroups 1 and 2, consumers (setmaxnreg 232): consumer c owns rows 64 c .. 64 c + 63 of the tile;
//       warp w rows 16 w .. +15, thread rows lane / 4 and lane / 4 + 8 (the wgmma accumulator layout,
//       wgmma_fp8.cuh), columns 8 j + 2 (lane % 4) + {0, 1}. Per K block: wait full, P = four
//       m64nBNk32 wgmma (A: the stage's xq rows of this consumer, B: its wq rows, both K-major; the first
//       with scale_d 0), commit and wait, read the two rows' activation scales from the stage, release the
//       stage (lane 0 of each warp), then acc = fma(P, xs * ws, acc) with ws = wscale[n0 / 128, kb] (read
//       from global one K block ahead). Epilogue: bf16 pairs (4-byte stores; an odd N's last column alone)
//       straight from registers to out[row, col] for row < M, col < N.
//   Shared memory (1024-aligned): A [S][128 rows][128 B], B [S][BN rows][128 B], xs [S][128] f32,
//   full[S] (count 1 + the stage's bytes), empty[S] (count 8: every consumer warp).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/wgmma_fp8.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

inline constexpr int kBM = 128, kBK = 128, kThreads = 384;

struct Params {
  CUtensorMap tmap_a;    // xq [M, K] e4m3, box {128 K, 128 rows}
  CUtensorMap tmap_b;    // wq [N, K] e4m3, box {128 K, BN rows}
  const float* a_scale;  // xs [kblocks][m_pad]
  const float* w_scale;  // [ceil(N / 128)][kblocks]
  void* out;             // bf16 [M, N], row stride ldo
  int64_t ldo;
  int m, n, kblocks, m_pad, tiles_m, tiles;
  int n_scale_rows;  // ceil(N / 128)
};

template <int BN, int S>
struct Layout {
  static constexpr uint32_t a_bytes = kBM * kBK, b_bytes = BN * kBK, sa_bytes = kBM * 4;
  static constexpr uint32_t a_off = 0, b_off = S * a_bytes, sa_off = b_off + S * b_bytes;
  static constexpr uint32_t bar_off = sa_off + S * sa_bytes;
  static constexpr uint32_t bytes = bar_off + 2 * S * 8;
  static constexpr uint32_t alloc = bytes + 1024;  // the dynamic window is aligned up to 1024 by hand
  static constexpr uint32_t stage_tx = a_bytes + b_bytes + sa_bytes;
  static_assert(b_bytes % 1024 == 0 && alloc <= 227 * 1024, "stages exceed shared memory");
};

#ifdef KILN_SM90A

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src into shared dst.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// The tile's P for one consumer: 4 k32 steps over the stage's 128-wide K block.
template <int BN>
__device__ __forceinline__ void issue_block(float (&d)[BN / 2], uint32_t a_tile, uint32_t b_tile) {
  const sm90::WgmmaDesc ad = sm90::sw128_desc(a_tile, 16, 1024), bd = sm90::sw128_desc(b_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kBK / 32; ++kk) {
    const sm90::WgmmaDesc a = ad.plus(uint32_t(kk) * 32), b = bd.plus(uint32_t(kk) * 32);
    if constexpr (BN == 192)
      sm90::wgmma_m64n192k32_e4m3(d, a, b, kk > 0 ? 1u : 0u);
    else if constexpr (BN == 128)
      sm90::wgmma_m64n128k32_e4m3(d, a, b, kk > 0 ? 1u : 0u);
    else
      sm90::wgmma_m64n64k32_e4m3(d, a, b, kk > 0 ? 1u : 0u);
  }
}

template <int BN, int S>
__device__ __forceinline__ void produce(const Params& p, uint32_t base) {
  using L = Layout<BN, S>;
  const uint32_t full = base + L::bar_off, empty = full + 8 * S;
  int s = 0;
  uint32_t ph = 0;
  for (int tile = int(blockIdx.x); tile < p.tiles; tile += int(gridDim.x)) {
    const int m0 = (tile % p.tiles_m) * kBM, n0 = (tile / p.tiles_m) * BN;
    for (int kb = 0; kb < p.kblocks; ++kb) {
      sm90::mbar_wait(empty + 8 * s, ph ^ 1u);
      sm90::mbar_arrive_expect_tx(full + 8 * s, L::stage_tx);
      tma_load_2d(base + L::a_off + uint32_t(s) * L::a_bytes, &p.tmap_a, kb * kBK, m0, full + 8 * s);
      tma_load_2d(base + L::b_off + uint32_t(s) * L::b_bytes, &p.tmap_b, kb * kBK, n0, full + 8 * s);
      bulk_load(base + L::sa_off + uint32_t(s) * L::sa_bytes, p.a_scale + int64_t(kb) * p.m_pad + m0,
                L::sa_bytes, full + 8 * s);
      if (++s == S) s = 0, ph ^= 1u;
    }
  }
}

template <int BN, int S>
__device__ __forceinline__ void consume(const Params& p, uint32_t base, const uint8_t* gbase, int c) {
  using L = Layout<BN, S>;
  const uint32_t full = base + L::bar_off, empty = full + 8 * S;
  const int t = int(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  const int row = 64 * c + 16 * warp + lane / 4;  // this thread's first row in the tile (the other: + 8)
  float acc[BN / 2], part[BN / 2];
  int s = 0;
  uint32_t ph = 0;
  for (int tile = int(blockIdx.x); tile < p.tiles; tile += int(gridDim.x)) {
    const int m0 = (tile % p.tiles_m) * kBM, n0 = (tile / p.tiles_m) * BN;
    // The tile's weight-scale rows: one where BN <= 128 (n0 is a multiple of BN), else the columns from
    // `split` on take the next row (n0 % 128 is a multiple of 64, so an 8-column group never straddles).
    const int nb = n0 / kBK, split = kBK - n0 % kBK;
    const float* ws0 = p.w_scale + int64_t(nb) * p.kblocks;
    const float* ws1 = p.w_scale + int64_t(min(nb + 1, p.n_scale_rows - 1)) * p.kblocks;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    float wn0 = __ldg(ws0), wn1 = BN > kBK ? __ldg(ws1) : 0.0f;
    for (int kb = 0; kb < p.kblocks; ++kb) {
      const float w0 = wn0, w1 = wn1;
      if (kb + 1 < p.kblocks) {
        wn0 = __ldg(ws0 + kb + 1);
        if constexpr (BN > kBK) wn1 = __ldg(ws1 + kb + 1);
      }
      sm90::mbar_wait(full + 8 * s, ph);
      __syncwarp();  // the spin may end on different iterations per lane; wgmma needs the warp converged
      sm90::fence_regs(part);
      sm90::wgmma_fence();
      issue_block<BN>(part, base + L::a_off + uint32_t(s) * L::a_bytes + uint32_t(c) * (64 * kBK),
                      base + L::b_off + uint32_t(s) * L::b_bytes);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(part);
      const float* sa = reinterpret_cast<const float*>(gbase + L::sa_off + uint32_t(s) * L::sa_bytes);
      const float a0 = sa[row], a1 = sa[row + 8];
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(empty + 8 * s);
      const float s00 = a0 * w0, s10 = a1 * w0;
      if constexpr (BN > kBK) {
        const float s01 = a0 * w1, s11 = a1 * w1;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          const bool second = 8 * (i / 4) >= split;
          acc[i] = fmaf(part[i], (i & 2) ? (second ? s11 : s10) : (second ? s01 : s00), acc[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = fmaf(part[i], (i & 2) ? s10 : s00, acc[i]);
      }
      if (++s == S) s = 0, ph ^= 1u;
    }
    const int r0 = m0 + row;
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = n0 + 8 * j + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        if (r >= p.m || col >= p.n) continue;
        __nv_bfloat16* dst = out + r * p.ldo + col;
        if (col + 1 < p.n)
          *reinterpret_cast<__nv_bfloat162*>(dst) =
              __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        else
          *dst = __float2bfloat16_rn(acc[4 * j + 2 * h]);  // an odd N's last column
      }
    }
  }
}

#endif  // KILN_SM90A

template <int BN, int S>
__global__ void __launch_bounds__(kThreads, 1) fp8_gemm_kernel(const __grid_constant__ Params p) {
#ifdef KILN_SM90A
  using L = Layout<BN, S>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  const uint32_t full = base + L::bar_off, empty = full + 8 * S;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      sm90::mbar_init(full + 8 * s, 1);
      sm90::mbar_init(empty + 8 * s, 8);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();
  pdl_wait();  // xq and xs come from the quantizer launched just before (fp8_gemm launches this with PDL)
  const int wg = int(threadIdx.x / 128);
  if (wg == 0) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) produce<BN, S>(p, base);
    return;
  }
  sm90::setmaxnreg_inc<232>();
  consume<BN, S>(p, base, smem_raw + (base - raw), wg - 1);
#endif
}

// Instantiated in fp8_gemm_sm90_n{BN}.cu. launch: `grid` blocks, PDL (the kernel waits before reading the
// quantizer's output), the dynamic shared memory that prepare() allowed. prepare: once per device, whether
// the device runs this build's sm_90a code, and the shared-memory limit raised (outside any graph capture).
template <int BN, int S>
void launch(const Params& p, int grid, cudaStream_t stream) {
  const LaunchCfg cfg{.grid = dim3(unsigned(grid)),
                      .block = dim3(kThreads),
                      .smem = Layout<BN, S>::alloc,
                      .stream = stream,
                      .pdl = true,
                      .smem_attr_set = true};
  cuda::launch(cfg, fp8_gemm_kernel<BN, S>, p);
}

template <int BN, int S>
bool prepare() {
  const void* k = reinterpret_cast<const void*>(fp8_gemm_kernel<BN, S>);
  if (kernel_binary_version(k) != 90) return false;
  if (cudaFuncSetAttribute(fp8_gemm_kernel<BN, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(Layout<BN, S>::alloc)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// The instantiations (fp8_gemm.h's kFp8GemmConfigs), each compiled in its own unit only.
extern template void launch<128, 6>(const Params&, int, cudaStream_t);
extern template bool prepare<128, 6>();
extern template void launch<64, 8>(const Params&, int, cudaStream_t);
extern template bool prepare<64, 8>();
extern template void launch<192, 5>(const Params&, int, cudaStream_t);
extern template bool prepare<192, 5>();

}  // namespace kiln::cuda::fp8_gemm_sm90
