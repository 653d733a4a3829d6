// The W8A8 block-scaled FP8 GEMM kernel (fp8_gemm.h's launch 2) on Hopper: wgmma e4m3 from shared memory
// filled by TMA through an mbarrier pipeline, one producer warpgroup and two consumer warpgroups, optionally
// in clusters of two CTAs sharing the weight tile. Included only by the instantiation units
// (fp8_gemm_sm90_n*.cu) and by the MoE's W8A8 grouped GEMM (moe_grouped_gemm_fp8_sm90.cu: issue_block).
//
// Work mapping.
//   Tiles: 128 rows (M) x BN columns (N). Units: C = 1, one tile (tm, tn); C = 2, clusters of two CTAs
//   (ranks 0, 1) take tile pairs, CTA r the tile (2 pm + r, tn): both need the same weight tile, and each
//   loads half of it (BN / 2 rows) and multicasts it to both (half the L2 reads of the weight). Units are
//   numbered in groups of 8 tile rows, M fastest inside a group (TileWalk). tiles_m is even for C = 2 (xs is
//   padded to 256 rows; a tile wholly past M computes zeros and stores nothing). Split-K (split S > 1): unit
//   u is tile unit u % tile_units over split u / tile_units, i.e. K blocks [s kblocks / S, (s + 1) kblocks /
//   S) (SplitRange), so the units of one split run side by side. Grid: persistent (as many
//   blocks / clusters as are resident at once, each taking units b, b + count, ...) or one block / cluster
//   per unit; one block an SM (the stages take ~200 KB of shared memory). Block: 384 threads = 3 warpgroups;
//   the stage counter (stage it % S, phase (it / S) & 1) runs on across the block's tiles, so the producer
//   loads the next tile while the consumers run the epilogue.
//     warpgroup 0, producer (setmaxnreg 40; thread 0 alone works): per tile and K block kb, waits until the
//       consumer warps released the stage (empty barrier: this CTA's 8 warps, and for C = 2 the peer's 8 as
//       well, since the multicast writes the peer's stage too), announces the stage's bytes on its full
//       barrier, then issues the copies completing on it: xq rows m0 .. m0 + 127 x K kb*128 .. +127 (TMA box,
//       128-byte swizzle: one 128-byte row of e4m3 per M row; rows past M and columns past K zero-filled),
//       wq rows n0 .. n0 + BN - 1 likewise (C = 2: rows n0 + r BN / 2 .. + BN / 2 - 1 multicast, the other
//       half arriving from the peer), and the 128 activation scales xs[kb, m0 .. m0 + 127] (one 512-byte
//       bulk copy).
//     warpgroups 1 and 2, consumers (setmaxnreg 232): consumer c owns rows 64 c .. 64 c + 63 of the tile;
//       warp w rows 16 w .. +15, thread rows lane / 4 and lane / 4 + 8 (the wgmma accumulator layout,
//       wgmma_fp8.cuh), columns 8 j + 2 (lane % 4) + {0, 1}. Per K block: wait full, P = four
//       m64nBNk32 wgmma (A: the stage's xq rows of this consumer, B: its wq rows, both K-major; the first
//       with scale_d 0), commit and wait, read the two rows' activation scales from the stage, release the
//       stage (lane 0 of each warp; C = 2: on both CTAs' empty barriers), then acc = fma(P, xs * ws, acc)
//       with ws = wscale[n / 128, kb] (read from global one K block ahead; a 192-wide tile spans two scale
//       rows, a narrower one a single row). Epilogue: bf16 pairs (4-byte stores; an odd N's last column
//       alone) straight from registers to out[row, col] for row < M, col < N; or (T) the consumer's 64 x BN
//       bf16 tile into its swizzled shared buffer, then TMA stores of 64 x 64 boxes by its thread 0; or
//       (S > 1, either epilogue form) the fp32 acc unrounded, float2 pairs from registers to partial[s, row,
//       col] (row < M, col < N; an odd N's pair also writes the padding column N < ldp).
//     C = 2: every thread ends at a cluster barrier, so no CTA exits while its peer may still arrive on its
//       barriers.
//   Shared memory (1024-aligned): A [S][128 rows][128 B], B [S][BN rows][128 B], xs [S][128] f32,
//   full[S] (count 1 + the stage's bytes), empty[S] (count 8 C: every consumer warp of the cluster), T: the
//   two consumers' output tiles [2][BN / 64][64 rows][128 B].
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/sm90_copy.cuh"
#include "ops/cuda/wgmma_asm.cuh"  // fence_regs
#include "ops/cuda/wgmma_fp8.cuh"

