// The decode chain (decode_chain.h: the contract, the scheme and why it is bitwise the unfused ops).
//
// Mapping: grid = 2 blocks of 512 threads an SM. GEMV phases: subgroup g = tid / (32 warps) of block b
// owns row groups b * S + g, + gridDim.x * S, ... (S = 16 / warps); its thread ts = tid % (32 warps) takes
// the 16-byte chunks ts, ts + 32 warps, ... of the group's 4 W rows, as gemv_kernel's thread ts does. The
// preparation: head h on block h, h + gridDim.x, ... (one 16-lane group: M = 1). The final norm: warp 0 of
// block 0.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kiln/error.h"
#include "ops/cuda/attn_prep_head.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_chain.h"
#include "ops/cuda/gemv_kernels.cuh"
#include "ops/cuda/norm_row.cuh"

namespace kiln::cuda {
namespace {

using gemv_detail::GemvParams;

constexpr int kWarps = 16, kThreads = kWarps * 32;
constexpr int R = 4;  // W rows of a row group (gemv.h: the FMA kernel's 4)
// Chunk steps a thread loads together (gemv_kernel's 4 at M = 1 hold 64 registers of W; 2 fit two blocks an
// SM, twice the warps to hide the loads' latency: the summation order does not depend on it).
#ifndef KILN_EXP_CHAIN_U  // EXPERIMENT switches for an A/B of the occupancy (build flags)
#define KILN_EXP_CHAIN_U 2
#define KILN_EXP_CHAIN_BLOCKS 2
#endif
constexpr int U = KILN_EXP_CHAIN_U;
constexpr int kBlocksPerSm = KILN_EXP_CHAIN_BLOCKS;

// Arrivals at the grid barriers of the current launch, the arrivals the last block to arrive saw (what the
// others poll: a word apart from the atomics), and blocks that have left the launch (decode_chain.h).
__device__ unsigned int g_chain_arrived = 0;
__device__ unsigned int g_chain_open = 0;
__device__ unsigned int g_chain_left = 0;

std::atomic<uint64_t> g_launches{0};

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Every block's stores so far are visible to every block's loads after it (loads through L2: .cg). The last
// block to arrive opens the barrier by a release store to another word than the counted one, so the waiting
// blocks' polls do not queue behind the arrivals' atomics.
__device__ __forceinline__ void grid_barrier(unsigned& target) {
  __syncthreads();
  target += gridDim.x;
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&g_chain_arrived, 1u) + 1 == target) {
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&g_chain_open), "r"(target) : "memory");
    } else {
      unsigned v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(&g_chain_open) : "memory");
      } while (v < target);
    }
  }
  __syncthreads();
}

// Chunks of the largest x row a phase stages (O's, down's or the norm's H); hs, the h kept for the
// write-back, follows it.
__host__ __device__ __forceinline__ int64_t x_chunks(const DecodeChainParams& p) {
  const int64_t a = p.o.k / 8, b = p.down.k / 8, h = p.o.n / 8;
  return a > b ? (a > h ? a : h) : (b > h ? b : h);
}

struct Phase {
  GemvParams g;
  int warps;
};

// The phase's layout for this thread: threads a subgroup, subgroups a block, this thread's subgroup and
// its index in it.
struct Lane {
  int T, S, g, ts;
};
__device__ __forceinline__ Lane lane_of(int warps) {
  const int T = warps * 32, tid = int(threadIdx.x);
  return {T, kWarps / warps, tid / T, tid % T};
}

// One round of a row group's W: U chunk steps of the thread's chunks from c0 (gemv_kernel's load_round).
template <bool kPinned>
__device__ __forceinline__ void load_round(const GemvParams& p, const uint4* const (&rows)[R], int64_t c0,
                                           int T, uint4 (&wv)[U][R]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = c0 + int64_t(u) * T;
    if (c < p.k8) {
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = gemv_detail::load_stream<kPinned>(rows[r] + c);
    }
  }
}

template <GemvEpilogue E>
__device__ __forceinline__ void rows_of(const GemvParams& p, int64_t grp, const uint4* (&rows)[R],
                                        int64_t& base) {
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = gemv_detail::block_row<R, E>(p, grp, r, base);
}

