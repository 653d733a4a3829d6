// The sparse MLP's routing and token permutation on the GPU (moe.h steps 1-3): moe_route's contract
// (ops/moe.h) bit for bit, then the pairs sorted by expert with integer counts only, so the layout is the
// same on every run.
#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kPerLane = kMoeRouteMaxExperts / 32;

// The expert layout of the sorted rows (moe.h MoeBuffers), written once the counts are known.
struct Layout {
  int32_t* counts;       // i32 [E]
  int32_t* offsets;      // i32 [E + 1]
  int32_t* tile_expert;  // i32 [max_tiles]
  int32_t* num_tiles;    // i32 [1]
  int32_t* active;       // i32 [E + 1]
  int32_t* sorted_pair;  // i32 [max_rows]: only the padding rows (-1) are written here
};

struct RouteParams {
  const uint16_t* logits;  // bf16 [T, E], row stride ls
  int64_t ls;
  int32_t* experts;       // i32 [T, k]
  uint16_t* weights;      // bf16 [T, k]
  int32_t* rank;          // i32 [T * k] (unused when fused)
  int32_t* chunk_counts;  // i32 [chunks, E] (unused when fused)
  Layout layout;          // fused only
  int32_t* inverse;       // i32 [T * k], fused only
  int T, E, k;
  bool norm;
  bool fused;  // T <= 32: one block also lays out the rows and scatters the pairs (no permute launches)
};

constexpr int kRouteWarps = 8;

// Token t's routing by one warp (lane l holds experts l, l + 32, ...: the canonical lane partials of
// ops/moe.h); ORs the token's bit (t mod 32) into chosen_by[e] for each chosen e.
__device__ __forceinline__ void route_token(const RouteParams& p, int t, int lane, uint32_t* chosen_by) {
  const int per = (p.E + 31) / 32;
  uint32_t taken = 0;  // bit r: expert r * 32 + lane chosen
  const uint16_t* row = p.logits + int64_t(t) * p.ls;
  float l[kPerLane], ev[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int i = r * 32 + lane;
    l[r] = (r < per && i < p.E) ? bf16_bits_to_f32(row[i]) : 0.0f;
    if (r < per && i < p.E) m = fmaxf(m, l[r]);
  }
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  // k passes, each the CPU's scan "first untaken expert, replaced by any strictly larger one": the first
  // untaken expert if its logit is NaN (nothing beats it), else the largest non-NaN logit, lowest index.
  for (int j = 0; j < p.k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX, first = INT_MAX;
    bool first_nan = false;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int i = r * 32 + lane;
      if (r >= per || i >= p.E || (taken >> r & 1u)) continue;
      if (first == INT_MAX) first = i, first_nan = isnan(l[r]);
      if (!isnan(l[r]) && (bi == INT_MAX || l[r] > bv)) bv = l[r], bi = i;
    }
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oi = __shfl_xor_sync(kFull, bi, o);
      if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
      first = min(first, __shfl_xor_sync(kFull, first, o));
    }
    const bool nan_first = __shfl_sync(kFull, first_nan, first % 32);
    const int pick = nan_first ? first : bi;
    if (pick % 32 == lane) taken |= 1u << (pick / 32);
  }
  // e_i in fp64 exp rounded once; lane partials in ascending index, then the xor butterfly.
  float part = 0.0f;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int i = r * 32 + lane;
    ev[r] = 0.0f;
    if (r < per && i < p.E) {
      ev[r] = float(exp(double(l[r] - m)));
      part += ev[r];
    }
  }
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) part = part + __shfl_xor_sync(kFull, part, o);
  const float S = part;
  // Slots in ascending expert index; s_k summed in that order from +0 (every lane the same value).
  float s_k = 0.0f;
  int base = 0;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    if (r >= per) break;
    const uint32_t mask = __ballot_sync(kFull, taken >> r & 1u);
    ev[r] = __fdiv_rn(ev[r], S);
    for (uint32_t rest = mask; rest; rest &= rest - 1) s_k += __shfl_sync(kFull, ev[r], __ffs(int(rest)) - 1);
    if (taken >> r & 1u) {
      const int slot = base + __popc(mask & ((1u << lane) - 1u));
      const int64_t at = int64_t(t) * p.k + slot;
      p.experts[at] = r * 32 + lane;
    }
    base += __popc(mask);
  }
  base = 0;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    if (r >= per) break;
    const uint32_t mask = __ballot_sync(kFull, taken >> r & 1u);
    if (taken >> r & 1u) {
      const int slot = base + __popc(mask & ((1u << lane) - 1u));
      const float w = p.norm ? __fdiv_rn(ev[r], s_k) : ev[r];
      p.weights[int64_t(t) * p.k + slot] = uint16_t(f32_to_bf16_bits(w));
      atomicOr(&chosen_by[r * 32 + lane], 1u << (t % kMoeChunkTokens));
    }
    base += __popc(mask);
  }
}

