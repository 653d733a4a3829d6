// The small-M GEMV kernels (contracts and summation orders in gemv.h), shared by gemv.cu and the fused
// GEMV + attention-preparation kernel (gemv_attn_prep.cu). The work after a block has stored its outputs is a
// policy, Tail: Tail::Args is the kernel's second parameter and Tail::finish<M, R>(p, args, base, warps, tid)
// runs in every thread of every block after store_outputs (base: the block's first output column, R: its
// W rows). The dot products do not depend on the tail, so every tail sees bitwise the plain GEMV's outputs.
// Tail::kTcMinBlocks is the tensor-core kernel's __launch_bounds__ minimum of resident 512-thread blocks (0:
// none, ptxas's own choice): a tail's locals would otherwise set the register count of the whole kernel
// (gemv.h: gemv_tail_min_blocks).
#pragma once

#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_weights.cuh"
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda::gemv_detail {

constexpr int kMaxWarps = 16;

struct GemvParams {
  const uint4* x;  // [M, K/8], row stride ldx8 (uint4 units)
  const void* w;   // [N, K/8] chunks of 8 elements (bf16: uint4; e4m3: uint2), row stride ldw8 (chunks)
  void* out;       // bf16 / f32 [M, N] or bf16 act [M, N/2], row stride ldo (elements)
  int64_t ldx8, ldw8, ldo;
  int64_t n;   // rows of W (silu_mul: 2I)
  int64_t k8;  // K / 8
  // The add + RMSNorm epilogue (gemv_add_rms_norm; out is tmp, bf16): residual and normed [M, N] with row
  // strides ldr, ldn (elements), norm_w [N / 8]; unset for the other epilogues.
  uint16_t* residual = nullptr;
  const uint4* norm_w = nullptr;
  uint16_t* normed = nullptr;
  int64_t ldr = 0, ldn = 0;
  float eps = 0.0f;
  // The residual-norm prologue (kNormIn; x unused): delta and residual [M, K] with row strides ldd8, ldr8
  // (uint4 units) and the norm weight [K / 8].
  const uint4* ni_delta = nullptr;
  uint4* ni_residual = nullptr;
  const uint4* ni_w = nullptr;
  int64_t ni_ldd8 = 0, ni_ldr8 = 0;
  // The prologue's look-ahead (gemv.h: gemv_norm_in; KILN_GEMV_NORM_IN_AHEAD): true, the second group's W
  // towards L2 before the PDL wait, the slice two groups ahead as a group starts, the next group's first
  // round before the current one's reduction; false, one group ahead and its first round in its own loop (as
  // at `2f94697`). The same bits either way.
  bool ni_ahead = false;
  // Block-FP8 W (Fp8Weights): the f32 scales [ceil(N/128), w_kb], w_kb = ceil(K/128); unset for bf16 W.
  const float* w_scale = nullptr;
  int64_t w_kb = 0;
};

// Blocks of the current residual-norm launch that have read the residual; the last one resets it to 0
// (gemv.h: gemv_norm_in, why one word is enough). Module globals are per device and, being static, per
// translation unit: only gemv.cu instantiates the prologue.
static __device__ unsigned int g_norm_in_blocks_read = 0;

// Shared-memory row stride of the prologue's x rows (uint4 units): 64 bytes of padding put the tensor-core
// kernel's 8 x rows on distinct banks.
__host__ __device__ constexpr int64_t norm_in_lds8(int64_t k8) {
  return k8 + 4;
}
// The prologue's shared memory: the M x rows, then the norm weight's K / 8 chunks.
__host__ __device__ constexpr int64_t norm_in_smem_bytes(int64_t m, int64_t k8) {
  return (m * norm_in_lds8(k8) + k8) * 16;
}

// The tensor-core kernel's __launch_bounds__ minimum of resident 512-thread blocks with the prologue: 2 (64
// registers, 4-20 bytes of spills; uncapped it takes 94-104, one block per SM; capped at the plain kernel's
// 3, 40 registers, it spills 200-260 bytes a thread). The multi-tile kernels with the prologue: 1 (capped at
// 64 registers they spilled 90-160 bytes a thread; nvcc 13.0, 2026-12-06).
constexpr int kNormInTcMinBlocks = 2;

// A 16-byte shared-memory load the compiler keeps in program order among the other asm volatile (the
// tensor-core GEMV's mma): hoisting all of a round's x loads ahead of the mma would hold 32 more registers.
__device__ __forceinline__ uint4 load_shared16(const uint4* p) {
  uint4 v;
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a));
  return v;
}

