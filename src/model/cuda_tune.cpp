// Startup GEMM and MoE autotuning (see cuda_tune.h).
#include "model/cuda_tune.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "kiln/env.h"
#include "kiln/error.h"
#include "model/fp8_weights.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe_ops.h"
#include "ops/cuda/moe_tune.h"
#endif

namespace kiln {

#ifdef KILN_HAVE_CUDA
namespace {

void tune_gemm_if_needed(const ModelConfig& cfg) {
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
  // heuristic where only M = 1 was tuned. KILN_TUNE_LOGIT_ROWS=8 turns that on: 19-42 µs off a 4-row verify
  // step of the 4B shape, 7-30 off an 8-row one (H100, 2026-12-07, `36e733e`, docs/PERF.md SP11); unset or 1:
  // M = 1 only (as at `2f94697`).
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
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace
#endif

void cuda_autotune_if_needed(const ModelConfig& cfg, int64_t moe_local_experts) {
#ifdef KILN_HAVE_CUDA
  if (const char* e = std::getenv("KILN_AUTOTUNE"); e && std::strcmp(e, "0") == 0) return;
  tune_gemm_if_needed(cfg);  // returns at once where the tactic cache has the model's shapes
  if (cfg.has_moe_layers())
    cuda_moe_autotune(cuda_moe_tune_shape(cfg, moe_local_experts),
                      ops::moe_tune_cache_path(cuda::default_tactic_cache_path()));
#else
  (void)cfg, (void)moe_local_experts;
#endif
}

ops::MoeTuneShape cuda_moe_tune_shape(const ModelConfig& cfg, int64_t moe_local_experts) {
  KILN_CHECK(cfg.has_moe_layers(), "cuda_moe_tune_shape: the model has no MoE layer");
  int64_t first = 0;
  while (!cfg.is_moe_layer(first)) ++first;
  bool fp8 = cfg.quant.fp8();
#ifdef KILN_HAVE_CUDA
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  fp8 = fp8 && fp8_weights_stay_fp8(Device::cuda(dev));
#endif
  // --quantization fp8 leaves experts that modules_to_not_convert names bf16 (model/qwen3_moe.cpp).
  const std::string gate =
      cfg.weight_prefix + "layers." + std::to_string(first) + ".mlp.experts.0.gate_proj.weight";
  if (cfg.quant.online && fp8_module_excluded(cfg.quant, gate)) fp8 = false;
  const int64_t E = cfg.moe.num_experts;
  return {.E = E,
          .local = moe_local_experts > 0 ? moe_local_experts : E,
          .k = cfg.moe.num_experts_per_tok,
          .H = cfg.hidden_size,
          .I = cfg.moe.moe_intermediate_size,
          .fp8 = fp8};
}

MoeAutotuneResult cuda_moe_autotune(const ops::MoeTuneShape& s, const std::string& cache_path,
                                    MoeAutotuneOptions opts) {
  MoeAutotuneResult r;
#ifdef KILN_HAVE_CUDA
  if (!env_switch("KILN_MOE_TUNE", true)) return r;
  const char* var = s.fp8 ? "KILN_MOE_FP8_W8A8_MIN_TOKENS" : "KILN_MOE_GEMV_MAX_TOKENS";
  r.key = ops::cuda::moe_tune_key(s);
  if (env_set(var)) {
    r.source = MoeTuneSource::env;
    return r;
  }
  if (r.key.below == 0) {
    r.source = MoeTuneSource::untunable;
    return r;
  }
  static std::mutex mu;  // tensor-parallel ranks: one tunes, the others read its cache
  const std::lock_guard<std::mutex> lock(mu);
  ops::MoeTuneCache cache = ops::load_moe_tune_cache(cache_path);
  if (const auto it = cache.find(r.key); it != cache.end() && !opts.retune) {
    r.source = MoeTuneSource::cache;
    r.entry = it->second;
  } else {
    ops::cuda::MoeThresholds t;
    try {
      t = ops::cuda::tune_moe_thresholds(s);
    } catch (const std::exception& ex) {  // e.g. an allocation that failed: the model still loads
      (void)cudaGetLastError();
      std::fprintf(stderr, "kiln: the MoE expert-kernel tuner failed (%s): the default thresholds stay\n",
                   ex.what());
    }
    if (!t.tuned) {
      r.source = MoeTuneSource::untunable;
      return r;
    }
    r.source = MoeTuneSource::tuned;
    r.entry = {.grouped_from = t.grouped_from, .times = t.times};
    r.seconds = t.seconds;
    std::fprintf(
        stderr,
        "kiln: timed the MoE expert kernels for this GPU and shape (E %lld, k %lld, H %lld, I %lld, %s "
        "experts) in %.2f s: the %s from %lld tokens (cache %s)\n",
        (long long)s.E, (long long)s.k, (long long)s.H, (long long)s.I, s.fp8 ? "block-FP8" : "bf16",
        t.seconds, s.fp8 ? "W8A8 grouped GEMM" : "wgmma grouped GEMM", (long long)t.grouped_from,
        cache_path.c_str());
    cache[r.key] = r.entry;
    ops::save_moe_tune_cache(cache_path, cache);  // false: warned; the value still applies
  }
  if (s.fp8)
    ops::cuda::moe_set_fp8_w8a8_min_tokens(r.entry.grouped_from);
  else
    ops::cuda::moe_set_gemv_max_tokens(r.entry.grouped_from - 1);
  if (opts.verbose) {
    const ops::MoeTuneTimes& t = r.entry.times;
    for (size_t i = 0; i < t.tokens.size(); ++i)
      std::printf("moe T %-4lld gather GEMV %9.1f us  grouped GEMM %9.1f us\n", (long long)t.tokens[i],
                  t.gemv_us[i], t.grouped_us[i]);
  }
#else
  (void)s, (void)cache_path, (void)opts;
#endif
  return r;
}

}  // namespace kiln