// The first round of this thread's first row group of phase ph (nothing when its subgroup has none).
// Pinned: kept before the barrier that follows it.
template <GemvEpilogue E>
__device__ __forceinline__ void first_round(const Phase& ph, uint4 (&wv)[U][R]) {
  const Lane l = lane_of(ph.warps);
  const int64_t grp = int64_t(blockIdx.x) * l.S + l.g;
  if (grp >= gemv_detail::row_groups<R, E>(ph.g)) return;
  const uint4* rows[R];
  int64_t base;
  rows_of<E>(ph.g, grp, rows, base);
  load_round<true>(ph.g, rows, l.ts, l.T, wv);
}

// x[j] for j < k8 into shared memory, read through L2 (an earlier phase or kernel wrote it).
__device__ __forceinline__ void stage_x(const uint4* x, int64_t k8, uint4* xs) {
  for (int64_t j = threadIdx.x; j < k8; j += kThreads) xs[j] = __ldcg(x + j);
  __syncthreads();
}

// The residual-norm prologue (gemv_kernels.cuh: norm_in_prologue's arithmetic and order for one row):
// xs = rms_norm(h) * w with h = bf16(residual + delta); block 0 keeps h in hs for the write-back.
__device__ __forceinline__ void stage_norm_in(const uint4* delta, const uint4* residual, const uint4* w,
                                              int64_t h8, float eps, uint4* xs, uint4* hs) {
  __shared__ float inv;
  const int tid = int(threadIdx.x);
  for (int64_t j = tid; j < h8; j += kThreads) {
    const uint4 h = norm_add_chunk(__ldcg(delta + j), __ldcg(residual + j));
    xs[j] = h;
    if (blockIdx.x == 0) hs[j] = h;
  }
  __syncthreads();
  if (tid < 32) {
    float acc = 0.0f;
    for (int64_t j = tid; j < h8; j += 32) norm_square_chunk(xs[j], acc);
    const float v = norm_inv_rms(acc, h8, eps);
    if (tid == 0) inv = v;
  }
  __syncthreads();
  for (int64_t j = tid; j < h8; j += kThreads) xs[j] = norm_scale_chunk(xs[j], __ldg(w + j), inv);
  __syncthreads();
}

// Block 0 writes back the h its prologue kept (every block read the old residual before the barrier).
__device__ __forceinline__ void write_back(const uint4* hs, uint4* residual, int64_t h8) {
  if (blockIdx.x != 0) return;
  for (int64_t j = threadIdx.x; j < h8; j += kThreads) residual[j] = hs[j];
}

// One GEMV phase over x in shared memory (gemv_kernel's dot products, reduction and epilogue for M = 1).
// wv holds the first round of this thread's first group; on return it holds next(wv)'s loads.
template <GemvEpilogue E, class Next>
__device__ __forceinline__ void gemv_phase(const Phase& ph, const uint4* xs, uint4 (&wv)[U][R],
                                           float (*red)[R], Next&& next) {
  const GemvParams& p = ph.g;
  const Lane l = lane_of(ph.warps);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t groups = gemv_detail::row_groups<R, E>(p), slots = int64_t(gridDim.x) * l.S;
  bool prefetched = false;
  for (int64_t grp = int64_t(blockIdx.x) * l.S + l.g; grp < groups; grp += slots) {
    const uint4* rows[R];
    int64_t base;
    rows_of<E>(p, grp, rows, base);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int64_t c0 = l.ts; c0 < p.k8; c0 += int64_t(U) * l.T) {
      if (c0 != l.ts) load_round<false>(p, rows, c0, l.T, wv);  // the first round is already in wv
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + int64_t(u) * l.T;
        if (c < p.k8) {
          float wf[R][8], xf[8];
#pragma unroll
          for (int r = 0; r < R; ++r) unpack8(wv[u][r], wf[r]);
          unpack8(xs[c], xf);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r] = fmaf(xf[e], wf[r][e], acc[r]);
        }
      }
    }
    // wv is free: the next group's first round, or the next phase's, goes out before the reduction.
    if (grp + slots < groups) {
      const uint4* nrows[R];
      int64_t nbase;
      rows_of<E>(p, grp + slots, nrows, nbase);
      load_round<false>(p, nrows, l.ts, l.T, wv);
    } else {
      next(wv);
      prefetched = true;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[r];
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) red[warp][r] = v;
    }
    named_barrier(1 + l.g, l.T);
    gemv_detail::store_outputs<1, R, E>(p, base, red + l.g * ph.warps, ph.warps, l.ts);
    named_barrier(1 + l.g, l.T);  // red is reused by the next group
  }
  if (!prefetched) next(wv);
}