// Warp 0 of a block: from the per-expert counts cnt[0, E) (shared memory), the layout (padded offsets,
// tiles, padding rows, the active list) and the offsets into off_s[0, E) (shared memory). Lane l owns the
// experts [l per, (l + 1) per); the offsets are an exclusive scan over the lanes.
__device__ void write_layout(const int* cnt, int E, const Layout& o, int* off_s) {
  const int lane = int(threadIdx.x) % 32, per = (E + 31) / 32;
  const int lo = min(E, lane * per), hi = min(E, lo + per);
  int rows = 0, act = 0;
  for (int e = lo; e < hi; ++e) {
    rows += (cnt[e] + kMoeRowTile - 1) / kMoeRowTile * kMoeRowTile;
    act += cnt[e] > 0;
  }
  int rows_inc = rows, act_inc = act;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int r = __shfl_up_sync(kFull, rows_inc, d), a = __shfl_up_sync(kFull, act_inc, d);
    if (lane >= d) rows_inc += r, act_inc += a;
  }
  int off = rows_inc - rows, slot = act_inc - act;
  for (int e = lo; e < hi; ++e) {
    const int n = cnt[e], padded = (n + kMoeRowTile - 1) / kMoeRowTile * kMoeRowTile;
    o.counts[e] = n;
    o.offsets[e] = off;
    off_s[e] = off;
    for (int i = 0; i < padded / kMoeRowTile; ++i) o.tile_expert[off / kMoeRowTile + i] = e;
    for (int r = n; r < padded; ++r) o.sorted_pair[off + r] = -1;
    if (n > 0) o.active[slot++] = e;
    off += padded;
  }
  if (lane == 31) {
    o.offsets[E] = rows_inc;
    *o.num_tiles = rows_inc / kMoeRowTile;
    o.active[E] = act_inc;
  }
}

// Grid: one block per chunk of 32 tokens; block: 8 warps, warp w routes the chunk's tokens w, w + 8, ...
// Then each thread takes pairs of the chunk: a pair's rank is the count of the chunk's lower tokens that
// chose the same expert (the population of chosen_by[e] below the token's bit), the chunk's count per
// expert the population of chosen_by[e]. Fused (one chunk): warp 0 lays the rows out from those counts and
// the pairs are scattered to offset + rank here.
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(const __grid_constant__ RouteParams p) {
  pdl_wait();  // launched with PDL where enabled: nothing global is touched before the predecessor is done
  __shared__ uint32_t chosen_by[kMoeRouteMaxExperts];
  __shared__ int cnt_s[kMoeRouteMaxExperts], off_s[kMoeRouteMaxExperts];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int chunk = int(blockIdx.x), t0 = chunk * kMoeChunkTokens;
  for (int i = int(threadIdx.x); i < p.E; i += int(blockDim.x)) chosen_by[i] = 0;
  __syncthreads();
  for (int w = warp; w < kMoeChunkTokens && t0 + w < p.T; w += kRouteWarps)
    route_token(p, t0 + w, lane, chosen_by);
  __syncthreads();  // also orders this block's expert writes before the reads below
  if (p.fused) {
    for (int i = int(threadIdx.x); i < p.E; i += int(blockDim.x)) cnt_s[i] = __popc(chosen_by[i]);
    __syncthreads();
    if (warp == 0) write_layout(cnt_s, p.E, p.layout, off_s);
    __syncthreads();
  }
  const int n = min(kMoeChunkTokens, p.T - t0) * p.k;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) {
    const int64_t pair = int64_t(t0) * p.k + i;
    const int e = p.experts[pair];
    const int rank = __popc(chosen_by[e] & ((1u << (i / p.k)) - 1u));
    if (p.fused) {
      const int row = off_s[e] + rank;
      p.layout.sorted_pair[row] = int32_t(pair);
      p.inverse[pair] = row;
    } else {
      p.rank[pair] = rank;
    }
  }
  if (!p.fused)
    for (int i = int(threadIdx.x); i < p.E; i += int(blockDim.x))
      p.chunk_counts[int64_t(chunk) * p.E + i] = __popc(chosen_by[i]);
}

struct OffsetsParams {
  int32_t* chunk_counts;  // i32 [chunks, E]: in counts, out each chunk's first row within its expert
  Layout layout;
  int chunks, E;
};

