// Startup GEMM autotuning (see cuda_tune.h).
#include "model/cuda_tune.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "model/fp8_weights.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#endif

namespace kiln {

void cuda_autotune_if_needed(const ModelConfig& cfg) {
#ifdef KILN_HAVE_CUDA
  if (const char* e = std::getenv("KILN_AUTOTUNE"); e && std::strcmp(e, "0") == 0) return;
  cuda::GemmEngine& eng = cuda::gemm_engine();
  // Block-FP8 weights kept FP8 on this GPU (model/fp8_weights.h) run the FP8 GEMV's shapes too.
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const bool fp8 = cfg.quant.fp8() && fp8_weights_stay_fp8(Device::cuda(dev));
  const cuda::GemmShape probe{1, cfg.q_size() + 2 * cfg.kv_size(), cfg.hidden_size, cuda::GemmOut::bf16,
                              fp8 ? cuda::GemmWeight::fp8 : cuda::GemmWeight::bf16};
  if (eng.tactics().count(probe)) return;
  const std::string path = cuda::default_tactic_cache_path();
  std::fprintf(stderr, "kiln: tuning cuBLASLt GEMM tactics for this GPU and model shape (once; cache %s)\n",
               path.c_str());
  // An embedding model runs no LM head (model/weights.h): its vocabulary GEMM is not tuned. Otherwise up to
  // the GEMV's M: a speculative verify step's logits rows (k + 1 a sequence) ran cuBLASLt's untuned
  // heuristic where only M = 1 was tuned. KILN_TUNE_LOGIT_ROWS=8 turns that on (not yet measured on a GPU);
  // unset or 1: M = 1 only (as at `2f94697`).
  int64_t max_logit_rows = 1;
  if (const char* e = std::getenv("KILN_TUNE_LOGIT_ROWS"); e && *e) {
    KILN_CHECK(std::strcmp(e, "1") == 0 || std::strcmp(e, "8") == 0,
               "KILN_TUNE_LOGIT_ROWS must be 1 or 8, got '", e, "'");
    max_logit_rows = std::atoi(e);
  }
  const int64_t logit_rows = cfg.arch == ModelArch::qwen3_embedding ? 0 : max_logit_rows;
  std::vector<cuda::GemmShape> shapes =
      cuda::qwen3_gemm_shapes(cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size,
                              cfg.vocab_size, 512, logit_rows, fp8);
  if (cfg.has_moe_layers()) {  // the router GEMMs; the dense MLP's only where some layer keeps it
    bool dense = false;
    for (int64_t l = 0; l < cfg.num_layers; ++l) dense = dense || !cfg.is_moe_layer(l);
    const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
    std::vector<cuda::GemmShape> kept;
    for (const cuda::GemmShape& g : shapes) {
      const bool mlp = (g.n == 2 * I && g.k == H) || (g.n == H && g.k == I);
      if (dense || !mlp) kept.push_back(g);
      if (g.n == cfg.q_size() + 2 * cfg.kv_size() && g.k == H &&
          g.weight == cuda::GemmWeight::bf16)  // once per M bucket
        kept.push_back({g.m_bucket, cfg.moe.num_experts, H, cuda::GemmOut::bf16});
    }
    shapes = kept;
  }
  eng.tune(shapes);
  try {
    eng.save(path);
  } catch (const std::exception& ex) {  // a read-only home still runs, just re-tunes next start
    std::fprintf(stderr, "kiln: could not save the tactic cache: %s\n", ex.what());
  }
#else
  (void)cfg;
#endif
}

}  // namespace kiln
