// The ring GEMV (gemv.h: GemvConfig::ring): one persistent block per SM streams its contiguous share of W's
// rows through a shared-memory ring filled by 1-D bulk copies (cp.async.bulk, sm_90), so up to kRingBytes
// of W per SM are in flight from the first cycle -- before the PDL wait, while the previous kernel still
// runs -- and the stream has no per-block ramp or tail inside the grid.
//
// Mapping: block b owns items [b * items / G, (b + 1) * items / G) of the G = min(items, SMs) blocks (an item
// is a W row; for silu_mul a gate row j and its up row I + j). Its items are cut into stages of stage_items;
// stage s lives in slot s % stages (gate rows first, then the matching up rows). Warp `warps` is the
// producer: its lane 0 issues the first `stages` stages before the PDL wait, the rest as slots are released.
// Consumer warp w takes the block's items w, w + warps, ...; every consumer warp waits for every stage in
// order (full barrier), computes its items of the stage (x read through L1: [M, K] is small; lanes 0..M-1
// store row m's output) and releases the stage (the empty barrier counts one arrival a consumer warp).
//
// Summation order (fixed: two runs, any M, any place of the row in the grid, give the same bits): lane l
// accumulates acc = fmaf(x, w, acc) over the row's 16-byte chunks l, l + 32, ... in ascending order, the 8
// elements of a chunk in order; then an xor butterfly 16, 8, 4, 2, 1. silu_mul rounds g and u to bf16 and
// applies elementwise.h's silu_mul formula (vec.cuh: silu_mul_f32), so the fused epilogue is bitwise the bf16
// GEMV (this config) then silu_mul.
#include <algorithm>

#include "ops/cuda/attention_common.cuh"  // sm_count
#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/gemv_kernels.cuh"
#include "ops/cuda/gemv_ring.h"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr int kRingBytes = 96 * 1024;   // W in flight per block (two ring kernels fit one SM: PDL overlap)
constexpr int kMaxSmem = 227 * 1024;    // a block's shared memory on sm_90
constexpr int kStageBytes = 24 * 1024;  // a stage's target size (whole items)
constexpr int kMaxStages = 8;
constexpr int kMaxConsumers = 16;

struct RingParams {
  const uint4* x;  // [M, K / 8], row stride ldx8
  const uint4* w;  // [N, K / 8], row stride ldw8
  void* out;
  int64_t ldx8, ldw8, ldo;
  int64_t items;  // output columns (rows of W; silu_mul: I)
  int64_t half;   // silu_mul: I, the row offset of the up rows; else 0
  int k8;         // K / 8
  int stage_items, stages;
  gemv_detail::GemvParams ni;  // the residual-norm prologue's fields (k8, eps, ni_*), kNormIn only
};

// W rows per item.
template <GemvEpilogue E>
constexpr int rows_per_item() {
  return E == GemvEpilogue::silu_mul ? 2 : 1;
}

// One item (gemv_ring.cu's mapping): the dot products of x's M rows (row stride ldx8; shared memory when
// kSharedX, the prologue's rows) with the item's W row (wg, in the ring; silu_mul: and its up row,
// stage_items rows further), lane l over chunks l, l + 32, ..., the xor butterfly, then lane m stores
// output column `col` of row m.
template <int M, GemvEpilogue E, bool kSharedX>
__device__ __forceinline__ void ring_item(const RingParams& p, const uint4* x, int64_t ldx8, const uint4* wg,
                                          int64_t col, int lane) {
  constexpr int RI = rows_per_item<E>();
  const uint4* wu = wg + int64_t(p.stage_items) * p.k8;  // silu_mul: the up row
  float acc[RI][M];
#pragma unroll
  for (int h = 0; h < RI; ++h)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[h][m] = 0.0f;
#pragma unroll 4
  for (int c = lane; c < p.k8; c += 32) {
    float wf[RI][8];
    unpack8(wg[c], wf[0]);
    if constexpr (RI == 2) unpack8(wu[c], wf[RI - 1]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      unpack8(gemv_detail::load_x<kSharedX>(x + m * ldx8 + c), xf);
#pragma unroll
      for (int h = 0; h < RI; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][m] = fmaf(xf[e], wf[h][e], acc[h][m]);
    }
  }
#pragma unroll
  for (int h = 0; h < RI; ++h)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) acc[h][m] += __shfl_xor_sync(0xffffffffu, acc[h][m], off);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (lane != m) continue;
    if constexpr (E == GemvEpilogue::silu_mul) {
      const float y = silu_mul_f32(round_bf16(acc[0][m]), round_bf16(acc[RI - 1][m]));
      static_cast<uint16_t*>(p.out)[m * p.ldo + col] = uint16_t(f32_to_bf16_bits(y));
    } else if constexpr (E == GemvEpilogue::f32) {
      static_cast<float*>(p.out)[m * p.ldo + col] = acc[0][m];
    } else {
      static_cast<uint16_t*>(p.out)[m * p.ldo + col] = uint16_t(f32_to_bf16_bits(acc[0][m]));
    }
  }
}