namespace kiln::cuda::fp8_gemm_sm90 {

inline constexpr int kBM = 128, kBK = 128, kThreads = 384;

struct Params {
  CUtensorMap tmap_a;    // xq [M, K] e4m3, box {128 K, 128 rows}
  CUtensorMap tmap_b;    // wq [N, K] e4m3, box {128 K, BN / C rows}
  CUtensorMap tmap_out;  // T: out [M, N] bf16, box {64 columns, 64 rows}
  const float* a_scale;  // xs [kblocks][m_pad]
  const float* w_scale;  // [ceil(N / 128)][kblocks]
  void* out;             // bf16 [M, N], row stride ldo
  int64_t ldo;
  int m, n, kblocks, m_pad;
  int tiles_m;       // tiles along M (even for C = 2)
  int tiles_n;       // tiles along N
  int units;         // tile_units * split
  int n_scale_rows;  // ceil(N / 128)
  int tile_units;    // tiles (C = 1) or tile pairs (C = 2): tiles_m / C * tiles_n
  int split;         // K ranges (fp8_gemm_split; 1: the bf16 epilogue, partial unused)
  float* partial;    // split > 1: fp32 [split][M][ldp], the workspace's partial tiles
  int64_t ldp;       // partial row stride (N rounded up to 4: 16-byte rows)
};

template <int BN, int S, bool T>
struct Layout {
  static constexpr uint32_t a_bytes = kBM * kBK, b_bytes = BN * kBK, sa_bytes = kBM * 4;
  static constexpr uint32_t a_off = 0, b_off = S * a_bytes, sa_off = b_off + S * b_bytes;
  static constexpr uint32_t bar_off = sa_off + S * sa_bytes;
  // T: each consumer's bf16 output tile, [BN / 64 column blocks][64 rows][128 B] 128-byte swizzled.
  static constexpr uint32_t out_off = (bar_off + 2 * S * 8 + 1023) / 1024 * 1024;
  static constexpr uint32_t out_wg_bytes = T ? BN / 64 * 64 * 128 : 0;
  static constexpr uint32_t bytes = T ? out_off + 2 * out_wg_bytes : bar_off + 2 * S * 8;
  static constexpr uint32_t alloc = bytes + 1024;  // the dynamic window is aligned up to 1024 by hand
  static constexpr uint32_t stage_tx = a_bytes + b_bytes + sa_bytes;
  static_assert(b_bytes % 1024 == 0 && alloc <= 227 * 1024, "stages exceed shared memory");
  static_assert(!T || BN % 64 == 0, "the TMA-store epilogue writes 64-column boxes");
};

#ifdef KILN_SM90A

// The units of this block (C = 1) or cluster (C = 2) and this CTA's tile of unit u. Units go in groups of
// kGroupRows tile rows along M, M fastest inside a group, so the ~132 tiles in flight span 8 tile rows x ~16
// weight tiles: A and B are both reused from L2 while they stream (M-fastest over all of M would re-read A
// from HBM once per weight column when A outgrows the L2: M = 8192, K = 9728 is 80 MB).
inline constexpr int kGroupRows = 8;
template <int C>
struct TileWalk {
  int first, stride, rank;
  __device__ __forceinline__ TileWalk() {
    rank = C == 1 ? 0 : int(sm90::cluster_rank());
    first = int(blockIdx.x) / C;
    stride = int(gridDim.x) / C;
  }
  __device__ __forceinline__ void tile(const Params& p, int u, int bn, int& m0, int& n0) const {
    constexpr int kG = kGroupRows / C;  // units along M in a group
    const int per_n = p.tiles_m / C;    // units along M
    const int group = u / (kG * p.tiles_n), first_m = group * kG, size = min(per_n - first_m, kG);
    const int r = u - group * kG * p.tiles_n;
    m0 = (C * (first_m + r % size) + rank) * kBM;
    n0 = (r / size) * bn;
  }
};

// Unit u's split s and K blocks [kb0, kb1), and its tile unit (TileWalk::tile's u). With split 1: s 0, the
// whole of K, tile unit u.
struct SplitRange {
  int s, kb0, kb1, tile_unit;
  __device__ __forceinline__ SplitRange(const Params& p, int u) {
    s = u / p.tile_units;
    tile_unit = u - s * p.tile_units;
    kb0 = int(int64_t(s) * p.kblocks / p.split);
    kb1 = int(int64_t(s + 1) * p.kblocks / p.split);
  }
};

// The TMA pipeline's barriers at `bars` (shared memory): `stages` full ones (one arrival each: the producer's
// expect_tx), then `stages` empty ones (`consumers` arrivals each), initialised by thread 0 and fenced; the
// caller synchronises the block (or cluster) after.
__device__ __forceinline__ void init_pipeline(uint32_t bars, int stages, uint32_t consumers) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) {
    sm90::mbar_init(bars + 8 * s, 1);
    sm90::mbar_init(bars + 8 * (stages + s), consumers);
  }
  sm90::mbar_init_fence();
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

