// Startup GEMM autotuning for CUDA models (issue: "automatically at start when no cache exists").
#pragma once

#include "kiln/config.h"

namespace kiln {

// When the process's cuBLASLt engine (ops/cuda/context.h, loaded from the tactic cache at
// ops/cuda/gemm.h's default path) has no tactic for this model's M = 1 QKV shape, tunes every GEMM shape of
// the model for M buckets up to 512 (LM head: M 1; none for an embedding model) and saves the cache, saying
// so on stderr. Later starts find the cache and skip this. KILN_AUTOTUNE=0 turns it off. A no-op in a
// CPU-only build.
void cuda_autotune_if_needed(const ModelConfig& cfg);

}  // namespace kiln
