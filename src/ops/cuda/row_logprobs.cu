// Chosen ids' log-probabilities and ranks per row of logits; contract in row_logprobs.h.
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/row_logprobs.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr float kNegInf = -__builtin_huge_valf();

struct RowLogprobArgs {
  const float* logits;  // [R, V], row stride ld
  int64_t ld, V;
  const int32_t* ids;  // [R, n]
  int n;
  float* logprobs;  // [R, n]
  int32_t* ranks;   // [R, n]
};

// Grid (R), block 1024: a block owns one row and sweeps it with a thread stride, once for the max, once for
// the sum of exponentials, once per id for its rank (the row stays in L2 after the first sweep). Thread 0
// writes the n outputs.
__global__ void __launch_bounds__(kThreads) row_logprobs_kernel(const __grid_constant__ RowLogprobArgs a) {
  __shared__ float sm[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* x = a.logits + r * a.ld;
  float m = kNegInf;
  for (int64_t i = threadIdx.x; i < a.V; i += kThreads) m = fmaxf(m, x[i]);
  m = block_max<kThreads>(m, sm);
  float se = 0.0f;
  for (int64_t i = threadIdx.x; i < a.V; i += kThreads) se += expf(x[i] - m);
  const float lse = m + logf(block_sum<kThreads>(se, sm));
  for (int j = 0; j < a.n; ++j) {
    const float xi = x[a.ids[r * a.n + j]];
    float above = 0.0f;  // exact: counts stay far below 2^24
    for (int64_t i = threadIdx.x; i < a.V; i += kThreads) above += x[i] > xi ? 1.0f : 0.0f;
    above = block_sum<kThreads>(above, sm);
    if (threadIdx.x == 0) {
      a.logprobs[r * a.n + j] = xi - lse;
      a.ranks[r * a.n + j] = 1 + int32_t(above);
    }
  }
}

}  // namespace

void row_logprobs(const float* logits, int64_t ld, int64_t R, int64_t V, const int32_t* ids, int n,
                  float* logprobs, int32_t* ranks, cudaStream_t stream) {
  KILN_CHECK(R >= 0 && V > 0 && V < (int64_t(1) << 31) && ld >= V, "row_logprobs: bad logits shape R ", R,
             " V ", V, " ld ", ld);
  KILN_CHECK(n >= 1 && n <= kMaxRowLogprobIds, "row_logprobs: n must be in [1, ", kMaxRowLogprobIds,
             "], got ", n);
  KILN_CHECK(logits && ids && logprobs && ranks, "row_logprobs: null pointer");
  if (R == 0) return;
  const RowLogprobArgs a{
      .logits = logits, .ld = ld, .V = V, .ids = ids, .n = n, .logprobs = logprobs, .ranks = ranks};
  launch({.grid = dim3(unsigned(R)), .block = dim3(kThreads), .stream = stream}, row_logprobs_kernel, a);
}

}  // namespace kiln::cuda