template <int BN, int S, int C, bool T>
__device__ __forceinline__ void produce(const Params& p, uint32_t base) {
  using L = Layout<BN, S, T>;
  const uint32_t full = base + L::bar_off, empty = full + 8 * S;
  const TileWalk<C> walk;
  int s = 0;
  uint32_t ph = 0;
  for (int u = walk.first; u < p.units; u += walk.stride) {
    const SplitRange r(p, u);
    int m0, n0;
    walk.tile(p, r.tile_unit, BN, m0, n0);
    for (int kb = r.kb0; kb < r.kb1; ++kb) {
      const uint32_t fb = full + 8 * s, sb = base + L::b_off + uint32_t(s) * L::b_bytes;
      if constexpr (C == 1) {
        sm90::mbar_wait(empty + 8 * s, ph ^ 1u);
        sm90::mbar_arrive_expect_tx(fb, L::stage_tx);
        sm90::tma_load_2d(sb, &p.tmap_b, kb * kBK, n0, fb);
      } else {
        sm90::mbar_wait_cluster(empty + 8 * s, ph ^ 1u);
        sm90::mbar_arrive_expect_tx(fb, L::stage_tx);  // both halves of B: the peer's arrives here too
        constexpr int kHalf = BN / 2;
        sm90::tma_load_2d_multicast(sb + uint32_t(walk.rank * kHalf * kBK), &p.tmap_b, kb * kBK,
                                    n0 + walk.rank * kHalf, fb, uint16_t(0x3));
      }
      sm90::tma_load_2d(base + L::a_off + uint32_t(s) * L::a_bytes, &p.tmap_a, kb * kBK, m0, fb);
      sm90::bulk_load(base + L::sa_off + uint32_t(s) * L::sa_bytes, p.a_scale + int64_t(kb) * p.m_pad + m0,
                      L::sa_bytes, fb);
      if (++s == S) s = 0, ph ^= 1u;
    }
  }
}

// A thread's accumulator pairs in the wgmma fragment's layout: rows r0 and r0 + 8, columns n0 + 8 j + 2 (lane
// % 4) and the next; store(r, col, a, b) for each pair inside the output (row < M, col < N).
template <int BN, typename Store>
__device__ __forceinline__ void for_each_acc_pair(const Params& p, const float (&acc)[BN / 2], int r0, int n0,
                                                  int lane, Store&& store) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = n0 + 8 * j + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      if (r < p.m && col < p.n) store(r, col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
}

// The register epilogue: bf16 pairs (4-byte stores; an odd N's last column alone) straight to out[row, col].
template <int BN>
__device__ __forceinline__ void store_tile_regs(const Params& p, const float (&acc)[BN / 2], int r0, int n0,
                                                int lane) {
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
  for_each_acc_pair<BN>(p, acc, r0, n0, lane, [&](int r, int col, float a, float b) {
    __nv_bfloat16* dst = out + r * p.ldo + col;
    if (col + 1 < p.n)
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
    else
      *dst = __float2bfloat16_rn(a);  // an odd N's last column
  });
}

// The split-K epilogue: split s's fp32 acc, unrounded, float2 pairs to partial[s, row, col] (col is even and
// ldp a multiple of 4, so the pair is 8-byte aligned and inside the row; an odd N's last pair also writes
// padding column N, which the reduce never reads).
template <int BN>
__device__ __forceinline__ void store_tile_partial(const Params& p, const float (&acc)[BN / 2], int s, int r0,
                                                   int n0, int lane) {
  float* part = p.partial + int64_t(s) * p.m * p.ldp;
  for_each_acc_pair<BN>(p, acc, r0, n0, lane, [&](int r, int col, float a, float b) {
    *reinterpret_cast<float2*>(part + r * p.ldp + col) = make_float2(a, b);
  });
}

