// The small-M GEMV kernels (contracts and summation orders in gemv.h), shared by gemv.cu and the fused
// GEMV + attention-preparation kernel (gemv_attn_prep.cu). The work after a block has stored its outputs is a
// policy, Tail: Tail::Args is the kernel's second parameter and Tail::finish<M, R>(p, args, base, warps, tid)
// runs in every thread of every block after store_outputs (base: the block's first output column, R: its
// W rows). The dot products do not depend on the tail, so every tail sees bitwise the plain GEMV's outputs.
// Tail::kTcMinBlocks is the tensor-core kernel's __launch_bounds__ minimum of resident 512-thread blocks (0:
// none, ptxas's own choice): a tail's locals would otherwise set the register count of the whole kernel
// (gemv.h: gemv_tail_min_blocks).
#pragma once

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemv.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda::gemv_detail {

constexpr int kMaxWarps = 16;

struct GemvParams {
  const uint4* x;  // [M, K/8], row stride ldx8 (uint4 units)
  const uint4* w;  // [N, K/8], row stride ldw8
  void* out;       // bf16 / f32 [M, N] or bf16 act [M, N/2], row stride ldo (elements)
  int64_t ldx8, ldw8, ldo;
  int64_t n;   // rows of W (silu_mul: 2I)
  int64_t k8;  // K / 8
  bool pdl;    // launched with PDL: prefetch the first W chunks into L2 before waiting
  // The add + RMSNorm epilogue (gemv_add_rms_norm; out is tmp, bf16): residual and normed [M, N] with row
  // strides ldr, ldn (elements), norm_w [N / 8]; unset for the other epilogues.
  uint16_t* residual = nullptr;
  const uint4* norm_w = nullptr;
  uint16_t* normed = nullptr;
  int64_t ldr = 0, ldn = 0;
  float eps = 0.0f;
};

// W is streamed once: 16-byte read-only loads that skip L1 (x keeps it) with a 256-byte L2 prefetch hint.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// An L2 prefetch is safe before the PDL wait even for data the previous kernel writes: the L2 is the point
// of coherence, so a later write there is what the loads after the wait see.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Chunk steps whose W loads are issued together per thread: more bytes in flight where registers allow.
template <int M>
constexpr int unroll_for() {
  return M <= 2 ? 4 : 2;
}

// Row r of a block of R rows: the W row it reads (clamped into range) and, through `base`, the output
// column it stores. silu_mul: rows 0..R/2-1 are gate rows base + r, rows R/2.. the matching up rows.
template <int R, GemvEpilogue E>
__device__ __forceinline__ const uint4* block_row(const GemvParams& p, int r, int64_t& base) {
  if constexpr (E == GemvEpilogue::silu_mul) {
    const int64_t half = p.n / 2;
    base = int64_t(blockIdx.x) * (R / 2);
    const int c = r < R / 2 ? r : r - R / 2;
    const int64_t j = base + c < half ? base + c : half - 1;
    return p.w + (r < R / 2 ? j : half + j) * p.ldw8;
  } else {
    base = int64_t(blockIdx.x) * R;
    return p.w + (base + r < p.n ? base + r : p.n - 1) * p.ldw8;
  }
}

// red[w][m * R + r]: warp w's sum for x row m and block row r. Adds the warps in ascending order and
// stores the block's outputs (gemv.h: the epilogues). Called by every thread after a __syncthreads.
template <int M, int R, GemvEpilogue E>
__device__ __forceinline__ void store_outputs(const GemvParams& p, int64_t base, const float (*red)[M * R],
                                              int warps, int tid) {
  auto total = [&](int i) {
    float s = red[0][i];
    for (int w = 1; w < warps; ++w) s += red[w][i];
    return s;
  };
  if constexpr (E == GemvEpilogue::silu_mul) {
    if (tid < M * (R / 2)) {
      const int m = tid / (R / 2), c = tid % (R / 2);
      const int64_t j = base + c;
      if (j < p.n / 2) {
        // silu_mul's formula and rounding points (elementwise.cu): g and u are the bf16 GEMM outputs.
        const float g = round_bf16(total(m * R + c)), u = round_bf16(total(m * R + R / 2 + c));
        const float y = silu_mul_f32(g, u);
        static_cast<uint16_t*>(p.out)[m * p.ldo + j] = uint16_t(f32_to_bf16_bits(y));
      }
    }
  } else {
    if (tid < M * R) {
      const int m = tid / R, r = tid % R;
      const int64_t n = base + r;
      if (n < p.n) {
        const float s = total(tid);
        if constexpr (E == GemvEpilogue::f32) {
          static_cast<float*>(p.out)[m * p.ldo + n] = s;
        } else {
          static_cast<uint16_t*>(p.out)[m * p.ldo + n] = uint16_t(f32_to_bf16_bits(s));
        }
      }
    }
  }
}

template <int M, GemvEpilogue E, class Tail>
__global__ void __launch_bounds__(kMaxWarps * 32)
    gemv_kernel(const __grid_constant__ GemvParams p, const __grid_constant__ typename Tail::Args ta) {
  constexpr int R = gemv_rows(GemvConfig{.tensor_cores = false});
  constexpr int U = unroll_for<M>();
  const int T = int(blockDim.x), tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  // The block's W rows (clamped into range; the epilogue stores only real ones).
  const uint4* wrow[R];
  int64_t base = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = block_row<R, E>(p, r, base);
  if (p.pdl) {  // overlap the first loads' HBM latency with the predecessor's tail
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = tid + int64_t(u) * T;
      if (c < p.k8)
#pragma unroll
        for (int r = 0; r < R; ++r) prefetch_l2(wrow[r] + c);
    }
  }
  pdl_wait();

  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;

  for (int64_t c0 = tid; c0 < p.k8; c0 += int64_t(U) * T) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * T;
      if (c < p.k8) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = load_stream(wrow[r] + c);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + int64_t(u) * T;
      if (c < p.k8) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) unpack8(wv[u][r], wf[r]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          unpack8(__ldg(p.x + m * p.ldx8 + c), xf);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[m][r] = fmaf(xf[e], wf[r][e], acc[m][r]);
        }
      }
    }
  }

  // Warp butterfly, then the warps' sums in ascending warp order (gemv.h: the summation order).
  __shared__ float red[kMaxWarps][M * R];
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
  Tail::template finish<M, R>(p, ta, base, T / 32, tid);
}

