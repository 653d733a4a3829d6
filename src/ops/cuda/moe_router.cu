// The router GEMV and the routing in one launch for decode-sized batches (moe.h step 1 with its logits):
// blocks compute the router logits in ops/moe.h's canonical order, and the block that finishes a chunk of
// tokens last routes it (moe_route.cuh), so the logits never wait for a second launch.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemv.cuh"
#include "ops/cuda/moe_route.cuh"
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

constexpr int kRouterWarps = kRouteWarps;  // experts a block, one a warp (the tail routes with them)
constexpr int kRouterTokens = 8;           // tokens a block (grid y)
constexpr int kRouterRound = 8;            // 16-byte router chunks a lane holds at once
constexpr int kRouterChunks = kMoeRouterMaxTokens / kMoeChunkTokens;
static_assert(kMoeChunkTokens % kRouterTokens == 0, "a block's tokens lie in one routing chunk");

// Blocks of the current launch that have stored their logits, per routing chunk; the chunk's last block
// resets its count to 0. Safe for any number of launches on one stream, in a graph or not, not for two in
// flight at once on two streams of one device (gemv.h's add + RMSNorm counter, the same argument).
__device__ unsigned g_router_blocks_done[kRouterChunks];

struct RouterParams {
  const uint16_t* x;  // bf16 [T, H], row stride xs (the norm prologue: unused)
  int64_t xs;
  const uint16_t* router;  // bf16 [E, H] contiguous
  uint16_t* logits;        // bf16 [T, E] contiguous (route.logits)
  int H;
  RouteParams route;
  MoeNormIn norm;  // the residual-norm prologue's tensors (kNormIn)
};

