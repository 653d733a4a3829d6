// Startup autotuning for CUDA models: the GEMM tactics (issue: "automatically at start when no cache exists")
// and the MoE expert kernels' thresholds (issue 44: "the startup tuner picks between them per shape").
#pragma once

#include <string>

#include "kiln/config.h"
#include "ops/moe_tune_table.h"

namespace kiln {

// When the process's cuBLASLt engine (ops/cuda/context.h, loaded from the tactic cache at
// ops/cuda/gemm.h's default path) has no tactic for this model's M = 1 QKV shape, tunes every GEMM shape of
// the model for M buckets up to 512 (LM head: M 1; none for an embedding model) and saves the cache, saying
// so on stderr. Later starts find the cache and skip this. Then, for a model with MoE layers, sets the
// MoE expert-kernel thresholds (cuda_moe_autotune below) from the cache beside it, tuning them where it has
// none. KILN_AUTOTUNE=0 turns both off. cfg: the rank's config (model/tensor_parallel.h shard_config);
// moe_local_experts: the experts the rank holds under expert parallelism (0: all). A no-op in a CPU-only
// build.
void cuda_autotune_if_needed(const ModelConfig& cfg, int64_t moe_local_experts = 0);

// The rank's MoE expert shape of cfg (it must have MoE layers) on the current device: block-FP8 experts
// where the checkpoint's (or --quantization fp8's) experts stay FP8 on it (model/fp8_weights.h).
ops::MoeTuneShape cuda_moe_tune_shape(const ModelConfig& cfg, int64_t moe_local_experts = 0);

// Where the thresholds of cuda_moe_autotune came from.
enum class MoeTuneSource {
  off,        // KILN_MOE_TUNE=0, or a CPU-only build: nothing read, timed or set
  env,        // the variable the shape's threshold comes from is set: it wins; nothing timed or set
  untunable,  // the kernels compared do not both run here (ops/cuda/moe_tune.h), memory was short, or it
              // failed
  cache,      // read from the cache file
  tuned,      // timed now (and saved where the cache is writable)
};

struct MoeAutotuneResult {
  MoeTuneSource source = MoeTuneSource::off;
  ops::MoeTuneKey key;
  ops::MoeTuneEntry entry;  // grouped_from 0 where none was chosen; times only where tuned
  double seconds = 0;       // the timing's wall time (tuned only)
};

// The MoE expert-kernel thresholds for shape s on the current device, applied to this process:
//   block-FP8 experts: ops::cuda::moe_set_fp8_w8a8_min_tokens(grouped_from), unless
//     KILN_MOE_FP8_W8A8_MIN_TOKENS is set;
//   bf16 experts: ops::cuda::moe_set_gemv_max_tokens(grouped_from - 1), unless KILN_MOE_GEMV_MAX_TOKENS is
//   set.
// grouped_from comes from the cache file at cache_path (ops/moe_tune_table.h) where it holds this key
// (the GPU's name and SM count, the shape, the ladder's end), else from ops::cuda::tune_moe_thresholds, then
// saved there (a read-only location: a warning, and the value still applies). A stderr line says what was
// timed and how long it took. Once chosen it stays for the cache's life: the two kernels round differently,
// so the choice changes output bits, and a cached one keeps them stable across restarts. KILN_MOE_TUNE=0:
// nothing (the defaults, or the variables, stay). Calls are serialised (tensor-parallel ranks start
// together: the first tunes, the others read its cache).
struct MoeAutotuneOptions {
  bool retune = false;   // time the kernels even where the cache has the key (kiln tune), and replace it
  bool verbose = false;  // print the times on stdout
};
MoeAutotuneResult cuda_moe_autotune(const ops::MoeTuneShape& s, const std::string& cache_path,
                                    MoeAutotuneOptions opts = {});

}  // namespace kiln