// x for the FMA GEMV's dot products: shared memory (the prologue's rows) or global through the read-only
// path.
template <bool kShared>
__device__ __forceinline__ uint4 load_x(const uint4* p) {
  if constexpr (kShared) {
    return *p;
  } else {
    return __ldg(p);
  }
}

// Chunks of loads in flight per thread in the residual-norm prologue and its weight staging.
constexpr int kNormInBatch = 2;

// The norm weight's K / 8 chunks into shared memory ws, by every thread of the block before pdl_wait (a
// weight: never written by an earlier kernel).
__device__ __forceinline__ void norm_in_stage_weight(const GemvParams& p, uint4* ws, int tid, int T) {
  const int k8 = int(p.k8);
  for (int j0 = tid; j0 < k8; j0 += kNormInBatch * T) {
    uint4 wv[kNormInBatch];
#pragma unroll
    for (int b = 0; b < kNormInBatch; ++b)
      if (j0 + b * T < k8) wv[b] = __ldg(p.ni_w + j0 + b * T);
#pragma unroll
    for (int b = 0; b < kNormInBatch; ++b)
      if (j0 + b * T < k8) ws[j0 + b * T] = wv[b];
  }
}

// The residual-norm prologue, run by every thread of the block after pdl_wait: xs[m] = rms_norm(residual[m]
// + delta[m]) * w for the M rows, bitwise norm_row.cuh's rms_norm_row with add (the rms_norm kernel): the
// same chunk arithmetic, and each row's squares summed by one warp with lane l taking chunks l, l + 32, ...
// in order. The sums h = bf16(residual + delta) are spread over all threads first, kNormInBatch chunks of
// loads in flight per thread (2: the kernel holds its first round of W in registers meanwhile; 4 spilled
// 150-200 bytes a thread in the tensor-core kernel), the squares then read h from shared memory. The norm
// weight is already in shared memory ws (norm_in_stage_weight, before the PDL wait). The block counts itself
// once its residual reads are done, on its last warp while warp 0 sums row 0's squares; the block that counts
// last (every other block has read by then) writes h back.
template <int M>
__device__ __forceinline__ void norm_in_prologue(const GemvParams& p, uint4* xs, uint4* ws, int tid, int T) {
  __shared__ float inv[M];
  __shared__ bool last;
  const int k8 = int(p.k8), lds = int(norm_in_lds8(p.k8)), total = M * k8;
  for (int c0 = tid; c0 < total; c0 += kNormInBatch * T) {
    uint4 dv[kNormInBatch], rv[kNormInBatch];
#pragma unroll
    for (int b = 0; b < kNormInBatch; ++b) {
      const int c = c0 + b * T, m = c / k8, j = c - m * k8;
      if (c < total) {
        dv[b] = __ldcg(p.ni_delta + m * p.ni_ldd8 + j);
        rv[b] = __ldcg(p.ni_residual + m * p.ni_ldr8 + j);
      }
    }
#pragma unroll
    for (int b = 0; b < kNormInBatch; ++b) {
      const int c = c0 + b * T, m = c / k8, j = c - m * k8;
      if (c < total) xs[m * lds + j] = norm_add_chunk(dv[b], rv[b]);
    }
  }
  __syncthreads();  // every residual read of this block has returned (and ws, staged before the PDL wait)
  // The count's round trip on the last warp, beside the squares of row 0 on warp 0 (blocks have >= 2 warps).
  if (tid == T - 32) {
    last = atomicAdd(&g_norm_in_blocks_read, 1u) == gridDim.x - 1;
    if (last) atomicExch(&g_norm_in_blocks_read, 0u);  // every block has counted: ready for the next launch
  }
  const int warp = tid / 32, lane = tid % 32;
  for (int m = warp; m < M; m += T / 32) {  // warp-uniform: the butterfly needs the whole warp
    float acc = 0.0f;
    for (int j = lane; j < k8; j += 32) norm_square_chunk(xs[m * lds + j], acc);
    const float v = norm_inv_rms(acc, k8, p.eps);
    if (lane == 0) inv[m] = v;
  }
  __syncthreads();
  for (int c = tid; c < total; c += T) {
    const int m = c / k8, j = c - m * k8;
    const uint4 h = xs[m * lds + j];
    if (last) p.ni_residual[m * p.ni_ldr8 + j] = h;
    xs[m * lds + j] = norm_scale_chunk(h, ws[j], inv[m]);
  }
  __syncthreads();
}