struct NoNext {
  __device__ void operator()(uint4 (&)[U][R]) const {}
};

template <GemvEpilogue E>
struct NextPhase {
  const Phase& ph;
  __device__ void operator()(uint4 (&wv)[U][R]) const { first_round<E>(ph, wv); }
};

__device__ __forceinline__ Phase phase_of(const DecodeChainGemv& d, void* out) {
  Phase ph;
  ph.g.x = nullptr;
  ph.g.w = static_cast<const uint4*>(d.w);
  ph.g.out = out;
  ph.g.ldx8 = 0;
  ph.g.ldw8 = d.ldw / 8;
  ph.g.ldo = 0;
  ph.g.n = d.n;
  ph.g.k8 = d.k / 8;
  ph.warps = d.warps;
  return ph;
}

template <int D>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    decode_chain_kernel(const __grid_constant__ DecodeChainParams p) {
  constexpr GemvEpilogue kBf16 = GemvEpilogue::bf16, kSilu = GemvEpilogue::silu_mul;
  extern __shared__ uint4 smem[];
  __shared__ float red[kWarps][R];
  const int64_t h8 = p.o.n / 8;
  uint4* const xs = smem;                // the phase's x row
  uint4* const hs = smem + x_chunks(p);  // block 0's h (smem_bytes)
  uint4* const residual = static_cast<uint4*>(p.residual);
  const Phase o = phase_of(p.o, p.o_out), gu = phase_of(p.gate_up, p.act), down = phase_of(p.down, p.tmp);
  const Phase qkv = phase_of(p.qkv, const_cast<void*>(p.prep.qkv));
  uint4 wv[U][R];
  first_round<kBf16>(o, wv);  // W is never written: before the wait (decode_chain.h)
  pdl_wait();
  unsigned target = 0;

  stage_x(static_cast<const uint4*>(p.attn), o.g.k8, xs);
  gemv_phase<kBf16>(o, xs, wv, red, NextPhase<kSilu>{gu});
  grid_barrier(target);

  stage_norm_in(static_cast<const uint4*>(p.o_out), residual, static_cast<const uint4*>(p.post_norm), h8,
                p.eps, xs, hs);
  gemv_phase<kSilu>(gu, xs, wv, red, NextPhase<kBf16>{down});
  grid_barrier(target);

  write_back(hs, residual, h8);
  stage_x(static_cast<const uint4*>(p.act), down.g.k8, xs);
  if (p.has_next) {
    gemv_phase<kBf16>(down, xs, wv, red, NextPhase<kBf16>{qkv});
  } else {
    gemv_phase<kBf16>(down, xs, wv, red, NoNext{});
  }
  grid_barrier(target);

  if (p.has_next) {
    stage_norm_in(static_cast<const uint4*>(p.tmp), residual, static_cast<const uint4*>(p.next_norm), h8,
                  p.eps, xs, hs);
    gemv_phase<kBf16>(qkv, xs, wv, red, NoNext{});
    grid_barrier(target);
    write_back(hs, residual, h8);
    const int heads = p.prep.Hq + 2 * p.prep.Hkv;
    for (int h = int(blockIdx.x); h < heads; h += int(gridDim.x)) {
      if (p.prep.cache == CacheKind::fp8) {
        attn::prep_head<1, D, CacheKind::fp8>(p.prep, h, kThreads, int(threadIdx.x));
      } else {
        attn::prep_head<1, D, CacheKind::bf16>(p.prep, h, kThreads, int(threadIdx.x));
      }
    }
  } else if (blockIdx.x == 0 && threadIdx.x < 32) {
    // residual was rewritten by this block (write_back), tmp by others: tmp through L2.
    rms_norm_row<true, 0>(static_cast<const uint4*>(p.tmp), residual, static_cast<const uint4*>(p.next_norm),
                          static_cast<uint4*>(p.normed), h8, p.eps, /*add=*/true, int(threadIdx.x));
  }

  // Leave: the last block out resets the barrier for the next launch (every block has passed its last wait).
  if (threadIdx.x == 0 && atomicAdd(&g_chain_left, 1u) == gridDim.x - 1) {
    g_chain_arrived = 0;
    g_chain_open = 0;
    g_chain_left = 0;
    __threadfence();
  }
}

