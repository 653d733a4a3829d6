// The sparse MLP's routing from given logits and the token permutation on the GPU (moe.h steps 1-3):
// moe_route's contract (ops/moe.h) bit for bit (moe_route.cuh), then the pairs sorted by expert with
// integer counts only, so the layout is the same on every run.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_route.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

// Grid: one block per chunk of 32 tokens; block: 8 warps (moe_route.cuh route_chunk).
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(const __grid_constant__ RouteParams p) {
  pdl_wait();  // launched with PDL where enabled: nothing global is touched before the predecessor is done
  __shared__ RouteSmem sm;
  route_chunk(p, int(blockIdx.x), sm);
}

struct OffsetsParams {
  int32_t* chunk_counts;  // i32 [chunks, E]: in counts, out each chunk's first row within its expert
  Layout layout;
  int chunks, E;
  int e0, e1;  // the rank's experts (MoeShape::expert_begin, expert_end): the others count 0
};

// Grid: 1 block; block: 1024 threads, thread e < E sums expert e's counts over the chunks (rewriting each
// chunk's count to its exclusive prefix); then the layout (write_layout by warp 0, write_layout_rows by the
// block; experts outside [e0, e1) count 0).
__global__ void __launch_bounds__(kMoeMaxExperts) offsets_kernel(const __grid_constant__ OffsetsParams p) {
  pdl_wait();
  __shared__ int cnt_s[kMoeMaxExperts], off_s[kMoeMaxExperts], act_s[kMoeMaxExperts + 1];
  for (int e = int(threadIdx.x); e < p.E; e += int(blockDim.x)) {
    int count = 0;
    for (int c = 0; c < p.chunks; ++c) {
      int32_t& cc = p.chunk_counts[int64_t(c) * p.E + e];
      const int n = cc;
      cc = count;
      count += n;
    }
    cnt_s[e] = e >= p.e0 && e < p.e1 ? count : 0;
  }
  __syncthreads();
  if (threadIdx.x < 32) write_layout(cnt_s, p.E, p.layout, off_s, act_s);
  __syncthreads();
  write_layout_rows(cnt_s, off_s, act_s, p.layout, p.E);
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
  int e0, e1;  // the rank's experts: another's pair gets no row, inverse -1
};

// Grid-stride, one thread a pair: its row = expert offset + chunk's first row + rank in the chunk (a pair of
// another rank's expert: inverse -1, no row).
__global__ void scatter_kernel(const __grid_constant__ ScatterParams p) {
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.pairs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int e = p.experts[i];
    if (e < p.e0 || e >= p.e1) {
      p.inverse[i] = -1;
      continue;
    }
    const int64_t chunk = i / p.k / kMoeChunkTokens;
    const int row = p.offsets[e] + p.chunk_counts[chunk * p.E + e] + p.rank[i];
    p.sorted_pair[row] = int32_t(i);
    p.inverse[i] = row;
  }
}

}  // namespace

void moe_route_launch(const uint16_t* logits, int64_t ls, const MoeShape& s, bool norm_topk_prob,
                      const MoeBuffers& b, cudaStream_t stream) {
  KILN_CHECK(s.E >= 1 && s.E <= kMoeRouteMaxExperts, "moe_route: ", s.E,
             " experts; the CUDA kernel takes 1 to ", kMoeRouteMaxExperts);
  KILN_CHECK(s.k >= 1 && s.k <= s.E, "moe_route: top_k ", s.k, " outside [1, ", s.E, "]");
  if (s.T == 0) return;
  const RouteParams p = route_params(logits, ls, s, norm_topk_prob, b);
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
  const OffsetsParams op{.chunk_counts = b.chunk_counts,
                         .layout = layout_of(b),
                         .chunks = int(s.chunks()),
                         .E = int(s.E),
                         .e0 = int(s.expert_begin),
                         .e1 = int(s.expert_end())};
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
                         .E = int(s.E),
                         .e0 = int(s.expert_begin),
                         .e1 = int(s.expert_end())};
  const int64_t blocks = std::min<int64_t>((sp.pairs + 255) / 256, 1024);
  launch({.grid = dim3(unsigned(blocks)),
          .block = dim3(256),
          .stream = stream,
          .pdl = pdl_for(PdlSite::elementwise)},
         scatter_kernel, sp);
}

}  // namespace kiln::cuda
