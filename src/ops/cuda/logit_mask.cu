// The grammar bitmask on logits; contract in logit_mask.h.
#include "ops/cuda/common.cuh"
#include "ops/cuda/logit_mask.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

struct MaskArgs {
  float* logits;  // [R, V], row stride ld
  int64_t ld, V;
  const int32_t* rows;    // [n]: the logit row of each mask
  const uint32_t* masks;  // [n, words]
  int64_t words;
};

// Grid (ceil(V / 256), n); block 256: one thread per (masked row, id). A warp reads one mask word (its 32
// ids share it: a broadcast load) and writes 32 consecutive logits, only where the bit is clear.
__global__ void __launch_bounds__(kThreads) token_bitmask_kernel(const __grid_constant__ MaskArgs a) {
  const int64_t id = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (id >= a.V) return;
  const int64_t j = blockIdx.y;
  const int64_t w = id >> 5;
  const uint32_t word = w < a.words ? a.masks[j * a.words + w] : 0u;
  if (!((word >> (id & 31)) & 1u)) a.logits[int64_t(a.rows[j]) * a.ld + id] = -__int_as_float(0x7f800000);
}

}  // namespace

void apply_token_bitmask(float* logits, int64_t ld, int64_t V, const int32_t* rows, const uint32_t* masks,
                         int64_t words, int64_t n, cudaStream_t stream) {
  KILN_CHECK(n >= 0 && V > 0 && V < (int64_t(1) << 31) && ld >= V && words >= 0,
             "apply_token_bitmask: bad shape n ", n, " V ", V, " ld ", ld, " words ", words);
  if (n == 0) return;
  KILN_CHECK(n <= 65535, "apply_token_bitmask: at most 65535 masked rows per launch, got ", n);
  KILN_CHECK(logits && rows && masks, "apply_token_bitmask: null pointer");
  const MaskArgs a{.logits = logits, .ld = ld, .V = V, .rows = rows, .masks = masks, .words = words};
  launch({.grid = dim3(unsigned((V + kThreads - 1) / kThreads), unsigned(n)),
          .block = dim3(kThreads),
          .stream = stream},
         token_bitmask_kernel, a);
}

}  // namespace kiln::cuda