// Grid: 1 block; block: 1024 threads, thread e < E sums expert e's counts over the chunks (rewriting each
// chunk's count to its exclusive prefix); then warp 0 writes the layout.
__global__ void __launch_bounds__(kMoeMaxExperts) offsets_kernel(const __grid_constant__ OffsetsParams p) {
  pdl_wait();
  __shared__ int cnt_s[kMoeMaxExperts], off_s[kMoeMaxExperts];
  for (int e = int(threadIdx.x); e < p.E; e += int(blockDim.x)) {
    int count = 0;
    for (int c = 0; c < p.chunks; ++c) {
      int32_t& cc = p.chunk_counts[int64_t(c) * p.E + e];
      const int n = cc;
      cc = count;
      count += n;
    }
    cnt_s[e] = count;
  }
  __syncthreads();
  if (threadIdx.x < 32) write_layout(cnt_s, p.E, p.layout, off_s);
}

struct ScatterParams {
  const int32_t* experts;       // i32 [T * k]
  const int32_t* rank;          // i32 [T * k]
  const int32_t* chunk_counts;  // i32 [chunks, E]: each chunk's first row within its expert
  const int32_t* offsets;       // i32 [E + 1]
  int32_t* sorted_pair;         // i32 [max_rows]
  int32_t* inverse;             // i32 [T * k]
  int64_t pairs;
  int k, E;
};

// Grid-stride, one thread a pair: its row = expert offset + chunk's first row + rank in the chunk.
__global__ void scatter_kernel(const __grid_constant__ ScatterParams p) {
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.pairs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int e = p.experts[i];
    const int64_t chunk = i / p.k / kMoeChunkTokens;
    const int row = p.offsets[e] + p.chunk_counts[chunk * p.E + e] + p.rank[i];
    p.sorted_pair[row] = int32_t(i);
    p.inverse[i] = row;
  }
}

Layout layout_of(const MoeBuffers& b) {
  return {.counts = b.counts,
          .offsets = b.offsets,
          .tile_expert = b.tile_expert,
          .num_tiles = b.num_tiles,
          .active = b.active,
          .sorted_pair = b.sorted_pair};
}

}  // namespace

void moe_route_launch(const uint16_t* logits, int64_t ls, const MoeShape& s, bool norm_topk_prob,
                      const MoeBuffers& b, cudaStream_t stream) {
  KILN_CHECK(s.E >= 1 && s.E <= kMoeRouteMaxExperts, "moe_route: ", s.E,
             " experts; the CUDA kernel takes 1 to ", kMoeRouteMaxExperts);
  KILN_CHECK(s.k >= 1 && s.k <= s.E, "moe_route: top_k ", s.k, " outside [1, ", s.E, "]");
  if (s.T == 0) return;
  const RouteParams p{.logits = logits,
                      .ls = ls,
                      .experts = b.experts,
                      .weights = b.weights,
                      .rank = b.rank,
                      .chunk_counts = b.chunk_counts,
                      .layout = layout_of(b),
                      .inverse = b.inverse,
                      .T = int(s.T),
                      .E = int(s.E),
                      .k = int(s.k),
                      .norm = norm_topk_prob,
                      .fused = s.chunks() == 1 && b.offsets != nullptr};
  launch({.grid = dim3(unsigned(s.chunks())),
          .block = dim3(32 * kRouteWarps),
          .stream = stream,
          .pdl = pdl_for(PdlSite::elementwise)},
         route_kernel, p);
}

void moe_permute_launch(const MoeShape& s, const MoeBuffers& b, cudaStream_t stream) {
  KILN_CHECK(s.E >= 1 && s.E <= kMoeRouteMaxExperts, "moe_permute: ", s.E,
             " experts; the CUDA kernels take 1 to ", kMoeRouteMaxExperts);
  if (s.T == 0 || s.chunks() == 1) return;  // one chunk: done by the route kernel
  const OffsetsParams op{
      .chunk_counts = b.chunk_counts, .layout = layout_of(b), .chunks = int(s.chunks()), .E = int(s.E)};
  launch({.grid = dim3(1),
          .block = dim3(kMoeMaxExperts),
          .stream = stream,
          .pdl = pdl_for(PdlSite::elementwise)},
         offsets_kernel, op);
  const ScatterParams sp{.experts = b.experts,
                         .rank = b.rank,
                         .chunk_counts = b.chunk_counts,
                         .offsets = b.offsets,
                         .sorted_pair = b.sorted_pair,
                         .inverse = b.inverse,
                         .pairs = s.T * s.k,
                         .k = int(s.k),
                         .E = int(s.E)};
  const int64_t blocks = std::min<int64_t>((sp.pairs + 255) / 256, 1024);
  launch({.grid = dim3(unsigned(blocks)),
          .block = dim3(256),
          .stream = stream,
          .pdl = pdl_for(PdlSite::elementwise)},
         scatter_kernel, sp);
}

}  // namespace kiln::cuda
