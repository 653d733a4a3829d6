// The router GEMV and the routing in one launch for decode-sized batches (moe.h step 1 with its logits):
// blocks compute the router logits in ops/moe.h's canonical order, and one block routes them
// (moe_route.cuh), so the logits never wait for a second launch. Two forms:
//   cluster (T <= 8, E <= 128, an sm_90 device): the blocks of one thread-block cluster store their logits
//     into rank 0's shared memory, one cluster barrier, rank 0 routes from shared memory; no fence, no
//     global counter, no logits re-read through L2 on the routing's critical path;
//   counter (otherwise, up to 64 tokens): the block that counts itself last on its chunk's global counter
//     (gemv.h's last-block pattern) routes the chunk from the logits in L2.
#include <cooperative_groups.h>

#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_gemv.cuh"
#include "ops/cuda/moe_route.cuh"
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

constexpr int kRouterWarps = kRouteWarps;  // experts a block of the counter form, one a warp
constexpr int kClusterWarps = 16;          // experts a block of the cluster form (its 8 blocks: 128 experts)
constexpr int kClusterBlocks = 8;          // the portable cluster size: no attribute to raise
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

// The first phase of the cluster barrier, split: each block arrives once it runs (no memory ordering) and
// waits before its first store into another block's shared memory, which must have started by then.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}
// Defined only where its one caller (the cluster form's sm_90 region below) is compiled: an sm_80 pass
// would otherwise find it unreferenced.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
}
#endif

// Counter form. Grid: (ceil(E / 8), ceil(T / 8)); block: 8 warps. Cluster form (kCluster). Grid:
// (ceil(E / 16), 1), one cluster of all its blocks (<= 8); block: 16 warps. Warp w of block (x, y) owns
// expert e = x kWarps + w and tokens [8 y, 8 y + 8): lane l takes the 16-byte chunks l, l + 32, ... of
// router row e (8 held in registers at a time, the first 8 loaded before the PDL wait: the router is never
// written on the stream) and of each token's x row, acc = fmaf(x, w, acc) in ascending chunk and element
// order, then an xor butterfly 16, 8, 4, 2, 1; lane 0 stores bf16(acc) (ops/moe.h's canonical router
// order). x is staged in shared memory first (the block's rows, every 16-byte load in flight at once).
// Counter form: then every thread fences, the block counts itself on its chunk's counter, and the chunk's
// last block routes the chunk (route_chunk: experts, weights and, for a single chunk, the sorted layout).
// Cluster form: lane 0 also stores the logit into cluster rank 0's shared copy [T, E] (after the split
// barrier that says every block has started); one cluster barrier (release / acquire: those stores are
// visible after it); rank 0 routes from that copy.
// kNormIn (T <= 8, one block row): x is not read; the block computes h = bf16(residual + delta) of every row
// into shared memory, then warp g < T normalizes row g with the rms_norm kernel's arithmetic (norm_row.cuh:
// lane chunk squares, butterfly, bf16(bf16(h inv) w); the norm weight staged before the PDL wait); once every
// block has read residual, h goes back to residual and the normed rows to normed: bitwise add_rms_norm then
// the plain kernel. Counter form: the last block writes them; cluster form: after the barrier the blocks
// other than rank 0 (which routes meanwhile) each write a slice of the chunks, rank 0 all of them when
// alone.
template <bool kNormIn, bool kCluster>
__global__ void __launch_bounds__((kCluster ? kClusterWarps : kRouterWarps) * 32)
    router_route_kernel(const __grid_constant__ RouterParams p) {
  constexpr int kWarps = kCluster ? kClusterWarps : kRouterWarps;
  __shared__ RouteSmem sm;
  __shared__ bool last;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // used only by the cluster form's sm_90 region below
  __shared__ uint16_t
      gathered[kCluster ? kRouterTokens * kClusterWarps * kClusterBlocks : 1];  // rank 0: [T, E]
#endif
  extern __shared__ uint4 xs[];  // [min(T, 8), H / 8]: the block's x rows (kNormIn: the normed rows)
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int E = p.route.E, T = p.route.T;
  const int e = int(blockIdx.x) * kWarps + warp, t0 = int(blockIdx.y) * kRouterTokens;
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
  // The new residual and the normed rows of chunks [c0, c1) of every row (every block has read residual).
  const auto write_norm_out = [&](int c0, int c1) {
    const int n = c1 - c0;
    for (int i = int(threadIdx.x); i < T * n; i += int(blockDim.x)) {
      const int t = i / n, c = c0 + i % n;
      reinterpret_cast<uint4*>(p.norm.residual + int64_t(t) * p.norm.rs)[c] = h_chunk(t, c);
      reinterpret_cast<uint4*>(p.norm.normed + int64_t(t) * p.norm.ns)[c] = xs[int64_t(t) * nc + c];
    }
  };
  uint4* const wsm = xs + int64_t(kNormIn ? T : 0) * nc;  // kNormIn: the norm weight [H / 8]
  if constexpr (kNormIn)  // never written on the stream: staged before the PDL wait
    for (int c = int(threadIdx.x); c < nc; c += int(blockDim.x))
      wsm[c] = __ldg(reinterpret_cast<const uint4*>(p.norm.weight) + c);
  load_round(0);
  if constexpr (kCluster)
    cluster_arrive_relaxed();  // this block has started (waited on before the remote stores)
  pdl_wait();                  // x (or delta and residual) is the previous kernels' output
  pdl_launch_dependents();     // every block of this grid is resident once the dependents may launch
  if constexpr (kNormIn) {     // h of every row by the whole block (every load in flight), then warp g's norm
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
  float acc[kRouterTokens] = {};
  if (e < E) {
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
  if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster_wait();  // every block of the cluster has started: rank 0's shared memory may be written
    if (e < E && lane == 0) {
      uint16_t* const copy = cluster.map_shared_rank(gathered, 0);
      for (int g = 0; g < tn; ++g) copy[g * E + e] = uint16_t(f32_to_bf16_bits(acc[g]));
    }
    cluster.sync();  // every logit in rank 0's copy; every block has read residual (kNormIn)
    const int rank = int(cluster.block_rank()), blocks = int(cluster.num_blocks());
    if constexpr (kNormIn) {
      if (blocks > 1 && rank > 0) {  // rank 0 routes meanwhile
        const int per = (nc + blocks - 2) / (blocks - 1);
        write_norm_out(min(nc, (rank - 1) * per), min(nc, rank * per));
      }
    }
    if (rank != 0) return;
    RouteParams rp = p.route;
    rp.logits = gathered;
    rp.ls = E;
    route_chunk<true>(rp, 0, sm);
    if constexpr (kNormIn)
      if (blocks == 1) write_norm_out(0, nc);
#endif
  } else {
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
    if constexpr (kNormIn) write_norm_out(0, nc);
    route_chunk(p.route, chunk, sm);
  }
}

// The cluster form applies on an sm_90 device whose kernels were built for it (clusters need sm_90).
PerDeviceFlag g_cluster_applies;
bool cluster_form_applies() {
  return g_cluster_applies.get([] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9 &&
           kernel_binary_version(reinterpret_cast<const void*>(router_route_kernel<false, true>)) >= 90 &&
           kernel_binary_version(reinterpret_cast<const void*>(router_route_kernel<true, true>)) >= 90;
  });
}

