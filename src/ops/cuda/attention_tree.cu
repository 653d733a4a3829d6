// Token-tree rows of paged attention (ops/attention.h tree_window / tree_mask; the routing and the summation
// order are in ops/cuda/attention.h): the portable decode kernel v1's per-key arithmetic
// (attention_decode_row.cuh) over each tree row's visible keys, split over the context, and the split
// combine. paged_attention launches it after the causal kernels, which have written every row causally; it
// rewrites the rows of the sequences whose window is > 0 and leaves every other row alone.
#include <algorithm>

#include "ops/cuda/attention_decode_row.cuh"

namespace kiln::cuda {
namespace {

using namespace portable_decode;  // NOLINT: the decode kernels' per-key helpers

constexpr int kTreeMaxSplits = 32;
constexpr int kTreeChunkTile = 32;  // a split's keys are a multiple of this (decode_chunk)
constexpr int kUnroll = 2;          // keys a lane slot loads before it updates its softmax (loads in flight)

// One tree row: its sequence, its causal extent ctx = position + 1, the first window position and its mask.
struct TreeRow {
  int b = 0, ctx = 0, window_start = 0;
  uint64_t mask = 0;
  // Whether context position j < ctx is attended to.
  __device__ __forceinline__ bool visible(int j) const {
    return j < window_start || ((mask >> (j - window_start)) & 1);
  }
};

// The tree row of query row t, false where t is no tree row (past cu_q's end, a sequence with window 0, or
// metadata the contract forbids: such sequences are never read). The window is clamped into [0, min(64,
// kv_len)] and only positions up to the row's own are walked, so mask bits the rules forbid are never
// followed.
__device__ __forceinline__ bool tree_row(const PagedAttnParams& p, int t, TreeRow* r) {
  int lo = 0, hi = p.B;  // the sequence b with cu_q[b] <= t < cu_q[b + 1]: the first b with cu_q[b + 1] > t
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (p.cu_q[mid + 1] <= t) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int b = lo;
  if (b >= p.B || t < p.cu_q[b]) return false;
  const int row0 = p.cu_q[b], q_len = p.cu_q[b + 1] - row0, kv_len = p.kv_lens[b];
  if (q_len < 1 || kv_len < q_len || kv_len > int64_t(p.pages_stride) * p.page_size) return false;
  const int W = min(min(p.tree_window[b], 64), kv_len);
  if (W <= 0) return false;  // a causal sequence: the causal kernels' rows stand
  r->b = b;
  r->ctx = kv_len - q_len + (t - row0) + 1;
  r->window_start = kv_len - W;
  r->mask = p.tree_mask[t];
  return true;
}

// Grid (T, Hkv, splits); block kWarps warps. Block (t, hk, s): query row t (exits unless a tree row) and the
// G = Hq / Hkv query heads of KV head hk, over split s's chunk [s c, s c + c) of the row's keys [0, ctx), c =
// decode_chunk(ctx, splits, 32). Lane mapping as decode v1 (attention_decode_row.cuh): LPT = D / 8 lanes a
// key, 8 elements of head_dim each; warp w's slot takes keys w * TPW + slot + k * kWarps * TPW, kUnroll of
// them loaded before their updates; a key the mask hides is neither loaded nor counted. splits == 1: the
// block writes the bf16 row of out; else every split (an empty one too: m = -inf, l = 0) writes its (o / l,
// m, l) to workspace entry t (of T), for tree_combine_kernel.
template <int D, int G, KvDtype KT>
__global__ void __launch_bounds__(kWarps * 32)
    tree_kernel(const __grid_constant__ PagedAttnParams p, float* ws, int splits) {
  constexpr int LPT = D / 8, TPW = 32 / LPT, kStride = kWarps * TPW;
  __shared__ float scratch[finish_scratch_floats<D, G>()];
  pdl_wait();
  const int t = int(blockIdx.x), hk = int(blockIdx.y), split = int(blockIdx.z);
  TreeRow r;
  if (tree_row(p, t, &r)) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slot = lane / LPT, sub = lane % LPT;
    const int chunk = decode_chunk(r.ctx, splits, kTreeChunkTile);
    const int t_begin = split * chunk, t_end = min(r.ctx, t_begin + chunk);
    float q[G][8];
    load_q<D, G>(p, t, hk, sub, q);
    SoftmaxState<G> st;
    init_state(st);
    // The trip count depends on the warp only, so every lane takes part in update_key's shuffles.
    for (int t0 = t_begin + warp * TPW; t0 < t_end; t0 += kUnroll * kStride) {
      float k[kUnroll][8], v[kUnroll][8];
      bool valid[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = t0 + u * kStride + slot;
        valid[u] = j < t_end && r.visible(j);
        if (valid[u]) {
          int64_t sc_off;
          const int64_t off = kv_row_offset(p, r.b, j, hk, &sc_off);
          load_kv8<KT>(p.k, p.k_scale, off, sc_off, sub * 8, k[u]);
          load_kv8<KT>(p.v, p.v_scale, off, sc_off, sub * 8, v[u]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) k[u][e] = v[u][e] = 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) update_key<D, G>(st, q, k[u], v[u], valid[u], p.scale);
    }
    finish_row<D, G>(p, st, scratch, ws, p.T, splits == 1, split, splits, t, t, hk);
  }
  pdl_launch_dependents();
}

// Grid (T, Hq); block D threads. Block (t, h): thread d merges element d of tree row t, head h over the
// splits in ascending order (weights l_s exp(m_s - M), empty splits skipped) and writes it as bf16.
template <int D>
__global__ void __launch_bounds__(D)
    tree_combine_kernel(const __grid_constant__ PagedAttnParams p, const float* ws, int splits) {
  pdl_wait();
  TreeRow r;
  if (tree_row(p, int(blockIdx.x), &r)) {
    const int h = int(blockIdx.y), d = int(threadIdx.x);
    const int64_t base = (int64_t(blockIdx.x) * p.Hq + h) * splits;
    const float* ml = ws + int64_t(p.T) * p.Hq * splits * D;  // (m, l) of each partial
    float M = kNegInf;
    for (int s = 0; s < splits; ++s) M = fmaxf(M, ml[2 * (base + s)]);
    float L = 0.0f, O = 0.0f;
    for (int s = 0; s < splits && M != kNegInf; ++s) {
      const float ms = ml[2 * (base + s)];
      if (ms == kNegInf) continue;
      const float w = ml[2 * (base + s) + 1] * expf(ms - M);
      L += w;
      O = fmaf(w, ws[(base + s) * D + d], O);
    }
    static_cast<uint16_t*>(p.out)[int64_t(blockIdx.x) * p.o_stride_t + int64_t(h) * p.o_stride_h + d] =
        uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
  }
  pdl_launch_dependents();
}

template <int D, KvDtype KT>
void launch_tree_typed(const PagedAttnParams& p, float* ws, int splits, cudaStream_t stream, bool pdl) {
  if constexpr (KT == KvDtype::f8e4m3 && D % 64 != 0) {
    KILN_FAIL("paged tree attention: an fp8 cache needs head_dim % 64 == 0");  // refused by the dispatch
  } else {
    const LaunchCfg cfg{.grid = dim3(unsigned(p.T), unsigned(p.Hkv), unsigned(splits)),
                        .block = dim3(kWarps * 32),
                        .stream = stream,
                        .pdl = pdl};
    KILN_DISPATCH_GROUP(p.Hq / p.Hkv, "paged tree attention",
                        launch(cfg, tree_kernel<D, kG, KT>, p, ws, splits);)
    if (splits > 1) {
      const LaunchCfg comb{
          .grid = dim3(unsigned(p.T), unsigned(p.Hq)), .block = dim3(D), .stream = stream, .pdl = pdl};
      launch(comb, tree_combine_kernel<D>, p, static_cast<const float*>(ws), splits);
    }
  }
}

}  // namespace

int tree_splits(const PagedAttnParams& p) {
  if (p.tree_window == nullptr) return 0;
  // Shapes only, as the decode splits: about 16 blocks an SM (every query row's block is counted, though only
  // the tree rows' do work), splits of >= kDecodeV2MinChunk keys of the table's reach.
  const int64_t blocks = std::max<int64_t>(int64_t(p.T) * p.Hkv, 1);
  const int64_t want = (16 * int64_t(sm_count()) + blocks - 1) / blocks;
  const int64_t reach = int64_t(p.pages_stride) * p.page_size;
  return int(std::clamp<int64_t>(
      want, 1, std::min<int64_t>(kTreeMaxSplits, (reach + kDecodeV2MinChunk - 1) / kDecodeV2MinChunk)));
}

size_t tree_workspace_bytes(const PagedAttnParams& p) {
  const int splits = tree_splits(p);
  return splits <= 1 ? 0 : size_t(p.T) * p.Hq * splits * (p.D + 2) * sizeof(float);
}

void launch_tree(const PagedAttnParams& p, float* ws, cudaStream_t stream, bool pdl) {
  const int splits = tree_splits(p);
  KILN_CHECK(splits >= 1 && (splits == 1 || ws != nullptr), "paged tree attention: ", splits,
             " splits need a workspace");
  KILN_DISPATCH_HEAD_DIM(
      p.D, KILN_DISPATCH_KV_DTYPE(p.kv_dtype, launch_tree_typed<kD, kKT>(p, ws, splits, stream, pdl);))
}

}  // namespace kiln::cuda