// The consumer warps' barrier (named barrier 1): the producer warp never joins the prologue.
struct ConsumerSync {
  int threads;
  __device__ void operator()() const {
#ifdef KILN_SM90A
    sm90::named_bar_sync(1, uint32_t(threads));
#endif
  }
};

template <int M, GemvEpilogue E, bool kNormIn>
__global__ void __launch_bounds__((kMaxConsumers + 1) * 32)
    gemv_ring_kernel(const __grid_constant__ RingParams p) {
#ifdef KILN_SM90A
  using namespace sm90;
  constexpr int RI = rows_per_item<E>();
  extern __shared__ __align__(128) uint4 ring[];  // stages x (RI x stage_items rows of k8 chunks)
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  const int consumers = int(blockDim.x / 32) - 1, warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int64_t i0 = int64_t(blockIdx.x) * p.items / gridDim.x;
  const int64_t n_items = (int64_t(blockIdx.x) + 1) * p.items / gridDim.x - i0;
  const int64_t n_stages = (n_items + p.stage_items - 1) / p.stage_items;
  const int64_t slot_chunks = int64_t(RI) * p.stage_items * p.k8;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), uint32_t(consumers));
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == consumers) {  // the producer warp
    // Stage s into its slot: RI runs of `cnt` rows (one copy a run when the rows are contiguous).
    const auto issue = [&](int64_t s) {
      const int slot = int(s % p.stages);
      const int64_t first = i0 + s * p.stage_items;
      const int cnt = int(std::min<int64_t>(p.stage_items, n_items - s * p.stage_items));
      const uint32_t row_bytes = uint32_t(p.k8) * 16u, bar = smem_u32(&full[slot]);
      mbar_arrive_expect_tx(bar, uint32_t(RI * cnt) * row_bytes);
      for (int h = 0; h < RI; ++h) {
        const uint4* src = p.w + (first + h * p.half) * p.ldw8;
        const uint32_t dst = smem_u32(ring + slot * slot_chunks + int64_t(h) * p.stage_items * p.k8);
        if (p.ldw8 == p.k8) {
          bulk_load(dst, src, uint32_t(cnt) * row_bytes, bar);
        } else {
          for (int r = 0; r < cnt; ++r)
            bulk_load(dst + uint32_t(r) * row_bytes, src + r * p.ldw8, row_bytes, bar);
        }
      }
    };
    // W is never written by an earlier kernel (gemv.h): the first stages go out before the PDL wait.
    const int64_t first_round = std::min<int64_t>(p.stages, n_stages);
    if (lane == 0)
      for (int64_t s = 0; s < first_round; ++s) issue(s);
    pdl_wait();
    pdl_launch_dependents();
    if (lane == 0)
      for (int64_t s = first_round; s < n_stages; ++s) {
        mbar_wait(smem_u32(&empty[s % p.stages]), uint32_t((s / p.stages - 1) & 1));
        issue(s);
      }
    return;
  }

  pdl_wait();  // x (or delta and the residual) is the previous kernel's output
  pdl_launch_dependents();
  const uint4* x = p.x;
  int64_t ldx8 = p.ldx8;
  if constexpr (kNormIn) {  // x = the normalized rows, in shared memory after the ring (gemv.h: gemv_norm_in)
    uint4* xn = ring + p.stages * slot_chunks;
    const int T = consumers * 32;
    gemv_detail::norm_in_prologue<M>(p.ni, xn, xn + M * gemv_detail::norm_in_lds8(p.k8), int(threadIdx.x), T,
                                     ConsumerSync{T});
    x = xn;
    ldx8 = gemv_detail::norm_in_lds8(p.k8);
  }
  // Every consumer warp passes every stage in order (waits for it, then releases it), so a slot's barriers
  // are never a phase ahead of or behind the stage a warp expects; the stage's items r with
  // (s * stage_items + r) % consumers == warp are this warp's.
  for (int64_t s = 0; s < n_stages; ++s) {
    const int slot = int(s % p.stages);
    const int cnt = int(std::min<int64_t>(p.stage_items, n_items - s * p.stage_items));
    mbar_wait(smem_u32(&full[slot]), uint32_t((s / p.stages) & 1));
    for (int r = int((warp + consumers - (s * p.stage_items) % consumers) % consumers); r < cnt;
         r += consumers)
      ring_item<M, E, kNormIn>(p, x, ldx8, ring + slot * slot_chunks + int64_t(r) * p.k8,
                               i0 + s * p.stage_items + r, lane);
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&empty[slot]));  // this warp's reads of the stage are done
  }
#endif
}