// The TMA-store epilogue of one consumer (thread t of 128): its 64 x BN accumulator rounded to bf16 pairs
// into its output buffer (128-byte swizzled column blocks of 64: conflict-free 4-byte stores), then thread 0
// issues one TMA store a column block (rows past M and columns past N are clipped by the tensor map). The
// buffer is reused once the previous tile's stores have read it (bulk wait_group.read, then named barrier
// 1 + c over the consumer's 128 threads).
template <int BN>
__device__ __forceinline__ void store_tile_tma(const Params& p, const float (&acc)[BN / 2], uint32_t buf,
                                               int m0, int n0, int c, int t) {
  const int warp = t / 32, lane = t % 32;
  if (t == 0) sm90::bulk_store_wait_read();
  sm90::named_bar_sync(1 + uint32_t(c), 128);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * warp + lane / 4 + 8 * h;
      const __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      const uint32_t addr =
          buf + uint32_t(j / 8) * (64 * 128) + sm90::sw128_offset(r, j % 8) + uint32_t(lane % 4) * 4;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const uint32_t*>(&v))
                   : "memory");
    }
  sm90::fence_proxy_async();
  sm90::named_bar_sync(1 + uint32_t(c), 128);
  if (t == 0) {
#pragma unroll
    for (int cb = 0; cb < BN / 64; ++cb)
      sm90::tma_store_2d(&p.tmap_out, buf + uint32_t(cb) * (64 * 128), n0 + 64 * cb, m0);
    sm90::bulk_store_commit();
  }
}

template <int BN, int S, int C, bool T>
__device__ __forceinline__ void consume(const Params& p, uint32_t base, const uint8_t* gbase, int c) {
  using L = Layout<BN, S, T>;
  const uint32_t full = base + L::bar_off, empty = full + 8 * S;
  const int t = int(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  const int row = 64 * c + 16 * warp + lane / 4;  // this thread's first row in the tile (the other: + 8)
  float acc[BN / 2], part[BN / 2];
  const TileWalk<C> walk;
  int s = 0;
  uint32_t ph = 0;
  for (int u = walk.first; u < p.units; u += walk.stride) {
    const SplitRange sr(p, u);
    int m0, n0;
    walk.tile(p, sr.tile_unit, BN, m0, n0);
    // The tile's weight-scale rows: one where BN <= 128 (n0 is a multiple of BN), else the columns from
    // `split` on take the next row (n0 % 128 is a multiple of 64, so an 8-column group never straddles).
    const int nb = n0 / kBK, split = kBK - n0 % kBK;
    const float* ws0 = p.w_scale + int64_t(nb) * p.kblocks;
    const float* ws1 = p.w_scale + int64_t(min(nb + 1, p.n_scale_rows - 1)) * p.kblocks;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    // Every split has at least one K block (fp8_gemm_split <= kblocks), so ws0 + kb0 is inside the row.
    float wn0 = __ldg(ws0 + sr.kb0), wn1 = BN > kBK ? __ldg(ws1 + sr.kb0) : 0.0f;
    for (int kb = sr.kb0; kb < sr.kb1; ++kb) {
      const float w0 = wn0, w1 = wn1;
      if (kb + 1 < sr.kb1) {
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
      if (lane == 0) {
        if constexpr (C == 1) {
          sm90::mbar_arrive(empty + 8 * s);
        } else {
          sm90::mbar_arrive_cluster(empty + 8 * s, 0);
          sm90::mbar_arrive_cluster(empty + 8 * s, 1);
        }
      }
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
    // A TMA store does not clip a row at an N that is not a multiple of 8 (16 bytes): the odd-N case of
    // test_cuda_fp8_gemm saw column N written (H100, 2026-12-06). Such a ragged last tile takes the register
    // stores (the choice is uniform over the consumer, so its named barriers stay matched). Split-K: the fp32
    // partial, whatever the epilogue form (p.split is uniform too).
    if (p.split > 1)
      store_tile_partial<BN>(p, acc, sr.s, m0 + row, n0, lane);
    else if (T && (p.n % 8 == 0 || n0 + BN <= p.n))
      store_tile_tma<BN>(p, acc, base + L::out_off + uint32_t(c) * L::out_wg_bytes, m0 + 64 * c, n0, c, t);
    else
      store_tile_regs<BN>(p, acc, m0 + row, n0, lane);
  }
  if constexpr (T) {
    if (t == 0) sm90::bulk_store_wait_all();  // the last tile's stores done before the CTA's memory goes
  }
}

#endif  // KILN_SM90A

template <int BN, int S, int C, bool T>
__global__ void __launch_bounds__(kThreads, 1) fp8_gemm_kernel(const __grid_constant__ Params p) {
#ifdef KILN_SM90A
  using L = Layout<BN, S, T>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  init_pipeline(base + L::bar_off, S, 8 * C);
  if constexpr (C == 1)
    __syncthreads();
  else
    sm90::cluster_sync();  // the peer's barriers are initialised before anything multicasts into them
  // Split-K: the reduce (launched next, with PDL) may take the SMs this grid leaves free and wait there for
  // this grid's completion (griddepcontrol.wait) before reading a partial.
  if (p.split > 1) pdl_launch_dependents();
  pdl_wait();  // xq and xs come from the quantizer launched just before (fp8_gemm launches this with PDL)
  const int wg = int(threadIdx.x / 128);
  if (wg == 0) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) produce<BN, S, C, T>(p, base);
  } else {
    sm90::setmaxnreg_inc<232>();
    consume<BN, S, C, T>(p, base, smem_raw + (base - raw), wg - 1);
  }
  if constexpr (C == 2) {
    __syncwarp();
    sm90::cluster_sync();
  }
#endif
}

// Instantiated in fp8_gemm_sm90_n{BN}.cu. launch: `grid` blocks (a multiple of C), clusters of C, PDL (the
// kernel waits before reading the quantizer's output), the dynamic shared memory that prepare() allowed.
// prepare: once per device (outside any graph capture), whether the device runs this build's sm_90a code, the
// shared-memory limit raised, and how many clusters (C = 2) are resident at once (resident_clusters).
template <int BN, int S, int C, bool T>
void launch(const Params& p, int grid, cudaStream_t stream) {
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(unsigned(grid));
  lc.blockDim = dim3(kThreads);
  lc.dynamicSmemBytes = Layout<BN, S, T>::alloc;
  lc.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = unsigned(C);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = C == 1 ? 1 : 2;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&lc, fp8_gemm_kernel<BN, S, C, T>, p));
}