// Grid: (ceil(E / 8), ceil(T / 8)); block: 8 warps. Warp w of block (x, y) owns expert e = 8 x + w and
// tokens [8 y, 8 y + 8): lane l takes the 16-byte chunks l, l + 32, ... of router row e (8 held in
// registers at a time, the first 8 loaded before the PDL wait: the router is never written on the stream)
// and of each token's x row, acc = fmaf(x, w, acc) in ascending chunk and element order, then an xor
// butterfly 16, 8, 4, 2, 1; lane 0 stores bf16(acc) (ops/moe.h's canonical router order). Then every thread
// fences, the block counts itself on its chunk's counter, and the chunk's last block routes the chunk
// (route_chunk: experts, weights and, for a single chunk, the sorted layout).
// x is staged in shared memory first (the block's rows, every 16-byte load in flight at once).
// kNormIn (T <= 8, one block row): x is not read; the block computes h = bf16(residual + delta) of every row
// into shared memory, then warp g < T normalizes row g with the rms_norm kernel's arithmetic (norm_row.cuh:
// lane chunk squares, butterfly, bf16(bf16(h inv) w); the norm weight staged before the PDL wait), and the
// last block, once every block has read residual, writes h back to residual and the normed rows to normed:
// bitwise add_rms_norm then the plain kernel.
template <bool kNormIn>
__global__ void __launch_bounds__(kRouterWarps * 32)
    router_route_kernel(const __grid_constant__ RouterParams p) {
  __shared__ RouteSmem sm;
  __shared__ bool last;
  extern __shared__ uint4 xs[];  // [min(T, 8), H / 8]: the block's x rows (kNormIn: the normed rows)
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int E = p.route.E, T = p.route.T;
  const int e = int(blockIdx.x) * kRouterWarps + warp, t0 = int(blockIdx.y) * kRouterTokens;
  const int tn = min(kRouterTokens, T - t0), nc = p.H / 8;
  const uint16_t* wr = p.router + int64_t(min(e, E - 1)) * p.H;
  uint4 wv[kRouterRound];
  const auto load_round = [&](int c0) {
#pragma unroll
    for (int i = 0; i < kRouterRound; ++i) {
      const int c = c0 + lane + 32 * i;
      wv[i] = c < nc ? __ldg(reinterpret_cast<const uint4*>(wr) + c) : make_uint4(0, 0, 0, 0);
    }
  };
  // Token t's residual-add chunk c: h = bf16(residual + delta).
  const auto h_chunk = [&](int t, int c) {
    return norm_add_chunk(
        __ldg(reinterpret_cast<const uint4*>(p.norm.delta + int64_t(t) * p.norm.ds) + c),
        __ldg(reinterpret_cast<const uint4*>(p.norm.residual + int64_t(t) * p.norm.rs) + c));
  };
  uint4* const wsm = xs + int64_t(kNormIn ? T : 0) * nc;  // kNormIn: the norm weight [H / 8]
  if constexpr (kNormIn)  // never written on the stream: staged before the PDL wait
    for (int c = int(threadIdx.x); c < nc; c += int(blockDim.x))
      wsm[c] = __ldg(reinterpret_cast<const uint4*>(p.norm.weight) + c);
  load_round(0);
  pdl_wait();               // x (or delta and residual) is the previous kernels' output
  pdl_launch_dependents();  // every block of this grid is resident once the dependents may launch
  if constexpr (kNormIn) {  // h of every row by the whole block (every load in flight), then warp g's norm
    for (int i = int(threadIdx.x); i < T * nc; i += int(blockDim.x)) xs[i] = h_chunk(i / nc, i % nc);
    __syncthreads();
    if (warp < T) {
      uint4* row = xs + int64_t(warp) * nc;
      float acc = 0.0f;
      for (int c = lane; c < nc; c += 32) norm_square_chunk(row[c], acc);
      const float inv = norm_inv_rms(acc, nc, p.norm.eps);
      for (int c = lane; c < nc; c += 32) row[c] = norm_scale_chunk(row[c], wsm[c], inv);
    }
  } else {  // the block's x rows into shared memory, every load in flight at once
    for (int i = int(threadIdx.x); i < tn * nc; i += int(blockDim.x))
      xs[i] = __ldg(reinterpret_cast<const uint4*>(p.x + int64_t(t0 + i / nc) * p.xs) + i % nc);
  }
  __syncthreads();
  if (e < E) {
    float acc[kRouterTokens] = {};
    for (int c0 = 0; c0 < nc; c0 += 32 * kRouterRound) {
      if (c0 > 0) load_round(c0);
#pragma unroll
      for (int i = 0; i < kRouterRound; ++i) {
        const int c = c0 + lane + 32 * i;
        if (c >= nc) break;
        float wf[8];
        unpack8(wv[i], wf);
#pragma unroll
        for (int g = 0; g < kRouterTokens; ++g) {
          if (g >= tn) break;
          float xf[8];
          unpack8(xs[int64_t(g) * nc + c], xf);
          acc[g] = dot8(xf, wf, acc[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kRouterTokens; ++g) {
      if (g >= tn) break;
#pragma unroll
      for (int o = 16; o >= 1; o /= 2) acc[g] += __shfl_xor_sync(kFull, acc[g], o);
      if (lane == 0) p.logits[int64_t(t0 + g) * E + e] = uint16_t(f32_to_bf16_bits(acc[g]));
    }
  }
  __threadfence();
  __syncthreads();
  const int chunk = t0 / kMoeChunkTokens;
  if (threadIdx.x == 0) {
    const int chunk_tokens = min(kMoeChunkTokens, T - chunk * kMoeChunkTokens);
    const unsigned blocks = gridDim.x * unsigned((chunk_tokens + kRouterTokens - 1) / kRouterTokens);
    last = atomicAdd(&g_router_blocks_done[chunk], 1u) == blocks - 1;
    if (last) atomicExch(&g_router_blocks_done[chunk], 0u);  // every block has counted: ready for the next
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  if constexpr (kNormIn) {  // every block has read residual: the new residual and the normed rows
    for (int i = int(threadIdx.x); i < T * nc; i += int(blockDim.x)) {
      const int t = i / nc, c = i % nc;
      const uint4 h = h_chunk(t, c);
      reinterpret_cast<uint4*>(p.norm.residual + int64_t(t) * p.norm.rs)[c] = h;
      reinterpret_cast<uint4*>(p.norm.normed + int64_t(t) * p.norm.ns)[c] = xs[i];
    }
  }
  route_chunk(p.route, chunk, sm);
}

}  // namespace

void moe_router_route_launch(const uint16_t* x, int64_t xs, const uint16_t* router, const MoeShape& s,
                             bool norm_topk_prob, const MoeBuffers& b, cudaStream_t stream,
                             const MoeNormIn* norm) {
  KILN_CHECK(s.E >= 1 && s.E <= kMoeRouteMaxExperts, "moe_router_route: ", s.E,
             " experts; the CUDA kernel takes 1 to ", kMoeRouteMaxExperts);
  KILN_CHECK(s.k >= 1 && s.k <= s.E, "moe_router_route: top_k ", s.k, " outside [1, ", s.E, "]");
  KILN_CHECK(s.T <= kMoeRouterMaxTokens, "moe_router_route: ", s.T,
             " tokens; the fused router takes at most ", kMoeRouterMaxTokens);
  KILN_CHECK(s.H % 8 == 0 && xs % 8 == 0 && s.H <= kMoeRouterMaxHidden, "moe_router_route: hidden ", s.H,
             " and x's row stride ", xs, " must be multiples of 8 (16-byte chunks), hidden at most ",
             kMoeRouterMaxHidden, " (8 rows in shared memory)");
  KILN_CHECK(!norm || (s.T <= kMoeRouterNormInMaxTokens && s.H <= kMoeRouterMaxHidden && norm->ds % 8 == 0 &&
                       norm->rs % 8 == 0 && norm->ns % 8 == 0),
             "moe_router_route: the norm prologue takes up to ", kMoeRouterNormInMaxTokens,
             " tokens of hidden ", kMoeRouterMaxHidden, " with row strides multiples of 8; got ", s.T,
             " tokens, hidden ", s.H);
  if (s.T == 0) return;
  const RouterParams p{.x = x,
                       .xs = xs,
                       .router = router,
                       .logits = b.logits,
                       .H = int(s.H),
                       .route = route_params(b.logits, s.E, s, norm_topk_prob, b),
                       .norm = norm ? *norm : MoeNormIn{}};
  launch({.grid = dim3(unsigned((s.E + kRouterWarps - 1) / kRouterWarps),
                       unsigned((s.T + kRouterTokens - 1) / kRouterTokens)),
          .block = dim3(kRouterWarps * 32),
          .smem = size_t((std::min<int64_t>(s.T, kRouterTokens) + (norm ? 1 : 0)) * s.H) * 2,
          .stream = stream,
          .pdl = pdl_for(PdlSite::gemv)},
         norm ? router_route_kernel<true> : router_route_kernel<false>, p);
}

}  // namespace kiln::cuda