using RingKernel = void (*)(RingParams);

template <GemvEpilogue E, bool N>
RingKernel ring_kernel_for(int64_t m) {
  static constexpr RingKernel k[kGemvMaxM] = {gemv_ring_kernel<1, E, N>, gemv_ring_kernel<2, E, N>,
                                              gemv_ring_kernel<3, E, N>, gemv_ring_kernel<4, E, N>,
                                              gemv_ring_kernel<5, E, N>, gemv_ring_kernel<6, E, N>,
                                              gemv_ring_kernel<7, E, N>, gemv_ring_kernel<8, E, N>};
  return k[m - 1];
}

template <bool N>
RingKernel ring_kernel_for(GemvEpilogue epi, int64_t m) {
  return epi == GemvEpilogue::bf16  ? ring_kernel_for<GemvEpilogue::bf16, N>(m)
         : epi == GemvEpilogue::f32 ? ring_kernel_for<GemvEpilogue::f32, N>(m)
                                    : ring_kernel_for<GemvEpilogue::silu_mul, N>(m);
}

}  // namespace

bool gemv_ring_available() {
  static PerDeviceFlag flag;
  return flag.get([] {
    return current_device_is_sm90() && kernel_binary_version(reinterpret_cast<const void*>(
                                           gemv_ring_kernel<1, GemvEpilogue::bf16, false>)) == 90;
  });
}

bool gemv_ring_fits(int64_t m, int64_t k, GemvEpilogue epi, bool norm_in) {
  const int64_t item_bytes = (epi == GemvEpilogue::silu_mul ? 2 : 1) * k * 2;
  const int64_t prologue = norm_in ? gemv_detail::norm_in_smem_bytes(m, k / 8) : 0;
  return m >= 1 && m <= kGemvMaxM && 2 * item_bytes <= kRingBytes && kRingBytes + prologue <= kMaxSmem - 1024;
}

void gemv_ring(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
               int64_t n, int64_t k, GemvEpilogue epi, int warps, cudaStream_t stream, bool pdl,
               const RingNormIn* ni) {
  KILN_CHECK(gemv_ring_available(),
             "gemv: the ring configs need an sm_90 device running this build's sm_90a code");
  KILN_CHECK(gemv_ring_fits(m, k, epi, ni != nullptr), "gemv: the ring config cannot hold rows of K ", k,
             " (at most ", kRingBytes / 4, " bytes a row, ", kRingBytes / 8,
             " for silu_mul, with the prologue's ", m, " rows beside them)");
  KILN_CHECK(warps >= 1 && warps <= kMaxConsumers, "gemv: ring warps must be in [1, ", kMaxConsumers, "]");
  const bool silu = epi == GemvEpilogue::silu_mul;
  const int64_t items = silu ? n / 2 : n, item_bytes = (silu ? 2 : 1) * k * 2;
  const int64_t blocks = std::min<int64_t>(items, sm_count());
  const int64_t per_block = (items + blocks - 1) / blocks;
  const int stage_items = int(std::clamp<int64_t>(kStageBytes / item_bytes, 1, per_block));
  // Slots: as many stages as the ring holds (>= 2: gemv_ring_fits), no more than the block has.
  const int stages =
      int(std::max<int64_t>(1, std::min({int64_t(kMaxStages), kRingBytes / (stage_items * item_bytes),
                                         (per_block + stage_items - 1) / stage_items})));
  RingParams p{.x = static_cast<const uint4*>(x),
               .w = static_cast<const uint4*>(w),
               .out = out,
               .ldx8 = ldx / 8,
               .ldw8 = ldw / 8,
               .ldo = ldo,
               .items = items,
               .half = silu ? n / 2 : 0,
               .k8 = int(k / 8),
               .stage_items = stage_items,
               .stages = stages,
               .ni = {}};
  size_t smem = size_t(stages) * size_t(stage_items) * size_t(item_bytes);
  if (ni) {
    p.ni.k8 = k / 8;
    p.ni.eps = ni->eps;
    p.ni.ni_delta = static_cast<const uint4*>(ni->delta);
    p.ni.ni_residual = static_cast<uint4*>(ni->residual);
    p.ni.ni_w = static_cast<const uint4*>(ni->norm_w);
    p.ni.ni_ldd8 = ni->ldd / 8;
    p.ni.ni_ldr8 = ni->ldr / 8;
    smem += size_t(gemv_detail::norm_in_smem_bytes(m, k / 8));
  }
  const RingKernel kern = ni ? ring_kernel_for<true>(epi, m) : ring_kernel_for<false>(epi, m);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch({.grid = dim3(unsigned(blocks)),
          .block = dim3(unsigned((warps + 1) * 32)),
          .smem = smem,
          .stream = stream,
          .pdl = pdl,
          .smem_attr_set = true},
         kern, p);
}

}  // namespace kiln::cuda
