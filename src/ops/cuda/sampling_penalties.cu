// Logit processing before sampling; contract in sampling_penalties.h.
#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling_penalties.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;

struct PenaltyArgs {
  float* logits;  // [R, V], row stride ld
  int64_t ld, V;
  const PenaltyRow* rows;  // [R]
  const int32_t* add_ids;  // [sum of the rows' ranges]
  const float* add_vals;   // same
  const uint32_t* counts;  // [count rows, V]
};

// Grid (R); block 512. Phase 1: the row's sparse additions, one thread per entry. Phase 2: a sweep of
// the row's count entries; only ids seen in the prompt or the output change.
__global__ void __launch_bounds__(kThreads) penalty_kernel(const __grid_constant__ PenaltyArgs a) {
  const int64_t r = blockIdx.x;
  const PenaltyRow p = a.rows[r];
  float* x = a.logits + r * a.ld;
  for (int32_t j = p.adds_begin + int32_t(threadIdx.x); j < p.adds_end; j += kThreads) {
    const int32_t id = a.add_ids[j];
    if (id >= 0 && id < a.V) x[id] = __fadd_rn(x[id], a.add_vals[j]);
  }
  if (p.count_row < 0) return;
  __syncthreads();  // the additions come first: visible to the whole block after this
  const uint32_t* c = a.counts + int64_t(p.count_row) * a.V;
  for (int64_t i = threadIdx.x; i < a.V; i += kThreads) {
    const uint32_t e = c[i];
    if (e == 0) continue;
    const uint32_t count = e & ~kPromptBit;
    float v = x[i];
    v = v > 0.0f ? __fdiv_rn(v, p.repetition) : __fmul_rn(v, p.repetition);
    v = __fsub_rn(v, __fmul_rn(p.frequency, float(count)));
    if (count > 0) v = __fsub_rn(v, p.presence);
    x[i] = v;
  }
}

// One thread per (row, id) pair.
__global__ void count_kernel(uint32_t* counts, int64_t V, const int32_t* rows, const int32_t* ids, int64_t n,
                             bool prompt) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t row = rows[i], id = ids[i];
  if (row < 0 || id < 0 || id >= V) return;
  uint32_t* e = counts + int64_t(row) * V + id;
  if (prompt)
    atomicOr(e, kPromptBit);
  else
    atomicAdd(e, 1u);
}

}  // namespace

void apply_penalties(float* logits, int64_t ld, int64_t R, int64_t V, const PenaltyRow* rows,
                     const int32_t* add_ids, const float* add_vals, const uint32_t* counts,
                     cudaStream_t stream) {
  KILN_CHECK(R >= 0 && V > 0 && V < (int64_t(1) << 31) && ld >= V, "apply_penalties: bad logits shape R ", R,
             " V ", V, " ld ", ld);
  KILN_CHECK(logits && rows, "apply_penalties: null pointer");
  if (R == 0) return;
  const PenaltyArgs a{.logits = logits,
                      .ld = ld,
                      .V = V,
                      .rows = rows,
                      .add_ids = add_ids,
                      .add_vals = add_vals,
                      .counts = counts};
  launch({.grid = dim3(unsigned(R)), .block = dim3(kThreads), .stream = stream}, penalty_kernel, a);
}

void count_tokens(uint32_t* counts, int64_t V, const int32_t* count_rows, const int32_t* ids, int64_t n,
                  bool prompt, cudaStream_t stream) {
  KILN_CHECK(n >= 0 && V > 0, "count_tokens: bad sizes n ", n, " V ", V);
  if (n == 0) return;
  KILN_CHECK(counts && count_rows && ids, "count_tokens: null pointer");
  const unsigned blocks = unsigned((n + 255) / 256);
  launch({.grid = dim3(blocks), .block = dim3(256), .stream = stream}, count_kernel, counts, V, count_rows,
         ids, n, prompt);
}

}  // namespace kiln::cuda