// Row groups of R W rows (R / 2 output columns for silu_mul): one per block, except with the residual-norm
// prologue, where a block takes groups blockIdx.x, + gridDim.x, ... after one prologue.
template <int R, GemvEpilogue E>
__device__ __forceinline__ int64_t row_groups(const GemvParams& p) {
  return E == GemvEpilogue::silu_mul ? (p.n / 2 + R / 2 - 1) / (R / 2) : (p.n + R - 1) / R;
}

// Row r of group grp: the W row it reads (clamped into range) and, through `base`, the group's first
// output column. silu_mul: rows 0..R/2-1 are gate rows base + r, rows R/2.. the matching up rows.
template <int R, GemvEpilogue E>
__device__ __forceinline__ int64_t block_row(const GemvParams& p, int64_t grp, int r, int64_t& base) {
  if constexpr (E == GemvEpilogue::silu_mul) {
    const int64_t half = p.n / 2;
    base = grp * (R / 2);
    const int c = r < R / 2 ? r : r - R / 2;
    const int64_t j = base + c < half ? base + c : half - 1;
    return r < R / 2 ? j : half + j;
  } else {
    base = grp * R;
    return base + r < p.n ? base + r : p.n - 1;
  }
}

// The handle (gemv_weights.cuh) of W row n in format WF.
template <class WF>
__device__ __forceinline__ typename WF::Row w_row(const GemvParams& p, int64_t n) {
  return WF::row(p.w, p.ldw8, p.w_scale, p.w_kb, n);
}

// Stores a block's outputs (gemv.h: the epilogues) from total(m * R + r), the dot product of x row m and
// block row r; T threads, this one tid.
template <int M, int R, GemvEpilogue E, class Total>
__device__ __forceinline__ void store_totals(const GemvParams& p, int64_t base, Total&& total, int T,
                                             int tid) {
  if constexpr (E == GemvEpilogue::silu_mul) {
    for (int i = tid; i < M * (R / 2); i += T) {
      const int m = i / (R / 2), c = i % (R / 2);
      const int64_t j = base + c;
      if (j < p.n / 2) {
        // silu_mul's formula and rounding points (elementwise.cu): g and u are the bf16 GEMM outputs.
        const float g = round_bf16(total(m * R + c)), u = round_bf16(total(m * R + R / 2 + c));
        const float y = silu_mul_f32(g, u);
        static_cast<uint16_t*>(p.out)[m * p.ldo + j] = uint16_t(f32_to_bf16_bits(y));
      }
    }
  } else {
    for (int i = tid; i < M * R; i += T) {
      const int m = i / R, r = i % R;
      const int64_t n = base + r;
      if (n < p.n) {
        const float s = total(i);
        if constexpr (E == GemvEpilogue::f32) {
          static_cast<float*>(p.out)[m * p.ldo + n] = s;
        } else {
          static_cast<uint16_t*>(p.out)[m * p.ldo + n] = uint16_t(f32_to_bf16_bits(s));
        }
      }
    }
  }
}

// red[w][m * R + r]: warp w's sum for x row m and block row r. Adds the warps in ascending order and
// stores the block's outputs. Called by every thread after a __syncthreads.
template <int M, int R, GemvEpilogue E>
__device__ __forceinline__ void store_outputs(const GemvParams& p, int64_t base, const float (*red)[M * R],
                                              int warps, int tid) {
  store_totals<M, R, E>(
      p, base,
      [&](int i) {
        float s = red[0][i];
        for (int w = 1; w < warps; ++w) s += red[w][i];
        return s;
      },
      warps * 32, tid);
}

// Runs a kernel's row groups: run(grp, more) for group `first` alone (blockIdx.x), or with the prologue
// (kNormIn) for groups blockIdx.x, + gridDim.x, ..., calling next(grp') to move the block's rows on between
// two of them (after a barrier: the groups share the block's reduction buffer). more: another group follows.
template <bool kNormIn, class Run, class Next>
__device__ __forceinline__ void for_each_group(int64_t groups, int64_t first, Run&& run, Next&& next) {
  if constexpr (kNormIn) {
    for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
      const bool more = grp + gridDim.x < groups;
      run(grp, more);
      if (more) {
        __syncthreads();
        next(grp + gridDim.x);
      }
    }
  } else {
    run(first, false);
  }
}

// The Args of a tail that needs none.
struct NoArgs {};