bool aligned16(const void* q) {
  return reinterpret_cast<uintptr_t>(q) % 16 == 0;
}

bool gemv_ok(const DecodeChainGemv& g) {
  return g.w && aligned16(g.w) && g.n >= 1 && g.k >= 8 && g.k % 8 == 0 && g.ldw % 8 == 0 && g.ldw >= g.k &&
         (g.warps == 2 || g.warps == 4 || g.warps == 8 || g.warps == 16);
}

// The grid: every block resident at once (the barriers wait for all of them), kBlocksPerSm an SM where the
// occupancy calculator agrees (the dynamic shared memory is at most 40 KB a block).
int chain_blocks(size_t smem) {
  int dev = 0, sms = 0, per_sm = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  KILN_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_chain_kernel<128>, kThreads, smem));
  KILN_CHECK(per_sm >= 1, "decode_chain: a block does not fit on an SM");
  return sms * std::min(per_sm, kBlocksPerSm);
}

size_t smem_bytes(const DecodeChainParams& p) {
  return size_t(x_chunks(p) + p.o.n / 8) * 16;
}

}  // namespace

bool decode_chain_supported(const DecodeChainParams& p) {
  const int64_t H = p.o.n, I = p.down.k;
  if (!gemv_ok(p.o) || !gemv_ok(p.gate_up) || !gemv_ok(p.down)) return false;
  if (H % 8 != 0 || p.down.n != H || p.gate_up.k != H || p.gate_up.n != 2 * I) return false;
  if (smem_bytes(p) > 160 * 1024 || !(p.eps >= 0.0f)) return false;
  const void* bufs[] = {p.attn, p.o_out, p.residual, p.act, p.tmp, p.post_norm, p.next_norm};
  for (const void* b : bufs)
    if (!b || !aligned16(b)) return false;
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (bufs[i] == bufs[j]) return false;
  if (!p.has_next) return p.normed && aligned16(p.normed) && p.normed != p.residual && p.normed != p.tmp;
  const AttnPrepParams& a = p.prep;
  const int64_t n = (int64_t(a.Hq) + 2 * int64_t(a.Hkv)) * a.D;
  return gemv_ok(p.qkv) && p.qkv.k == H && p.qkv.n == n && a.T == 1 && a.act == ActKind::bf16 &&
         (a.cache == CacheKind::bf16 || a.cache == CacheKind::fp8) && (a.D == 64 || a.D == 128) && a.qkv &&
         aligned16(a.qkv) && a.qkv_row >= n && attn_prep_fused_supported(a) && a.qkv != p.residual &&
         a.qkv != p.tmp && a.qkv != p.act && a.qkv != p.o_out;
}

void decode_chain(const DecodeChainParams& p, cudaStream_t stream, bool pdl) {
  KILN_CHECK(decode_chain_supported(p), "decode_chain: unsupported call: H ", p.o.n, " I ", p.down.k,
             " warps ", p.o.warps, "/", p.gate_up.warps, "/", p.down.warps, "/", p.qkv.warps, " D ", p.prep.D,
             " (decode_chain.h lists the guards)");
  const bool d64 = p.has_next && p.prep.D == 64;
  launch({.grid = dim3(unsigned(chain_blocks(smem_bytes(p)))),
          .block = dim3(kThreads),
          .smem = smem_bytes(p),
          .stream = stream,
          .pdl = pdl},
         d64 ? decode_chain_kernel<64> : decode_chain_kernel<128>, p);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

uint64_t decode_chain_launches() {
  return g_launches.load(std::memory_order_relaxed);
}

}  // namespace kiln::cuda
