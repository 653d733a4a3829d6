// Kernel choices made from a whole decode step timed both ways, where the tuner's per-op timing (ops/cuda/
// gemm.h) cannot see how a kernel sits between its neighbours.
#pragma once

#include "model/kv_cache.h"
#include "model/qwen3.h"

namespace kiln {

struct StepChoice {
  bool timed = false;     // false: nothing to decide (no tuned prologue at batch 1, a switch set, no CUDA)
  bool norm_in = true;    // the residual-norm prologue kept at batch 1
  double with_ms = 0;     // the median batch-1 step with the prologue (CUDA graph, padding rows)
  double without_ms = 0;  // ... and without it
};

// The residual add + RMSNorm prologue of the batch-1 GEMVs (ops/cuda/gemm.h gemv_norm_in_choice): where the
// tuner kept it for some shape at M = 1 (and KILN_GEMV_NORM_IN is unset), times the model's batch-1 decode
// step from a CUDA graph with it and without it (alternating rounds, the median of each; one padding
// sequence, no K/V written) and leaves it out at M = 1 (GemmEngine::set_gemv_norm_in_off_at) where the
// step without it is more than 0.5 % faster. The two forms are bitwise equal (docs/NUMERICS.md), so the
// choice changes no output. Call before capturing the graphs that should follow it (they read the choice at
// capture), after the workspace is reserved; not under tensor parallelism (a rank's step alone would wait on
// its collectives). Says what it chose on stderr.
StepChoice cuda_choose_norm_in_by_step(Qwen3Model& model, KvCache& cache, bool pdl);

}  // namespace kiln