// No tail.
struct PlainTail {
  using Args = NoArgs;
  static constexpr int kTcMinBlocks = 0;
  template <int M, int R>
  static __device__ __forceinline__ void finish(const GemvParams&, const Args&, int64_t, int, int) {}
};

template <int M, GemvEpilogue E, class Tail, bool kNormIn = false, class WF = Bf16Weights>
__global__ void __launch_bounds__(kMaxWarps * 32)
    gemv_kernel(const __grid_constant__ GemvParams p, const __grid_constant__ typename Tail::Args ta) {
  constexpr int R = WF::template rows<M>(), X = WF::kChunkX;  // gemv_block_rows; x chunks a W chunk spans
  constexpr int U = WF::template unroll<M>();
  const int T = int(blockDim.x), tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int64_t chunks = p.k8 / X;  // W chunks a row (the e4m3 x 16 format: K % 16 == 0)
  const int64_t groups = row_groups<R, E>(p);
  // The group's W rows (clamped into range; the epilogue stores only real ones).
  using Row = typename WF::Row;
  Row wrow[R];
  int64_t base = 0;
  const auto rows_of = [&](int64_t grp, Row(&rows)[R], int64_t& b) {
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = w_row<WF>(p, block_row<R, E>(p, grp, r, b));
  };
  // A group's W slice towards L2 from chunk `from` (the first group's first round is loaded already).
  const auto prefetch_group = [&](const Row(&rows)[R], int64_t from) {
    for (int64_t c = from + tid; c < chunks; c += T)
#pragma unroll
      for (int r = 0; r < R; ++r) WF::prefetch(rows[r], c);
  };
  rows_of(blockIdx.x, wrow, base);
  // A round of W chunks: U steps of the thread's chunks from c0, R rows.
  typename WF::Raw wv[U][R];
  const auto load_round = [&](int64_t c0, auto pinned) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * T;
      if (c < chunks) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = WF::template load<decltype(pinned)::value>(wrow[r], c);
      }
    }
  };
  // W is never written by an earlier kernel (gemv.h): its first round is issued before the PDL wait, so
  // the stream starts while the predecessor finishes (and, with the prologue, while the norm runs); with the
  // prologue the rest of the slice goes towards L2 as well.
  load_round(tid, std::true_type{});
  extern __shared__ uint4 norm_in_x[];  // kNormIn: the normalized x rows, then the norm weight
  uint4* const norm_in_w = norm_in_x + M * norm_in_lds8(p.k8);
  if constexpr (kNormIn) {
    prefetch_group(wrow, p.ni_ahead ? int64_t(U) * T : 0);
    if (p.ni_ahead &&
        blockIdx.x + gridDim.x < groups) {  // and the block's second group, while the prologue runs
      Row second[R];
      int64_t nb;
      rows_of(blockIdx.x + gridDim.x, second, nb);
      prefetch_group(second, 0);
    }
    norm_in_stage_weight(p, norm_in_w, tid, T);
  }
  pdl_wait();
  pdl_launch_dependents();  // gemv.h: PDL
  if constexpr (kNormIn) norm_in_prologue<M>(p, norm_in_x, norm_in_w, tid, T);
  const uint4* xs = kNormIn ? norm_in_x : p.x;
  const int64_t ldx8 = kNormIn ? norm_in_lds8(p.k8) : p.ldx8;

  __shared__ float red[kMaxWarps][M * R];
  int64_t next_base = 0;  // the next group's first output column (with the prologue)
  // One group (wrow, base); more: another follows (only with the prologue), whose first round it loads
  // before its own reduction, so that round's latency hides under it; the W slice of the group after that
  // goes towards L2 at once (the next one's went a group earlier: two groups ahead).
  const auto run_group = [&](int64_t grp, bool more) {
    if (const int64_t ahead_grp = grp + (p.ni_ahead ? 2 : 1) * int64_t(gridDim.x);
        more && ahead_grp < groups) {
      Row ahead[R];
      int64_t nb;
      rows_of(ahead_grp, ahead, nb);
      prefetch_group(ahead, 0);
    }
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;

    for (int64_t c0 = tid; c0 < chunks; c0 += int64_t(U) * T) {
      if (c0 != tid || (kNormIn && !p.ni_ahead && grp != blockIdx.x))
        load_round(c0, std::false_type{});  // a group's first round came before (see above)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + int64_t(u) * T;
        if (c < chunks)  // x row m's i-th 16-byte chunk of W chunk c
          WF::template dot<M, R>(
              wv[u], [&](int m, int i) { return load_x<kNormIn>(xs + m * ldx8 + c * X + i); }, acc);
      }
    }

    if (more && p.ni_ahead) {
      rows_of(grp + gridDim.x, wrow, next_base);
      load_round(tid, std::false_type{});
    }

    // Warp butterfly, then the warps' sums in ascending warp order (gemv.h: the summation order).
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float v = acc[m][r];
#pragma unroll
        for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) red[warp][m * R + r] = v;
      }
    __syncthreads();
    store_outputs<M, R, E>(p, base, red, T / 32, tid);
  };
  for_each_group<kNormIn>(groups, blockIdx.x, run_group, [&](int64_t next) {
    if (p.ni_ahead) {
      base = next_base;
    } else {
      rows_of(next, wrow, base);
    }
  });
  Tail::template finish<M, R>(p, ta, base, T / 32, tid);
}