// D += A · B for one mma.m16n8k16 (bf16 in, fp32 accumulate); A: x rows g and g + 8 (the latter zero),
// B: W rows of the block.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Tensor-core GEMV (gemv.h). Lane (g, t) streams chunk t of every 32-element K block of W row g (block row
// g) and of x row g (zeros for g >= M); D[m][n] of the mma is out[m][base + n], held by lane (m, n / 2).
template <int M, GemvEpilogue E, class Tail>
__global__ void __launch_bounds__(kMaxWarps * 32, Tail::kTcMinBlocks)
    gemv_tc_kernel(const __grid_constant__ GemvParams p, const __grid_constant__ typename Tail::Args ta) {
  constexpr int R = gemv_rows(GemvConfig{.tensor_cores = true});
  constexpr int U = 8;  // K blocks whose loads a warp issues together
  const int T = int(blockDim.x), tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, warps = T / 32;
  const int g = lane / 4, t = lane % 4;
  int64_t base = 0;
  const uint4* wrow = block_row<R, E>(p, g, base);
  const uint4* xrow = p.x + (g < M ? g : 0) * p.ldx8;
  const int64_t kblocks = (p.k8 + 3) / 4;
  if (p.pdl) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = (warp + int64_t(u) * warps) * 4 + t;
      if (c < p.k8) prefetch_l2(wrow + c);
    }
  }
  pdl_wait();

  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int64_t kb0 = warp; kb0 < kblocks; kb0 += int64_t(U) * warps) {
    uint4 wv[U], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = (kb0 + int64_t(u) * warps) * 4 + t;
      wv[u] = c < p.k8 ? load_stream(wrow + c) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = (kb0 + int64_t(u) * warps) * 4 + t;
      xv[u] = c < p.k8 && g < M ? __ldg(xrow + c) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kb0 + int64_t(u) * warps < kblocks) {  // warp-uniform: every lane takes part in the mma
        mma_bf16(d, xv[u].x, xv[u].y, wv[u].x, wv[u].y);
        mma_bf16(d, xv[u].z, xv[u].w, wv[u].z, wv[u].w);
      }
    }
  }

  __shared__ float red[kMaxWarps][M * R];
  if (g < M) {
    red[warp][g * R + 2 * t] = d[0];
    red[warp][g * R + 2 * t + 1] = d[1];
  }
  __syncthreads();
  store_outputs<M, R, E>(p, base, red, warps, tid);
  Tail::template finish<M, R>(p, ta, base, warps, tid);
}

// The Args of a tail that needs none.
struct NoArgs {};

// No tail: lets the dependent grid launch.
struct PlainTail {
  using Args = NoArgs;
  static constexpr int kTcMinBlocks = 0;
  template <int M, int R>
  static __device__ __forceinline__ void finish(const GemvParams&, const Args&, int64_t, int, int) {
    pdl_launch_dependents();
  }
};

}  // namespace kiln::cuda::gemv_detail