template <int BN, int S, int C, bool T>
bool prepare() {
  const void* k = reinterpret_cast<const void*>(fp8_gemm_kernel<BN, S, C, T>);
  if (kernel_binary_version(k) != 90) return false;
  if (cudaFuncSetAttribute(fp8_gemm_kernel<BN, S, C, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(Layout<BN, S, T>::alloc)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// Clusters of C blocks of this kernel resident at once on the current device (0 on error).
template <int BN, int S, int C, bool T>
int resident_clusters() {
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(unsigned(C));
  lc.blockDim = dim3(kThreads);
  lc.dynamicSmemBytes = Layout<BN, S, T>::alloc;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, fp8_gemm_kernel<BN, S, C, T>, &lc) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// The instantiations (fp8_gemm.h's kFp8GemmConfigs), each compiled in its own unit only.
#define KILN_FP8_GEMM_INSTANCE(EXTERN, BN, S, C, T)                           \
  EXTERN template void launch<BN, S, C, T>(const Params&, int, cudaStream_t); \
  EXTERN template bool prepare<BN, S, C, T>();                                \
  EXTERN template int resident_clusters<BN, S, C, T>();
KILN_FP8_GEMM_INSTANCE(extern, 64, 8, 1, false)
KILN_FP8_GEMM_INSTANCE(extern, 128, 6, 1, false)
KILN_FP8_GEMM_INSTANCE(extern, 128, 6, 2, false)
KILN_FP8_GEMM_INSTANCE(extern, 128, 5, 1, true)
KILN_FP8_GEMM_INSTANCE(extern, 128, 5, 2, true)
KILN_FP8_GEMM_INSTANCE(extern, 192, 5, 1, false)
KILN_FP8_GEMM_INSTANCE(extern, 192, 5, 2, false)
KILN_FP8_GEMM_INSTANCE(extern, 192, 4, 2, true)

}  // namespace kiln::cuda::fp8_gemm_sm90