// The FMA kernel of each M = 1..8 for format WF (fma_kernel_format: the lighter e4m3 x 16 form runs the first
// form's kernels at M > 2), indexed by M - 1.
template <GemvEpilogue E, class Tail, bool kNormIn, class WF>
inline constexpr void (*kFmaKernels[kGemvMaxM])(GemvParams, typename Tail::Args) = {
    gemv_kernel<1, E, Tail, kNormIn, fma_kernel_format<WF, 1>>,
    gemv_kernel<2, E, Tail, kNormIn, fma_kernel_format<WF, 2>>,
    gemv_kernel<3, E, Tail, kNormIn, fma_kernel_format<WF, 3>>,
    gemv_kernel<4, E, Tail, kNormIn, fma_kernel_format<WF, 4>>,
    gemv_kernel<5, E, Tail, kNormIn, fma_kernel_format<WF, 5>>,
    gemv_kernel<6, E, Tail, kNormIn, fma_kernel_format<WF, 6>>,
    gemv_kernel<7, E, Tail, kNormIn, fma_kernel_format<WF, 7>>,
    gemv_kernel<8, E, Tail, kNormIn, fma_kernel_format<WF, 8>>};

// D += A · B for one mma.m16n8k16 (bf16 in, fp32 accumulate); A: x rows g and g + 8 (the latter zero),
// B: W rows of the block.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Tensor-core GEMV (gemv.h), NT tiles of 8 W rows a block (R = 8 NT). Lane (g, t) streams chunk t of every
// 32-element K block of W rows g, g + 8, ... (one per tile) and of x row g (zeros for g >= M); D[m][n] of
// tile j's mma is out[m][base + 8 j + n], held by lane (m, n / 2). A round: U = 8 / NT K blocks of every
// tile (the same registers whatever NT); one x chunk serves the NT tiles, so x is read 1 / NT times as often
// per W byte (at M = 8 and NT = 1, x's L1 and L2 traffic equals W's).
template <int M, GemvEpilogue E, class Tail, bool kNormIn = false, int NT = 1, class WF = Bf16Weights>
__global__ void __launch_bounds__(kMaxWarps * 32,
                                  kNormIn ? (NT == 1 ? kNormInTcMinBlocks : 1) : Tail::kTcMinBlocks)
    gemv_tc_kernel(const __grid_constant__ GemvParams p, const __grid_constant__ typename Tail::Args ta) {
  static_assert(NT == 1 || NT == 2 || NT == 4, "1, 2 or 4 tiles of 8 rows");
  static_assert(NT == 1 || std::is_same_v<Tail, PlainTail>,
                "the tails run the one-tile kernel (gemv.h: gemv_fusable); the prologue runs any");
  constexpr int R = 8 * NT;
  constexpr int U = 8 / NT;  // K blocks whose loads a warp issues together, per tile
  const int T = int(blockDim.x), tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, warps = T / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t groups = row_groups<R, E>(p), kblocks = (p.k8 + 3) / 4;
  const int64_t first = blockIdx.x, kb_begin = 0, kb_end = kblocks;  // the block's group and K blocks
  int64_t base = 0, next_base = 0;  // next_base: the next group's (with the prologue)
  typename WF::Row wrow[NT];
  const auto rows_of = [&](int64_t grp, int64_t& b) {
#pragma unroll
    for (int j = 0; j < NT; ++j) wrow[j] = w_row<WF>(p, block_row<R, E>(p, grp, g + 8 * j, b));
  };
  rows_of(first, base);
  // A group's W slice towards L2, every tile, from K block `from`.
  const auto prefetch_group = [&](int64_t grp, int64_t from) {
    int64_t nb;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const typename WF::Row row = w_row<WF>(p, block_row<R, E>(p, grp, g + 8 * j, nb));
      for (int64_t kb = from + warp; kb < kblocks; kb += warps)
        if (kb * 4 + t < p.k8) WF::prefetch(row, kb * 4 + t);
    }
  };
  const uint4 zero = make_uint4(0, 0, 0, 0);
  typename WF::Raw wv[U][NT];  // a round of W: chunk t of K blocks kb0, kb0 + warps, ... of the lane's rows
  const auto load_round = [&](int64_t kb0, auto pinned) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kb = kb0 + int64_t(u) * warps, c = kb * 4 + t;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (c < p.k8) {
          wv[u][j] = WF::template load<decltype(pinned)::value>(wrow[j], c);
        } else {
          wv[u][j] = WF::zero();
        }
      }
    }
  };
  // As the FMA kernel: the first round of W before the PDL wait, the slice towards L2 with the prologue.
  load_round(kb_begin + warp, std::true_type{});
  extern __shared__ uint4 norm_in_x[];  // kNormIn: the normalized x rows, then the norm weight
  uint4* const norm_in_w = norm_in_x + M * norm_in_lds8(p.k8);
  if constexpr (kNormIn) {
    prefetch_group(blockIdx.x, p.ni_ahead ? int64_t(U) * warps : 0);
    if (p.ni_ahead && blockIdx.x + gridDim.x < groups)
      prefetch_group(blockIdx.x + gridDim.x, 0);  // 2nd group
    norm_in_stage_weight(p, norm_in_w, tid, T);
  }
  pdl_wait();
  pdl_launch_dependents();  // gemv.h: PDL
  if constexpr (kNormIn) norm_in_prologue<M>(p, norm_in_x, norm_in_w, tid, T);
  const uint4* xrow =
      kNormIn ? norm_in_x + (g < M ? g : 0) * norm_in_lds8(p.k8) : p.x + (g < M ? g : 0) * p.ldx8;

  __shared__ float red[kMaxWarps][M * R];
  // One group (wrow, base); more: another follows (only with the prologue), whose first round it loads
  // before its own reduction; the group after that goes towards L2 at once (as the FMA kernel).
  const auto run_group = [&](int64_t grp, bool more) {
    if (const int64_t ahead_grp = grp + (p.ni_ahead ? 2 : 1) * int64_t(gridDim.x); more && ahead_grp < groups)
      prefetch_group(ahead_grp, 0);
    float d[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    for (int64_t kb0 = kb_begin + warp; kb0 < kb_end; kb0 += int64_t(U) * warps) {
      if (kb0 != kb_begin + warp || (kNormIn && !p.ni_ahead && grp != blockIdx.x))
        load_round(kb0, std::false_type{});  // a group's first round came before
      uint4 xv[U];
      if constexpr (!kNormIn) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t c = (kb0 + int64_t(u) * warps) * 4 + t;
          xv[u] = c < p.k8 && g < M ? __ldg(xrow + c) : zero;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (kb0 + int64_t(u) * warps < kb_end) {  // warp-uniform: every lane takes part in the mma
          if constexpr (kNormIn) {  // x from shared memory right before its mma (ordered: both asm volatile)
            const int64_t c = (kb0 + int64_t(u) * warps) * 4 + t;
            xv[u] = c < p.k8 && g < M ? load_shared16(xrow + c) : zero;
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint4 wb = WF::widen(wv[u][j]);
            mma_bf16(d[j], xv[u].x, xv[u].y, wb.x, wb.y);
            mma_bf16(d[j], xv[u].z, xv[u].w, wb.z, wb.w);
          }
        }
      }
    }

    if (more && p.ni_ahead) {
      rows_of(grp + gridDim.x, next_base);
      load_round(kb_begin + warp, std::false_type{});
    }
    if (g < M) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        red[warp][g * R + 8 * j + 2 * t] = d[j][0];
        red[warp][g * R + 8 * j + 2 * t + 1] = d[j][1];
      }
    }
    __syncthreads();
    store_outputs<M, R, E>(p, base, red, warps, tid);
  };
  for_each_group<kNormIn>(groups, first, run_group, [&](int64_t next) {
    if (p.ni_ahead) {
      base = next_base;
    } else {
      rows_of(next, base);
    }
  });
  Tail::template finish<M, R>(p, ta, base, warps, tid);
}

}  // namespace kiln::cuda::gemv_detail
