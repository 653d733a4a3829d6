// Device code of the sparse MLP's routing (ops/moe.h's moe_route bit for bit) shared by the route kernel
// (moe_route.cu, logits given) and the fused router GEMV + route kernel (moe_router.cu): one warp routes a
// token, one block a chunk of kMoeChunkTokens tokens and, when the chunk is the whole batch, lays the sorted
// rows out.
#pragma once

#include <climits>
#include <cmath>

#include "ops/cuda/moe.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda::moe_detail {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kRouteWarps = 8;  // warps of a routing block

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
  int e0, e1;  // the rank's experts [e0, e1) (MoeShape::expert_begin, expert_end): the others get no row
  bool norm;
  bool fused;  // T <= 32: one block also lays out the rows and scatters the pairs (no permute launches)
};

// A routing block's shared memory.
struct RouteSmem {
  uint32_t chosen_by[kMoeRouteMaxExperts];  // bit t mod 32: the chunk's token t chose the expert
  int cnt[kMoeRouteMaxExperts], off[kMoeRouteMaxExperts];
  int act[kMoeRouteMaxExperts + 1];  // write_layout's active experts, their number last
};

// A non-NaN bf16 logit of expert i as a u32 whose unsigned order is the routing's choice order: the logit's
// order (-0 taken as +0, so equal values tie) in the high half, 0xffff - i (the lower index wins a tie) in
// the low half. Never 0 (the top half of -Inf is 0x007f), so 0 marks a taken or absent expert.
__device__ __forceinline__ uint32_t route_key(uint32_t bits, int i) {
  if ((bits & 0x7fffu) == 0) bits = 0;
  const uint32_t ord = (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
  return ord << 16 | uint32_t(0xffff - i);
}

// Token t's routing by one warp (lane l holds experts l, l + 32, ...: the canonical lane partials of
// ops/moe.h; kPer >= ceil(E / 32) registers a lane); ORs the token's bit (t mod 32) into chosen_by[e] for
// each chosen e. Logits are read through L2 (__ldcg: the fused kernel's other blocks wrote them), or, with
// kSmemLogits, from this block's shared memory (p.logits then points there; the cluster form of the fused
// kernel gathers them so).
template <int kPer, bool kSmemLogits>
__device__ __forceinline__ void route_token(const RouteParams& p, int t, int lane, uint32_t* chosen_by) {
  uint32_t taken = 0;  // bit r: expert r * 32 + lane chosen
  const uint16_t* row = p.logits + int64_t(t) * p.ls;
  float l[kPer], ev[kPer];
  uint32_t key[kPer];
  float m = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = r * 32 + lane;
    const uint32_t bits = i >= p.E ? 0u : kSmemLogits ? uint32_t(row[i]) : uint32_t(__ldcg(row + i));
    l[r] = bf16_bits_to_f32(bits);
    key[r] = i < p.E ? route_key(bits, i) : 0u;
    if (i < p.E) m = fmaxf(m, l[r]), nan |= isnan(l[r]);
  }
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (!__any_sync(kFull, nan)) {
    // k passes of one warp max over the keys: the largest logit, the lowest index among equals.
    for (int j = 0; j < p.k; ++j) {
      uint32_t best = 0;
#pragma unroll
      for (int r = 0; r < kPer; ++r) best = max(best, key[r]);
      best = __reduce_max_sync(kFull, best);
#pragma unroll
      for (int r = 0; r < kPer; ++r)
        if (key[r] == best) key[r] = 0, taken |= 1u << r;
    }
  } else {
    // A NaN in the row: k passes, each the CPU's scan "first untaken expert, replaced by any strictly
    // larger one": the first untaken expert if its logit is NaN (nothing beats it), else the largest
    // non-NaN logit, lowest index.
    for (int j = 0; j < p.k; ++j) {
      float bv = -INFINITY;
      int bi = INT_MAX, first = INT_MAX;
      bool first_nan = false;
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int i = r * 32 + lane;
        if (i >= p.E || (taken >> r & 1u)) continue;
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
  }
  // e_i in fp64 exp rounded once; lane partials in ascending index, then the xor butterfly.
  float part = 0.0f;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = r * 32 + lane;
    ev[r] = 0.0f;
    if (i < p.E) {
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
  for (int r = 0; r < kPer; ++r) {
    if (r * 32 >= p.E) break;  // the same for the whole warp
    const uint32_t mask = __ballot_sync(kFull, taken >> r & 1u);
    ev[r] = __fdiv_rn(ev[r], S);
    for (uint32_t rest = mask; rest; rest &= rest - 1) s_k += __shfl_sync(kFull, ev[r], __ffs(int(rest)) - 1);
    if (taken >> r & 1u) {
      const int slot = base + __popc(mask & ((1u << lane) - 1u));
      p.experts[int64_t(t) * p.k + slot] = r * 32 + lane;
    }
    base += __popc(mask);
  }
  base = 0;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    if (r * 32 >= p.E) break;
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

// Warp 0 of a block: from the per-expert counts cnt[0, E) (shared memory), the layout's counts, padded
// offsets, active list and totals, the offsets into off_s[0, E) and the active experts into act_s[0, n) with
// n = act_s[E] (shared memory); the tiles and padding rows follow in write_layout_rows. Lane l owns the
// experts [l per, (l + 1) per); the offsets are an exclusive scan over the lanes.
__device__ inline void write_layout(const int* cnt, int E, const Layout& o, int* off_s, int* act_s) {
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
    const int n = cnt[e];
    o.counts[e] = n;
    o.offsets[e] = off;
    off_s[e] = off;
    if (n > 0) {
      o.active[slot] = e;
      act_s[slot++] = e;
    }
    off += (n + kMoeRowTile - 1) / kMoeRowTile * kMoeRowTile;
  }
  if (lane == 31) {
    o.offsets[E] = rows_inc;
    *o.num_tiles = rows_inc / kMoeRowTile;
    o.active[E] = act_inc;
    act_s[E] = act_inc;
  }
}

// The whole block, after write_layout and a barrier: each active expert's tiles in the tile -> expert map
// and its padding rows (-1), thread i of the block taking slot i, i + blockDim, ... of (active expert, row of
// a 64-row window): the window's rows past the count are padding (only the last tile has any), row r of the
// window names the expert's tiles r, r + 64, ... (spread over the block: one lane an expert would store up
// to 63 padding rows in a row, on the routing's critical path). No row here is a pair's row, so
// route_chunk's scatter needs no barrier after this.
__device__ inline void write_layout_rows(const int* cnt, const int* off_s, const int* act_s, const Layout& o,
                                         int E) {
  const int n_act = act_s[E];
  for (int i = int(threadIdx.x); i < n_act * kMoeRowTile; i += int(blockDim.x)) {
    const int e = act_s[i / kMoeRowTile], r = i % kMoeRowTile;
    const int n = cnt[e], tiles = (n + kMoeRowTile - 1) / kMoeRowTile, off = off_s[e];
    for (int t = r; t < tiles; t += kMoeRowTile) o.tile_expert[off / kMoeRowTile + t] = e;
    const int row = (tiles - 1) * kMoeRowTile + r;
    if (row >= n) o.sorted_pair[off + row] = -1;
  }
}

// One block (any number of warps W) routes chunk `chunk`: warp w the chunk's tokens w, w + W, ... Then each
// thread takes pairs of the chunk: a pair's rank is the count of the chunk's lower tokens that chose the
// same expert (the population of chosen_by[e] below the token's bit), the chunk's count per expert the
// population of chosen_by[e]. Fused (one chunk): the block lays the rows out from those counts
// (write_layout, write_layout_rows) and the pairs are scattered to offset + rank here (the rank's experts
// [e0, e1) only: the others count 0, inverse -1). kSmemLogits: route_token's.
template <bool kSmemLogits = false>
__device__ inline void route_chunk(const RouteParams& p, int chunk, RouteSmem& sm) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int t0 = chunk * kMoeChunkTokens;
  for (int i = int(threadIdx.x); i < p.E; i += int(blockDim.x)) sm.chosen_by[i] = 0;
  __syncthreads();
  for (int w = warp; w < kMoeChunkTokens && t0 + w < p.T; w += int(blockDim.x) / 32) {
    if (p.E <= 128) {
      route_token<4, kSmemLogits>(p, t0 + w, lane, sm.chosen_by);
    } else {
      route_token<kMoeRouteMaxExperts / 32, kSmemLogits>(p, t0 + w, lane, sm.chosen_by);
    }
  }
  __syncthreads();  // also orders this block's expert writes before the reads below
  if (p.fused) {
    for (int i = int(threadIdx.x); i < p.E; i += int(blockDim.x))
      sm.cnt[i] = i >= p.e0 && i < p.e1 ? __popc(sm.chosen_by[i]) : 0;
    __syncthreads();
    if (warp == 0) write_layout(sm.cnt, p.E, p.layout, sm.off, sm.act);
    __syncthreads();
    write_layout_rows(sm.cnt, sm.off, sm.act, p.layout, p.E);
  }
  const int n = min(kMoeChunkTokens, p.T - t0) * p.k;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) {
    const int64_t pair = int64_t(t0) * p.k + i;
    const int e = p.experts[pair];
    const int rank = __popc(sm.chosen_by[e] & ((1u << (i / p.k)) - 1u));
    if (p.fused) {
      const bool local = e >= p.e0 && e < p.e1;
      const int row = sm.off[e] + rank;
      if (local) p.layout.sorted_pair[row] = int32_t(pair);
      p.inverse[pair] = local ? row : -1;
    } else {
      p.rank[pair] = rank;
    }
  }
  if (!p.fused)
    for (int i = int(threadIdx.x); i < p.E; i += int(blockDim.x))
      p.chunk_counts[int64_t(chunk) * p.E + i] = __popc(sm.chosen_by[i]);
}

// The Layout view of a scratch's buffers.
inline Layout layout_of(const MoeBuffers& b) {
  return {.counts = b.counts,
          .offsets = b.offsets,
          .tile_expert = b.tile_expert,
          .num_tiles = b.num_tiles,
          .active = b.active,
          .sorted_pair = b.sorted_pair};
}

// The routing of logits bf16 [T, E] (row stride ls) into the scratch's buffers; fused when the batch is one
// chunk and the scratch has the layout's buffers.
inline RouteParams route_params(const uint16_t* logits, int64_t ls, const MoeShape& s, bool norm_topk_prob,
                                const MoeBuffers& b) {
  return {.logits = logits,
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
          .e0 = int(s.expert_begin),
          .e1 = int(s.expert_end()),
          .norm = norm_topk_prob,
          .fused = s.chunks() == 1 && b.offsets != nullptr};
}

}  // namespace kiln::cuda::moe_detail
