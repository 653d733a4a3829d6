// Row top k with log-probabilities (ops/argmax.h topk_rows). The ranking is comparisons only, so the tokens
// are the CPU oracle's bit for bit; the log-probabilities' sum runs in the order the contract states for
// CUDA.
#include <cstdint>

#include "ops/cuda/argmax.h"
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;  // ops/argmax.h states the sum's order with this count
constexpr int kWarps = kThreads / 32;
constexpr int kMaxK = 16;
constexpr int kUnroll = 4;            // loads in flight a thread in the ranking sweep
constexpr int32_t kNone = INT32_MAX;  // an empty slot's column (V < 2^31: never a real one)
constexpr unsigned kFull = 0xffffffffu;

struct TopkParams {
  const float* logits;  // [R, V], row stride ld
  int64_t ld, V;
  int32_t k;               // 1 <= k <= K (the kernel's list length), k <= V
  const int64_t* offsets;  // [V] or null
  int32_t* tokens;         // [R, k]
  float* logprobs;         // [R, k]
};

// A column and its ranking key: the logit, NaN read as -inf.
struct Ranked {
  float key;
  int32_t col;
};

__device__ __forceinline__ Ranked ranked(float v, int64_t col) {
  return {v == v ? v : -__int_as_float(0x7f800000), int32_t(col)};
}

// The ranking of ops/argmax.h: a total order, since columns are distinct.
__device__ __forceinline__ bool above(Ranked a, Ranked b) {
  return a.key > b.key || (a.key == b.key && a.col < b.col);
}

// An empty slot ranks below every column (-inf ones included: their columns are lower).
__device__ __forceinline__ Ranked none() {
  return {-__int_as_float(0x7f800000), kNone};
}

// l: K entries in descending rank. Puts e in its place, dropping the last; static indices only, so l stays
// in registers. Each l[j] is written from l[j - 1] and l[j] before either changes.
template <int K>
__device__ __forceinline__ void insert(Ranked (&l)[K], Ranked e) {
  if (!above(e, l[K - 1])) return;
#pragma unroll
  for (int j = K - 1; j > 0; --j) l[j] = above(e, l[j - 1]) ? l[j - 1] : (above(e, l[j]) ? e : l[j]);
  if (above(e, l[0])) l[0] = e;
}

// Called by a whole warp, each lane with its list in descending rank: returns (to every lane) the best head
// of the warp's lists and pops it from its lane. The xor butterfly of a total order's maximum gives every
// lane the same entry. Several lanes may pop an empty slot at once: empty slots are all alike.
template <int K>
__device__ __forceinline__ Ranked pop_warp_best(Ranked (&l)[K]) {
  Ranked b = l[0];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Ranked c{__shfl_xor_sync(kFull, b.key, o), __shfl_xor_sync(kFull, b.col, o)};
    if (above(c, b)) b = c;
  }
  if (l[0].col == b.col) {
#pragma unroll
    for (int j = 0; j + 1 < K; ++j) l[j] = l[j + 1];
    l[K - 1] = none();
  }
  return b;
}

// Grid (R), block 512 threads: a block owns one row. Thread t sweeps columns t, t + 512, ... (kUnroll loads
// ahead) keeping its K best in registers (K = k rounded up to 2, 4, 8 or 16). Each warp pops its K best from
// its lanes' lists by K rounds of a butterfly maximum and writes them to shared memory in rank order; warp 0
// does the same over the 16 warps' lists, giving the row's K best. Then every thread sweeps its columns again
// for its f32 sum of expf(x - m) (m = the top column's raw logit), block_sum adds the partials in the
// contract's order, and threads i < k write entry i's token (column + offset) and log-probability. The row
// is read twice: the second sweep mostly from L2.
template <int K>
__global__ void __launch_bounds__(kThreads) topk_kernel(const __grid_constant__ TopkParams p) {
  static_assert(K >= 2 && K <= kMaxK, "list lengths 2 .. 16");
  static_assert(kWarps <= 32, "warp 0 merges one warp's list a lane");
  __shared__ Ranked warp_top[kWarps][K];
  __shared__ Ranked top[K];
  __shared__ float sm[kWarps];
  pdl_wait();
  const float* x = p.logits + int64_t(blockIdx.x) * p.ld;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Ranked l[K];
#pragma unroll
  for (int j = 0; j < K; ++j) l[j] = none();
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < p.V; i += kUnroll * kThreads) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = x[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) insert(l, ranked(v[u], i + u * kThreads));
  }
  for (; i < p.V; i += kThreads) insert(l, ranked(x[i], i));
#pragma unroll
  for (int r = 0; r < K; ++r) {
    const Ranked b = pop_warp_best(l);
    if (lane == 0) warp_top[warp][r] = b;
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int r = 0; r < K; ++r) l[r] = lane < kWarps ? warp_top[lane][r] : none();
#pragma unroll
    for (int r = 0; r < K; ++r) {
      const Ranked b = pop_warp_best(l);
      if (lane == 0) top[r] = b;
    }
  }
  __syncthreads();
  const float m = x[top[0].col];  // V >= 1: the top entry is a real column
  float se = 0.0f;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < p.V; j += kThreads) se += expf(x[j] - m);
  const float log_s = logf(block_sum<kThreads>(se, sm));
  if (int(threadIdx.x) < p.k) {
    const int32_t c = top[threadIdx.x].col;
    const int64_t at = int64_t(blockIdx.x) * p.k + threadIdx.x;
    p.tokens[at] = int32_t(c + (p.offsets ? p.offsets[c] : 0));
    p.logprobs[at] = (x[c] - m) - log_s;
  }
  pdl_launch_dependents();
}

}  // namespace

void topk_rows(const float* logits, int64_t ld, int64_t R, int64_t V, const int64_t* offsets, int k,
               int32_t* tokens, float* logprobs, cudaStream_t stream, bool pdl) {
  KILN_CHECK(R >= 0 && V >= 1 && V < int64_t(kNone) && ld >= V, "topk_rows: bad shape R ", R, " V ", V,
             " ld ", ld);
  KILN_CHECK(R <= 0x7fffffff, "topk_rows: at most 2^31 - 1 rows, got ", R);
  KILN_CHECK(k >= 1 && k <= kMaxK && k <= V, "topk_rows: k must be in [1, min(", kMaxK, ", V = ", V,
             ")], got ", k);
  KILN_CHECK(logits && tokens && logprobs, "topk_rows: null pointer");
  if (R == 0) return;
  const TopkParams p{
      .logits = logits, .ld = ld, .V = V, .k = k, .offsets = offsets, .tokens = tokens, .logprobs = logprobs};
  const LaunchCfg cfg{.grid = dim3(unsigned(R)), .block = dim3(kThreads), .stream = stream, .pdl = pdl};
  // The list length: k rounded up to a power of two (a few instantiations; extra entries are never written).
  if (k <= 2) return launch(cfg, topk_kernel<2>, p);
  if (k <= 4) return launch(cfg, topk_kernel<4>, p);
  if (k <= 8) return launch(cfg, topk_kernel<8>, p);
  launch(cfg, topk_kernel<16>, p);
}

}  // namespace kiln::cuda