// Dynamic shared memory past 48 KB, the static shared memory counted in, needs each kernel's opt-in: once per
// device, for the most any launch asks, kRouterTokens + 1 rows of kMoeRouterMaxHidden (147 KB), or what the
// device allows beside the kernel's static shared memory where that is less (99 KB opt-in on sm_86 / sm_89: a
// launch past it fails as a CUDA error of its step). Opting in only where the dynamic part alone passed 48 KB
// left the launches between refused with "invalid argument" (hidden 4096 at 5 to 8 tokens: 40-72 KB dynamic
// beside ~10 KB static; test_cuda_moe_fp8 on an H100, 2026-12-07).
PerDeviceFlag g_router_smem_opt_in;
void opt_in_router_smem() {
  g_router_smem_opt_in.get([] {
    constexpr int kMaxSmem = int((kRouterTokens + 1) * kMoeRouterMaxHidden * 2);
    int dev = 0, optin = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (const void* k : {reinterpret_cast<const void*>(router_route_kernel<false, false>),
                          reinterpret_cast<const void*>(router_route_kernel<true, false>),
                          reinterpret_cast<const void*>(router_route_kernel<false, true>),
                          reinterpret_cast<const void*>(router_route_kernel<true, true>)}) {
      cudaFuncAttributes a{};
      KILN_CUDA_CHECK(cudaFuncGetAttributes(&a, k));
      const int allowed = std::min(kMaxSmem, optin - int(a.sharedSizeBytes));
      KILN_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, allowed));
    }
    return true;
  });
}

}  // namespace

void moe_router_route_launch(const uint16_t* x, int64_t xs, const uint16_t* router, const MoeShape& s,
                             bool norm_topk_prob, const MoeBuffers& b, cudaStream_t stream,
                             const MoeNormIn* norm, bool counter_only) {
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
  const size_t smem = size_t((std::min<int64_t>(s.T, kRouterTokens) + (norm ? 1 : 0)) * s.H) * 2;
  opt_in_router_smem();
  const bool cluster = !counter_only && moe_router_cluster_enabled() && s.T <= kRouterTokens &&
                       s.E <= int64_t(kClusterWarps) * kClusterBlocks && cluster_form_applies();
  if (!cluster) {
    launch({.grid = dim3(unsigned((s.E + kRouterWarps - 1) / kRouterWarps),
                         unsigned((s.T + kRouterTokens - 1) / kRouterTokens)),
            .block = dim3(kRouterWarps * 32),
            .smem = smem,
            .stream = stream,
            .pdl = pdl_for(PdlSite::gemv),
            .smem_attr_set = true},  // opt_in_router_smem above
           norm ? router_route_kernel<true, false> : router_route_kernel<false, false>, p);
    return;
  }
  const auto kernel = norm ? router_route_kernel<true, true> : router_route_kernel<false, true>;
  const unsigned blocks = unsigned((s.E + kClusterWarps - 1) / kClusterWarps);
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(blocks);
  lc.blockDim = dim3(kClusterWarps * 32);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = blocks;  // one cluster: the whole grid
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl_for(PdlSite::gemv) ? 2 : 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, p));
}

}  // namespace kiln::cuda
