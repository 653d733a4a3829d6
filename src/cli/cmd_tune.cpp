// `kiln tune --model DIR | --shape NAME [--show] [--max-tokens N] [--max-logit-rows R] [--cache PATH]
// [--quantization none|fp8]`: times cuBLASLt's candidate tactics (and split-K variants) for every GEMM shape
// the model uses, for each M bucket up to --max-tokens, and stores the fastest in the tactic cache (default:
// ops/cuda/gemm.h's path); with block-FP8 weights (an FP8 checkpoint, or --quantization fp8) also the FP8
// GEMV configs of the projections at M buckets <= 8. A model with MoE layers: also the expert kernels'
// thresholds (model/cuda_tune.h cuda_moe_autotune, re-timed; saved beside the tactic cache, PATH.moe).
// --show prints the cached tactic per shape (and the cached MoE threshold) without tuning.
#include <cstdio>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/model_shapes.h"
#include "kiln/config.h"
#include "kiln/tensor.h"
#ifdef KILN_HAVE_CUDA
#include "model/cuda_tune.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe_tune.h"
#endif

namespace {

int run_tune(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"model", "shape", "max-tokens", "max-logit-rows", "cache", "quantization"},
                           {"show"});
#ifdef KILN_HAVE_CUDA
  KILN_CHECK(f.has("model") != f.has("shape"),
             "kiln tune: give --model DIR or --shape qwen3-8b|qwen3-4b|qwen3-0.6b");
  kiln::ModelConfig cfg = f.has("model") ? kiln::load_model_config(f.str("model"))
                                         : kiln::cli::builtin_qwen3_shape(f.str("shape"));
  const int64_t max_tokens = f.i64("max-tokens", 8192), max_rows = f.i64("max-logit-rows", 256);
  KILN_CHECK(max_tokens >= 1 && max_tokens <= 16384, "--max-tokens must be in [1, 16384], got ", max_tokens);
  KILN_CHECK(max_rows >= 1 && max_rows <= max_tokens, "--max-logit-rows must be in [1, --max-tokens]");
  KILN_CHECK(kiln::cuda_available(), "kiln tune needs a CUDA GPU; none is visible");
  const std::string path = f.str("cache", kiln::cuda::default_tactic_cache_path());
  // An embedding model runs no LM head (model/weights.h): no vocabulary GEMM to tune.
  const bool lm_head = cfg.arch != kiln::ModelArch::qwen3_embedding;
  // Block-FP8 weights (an FP8 checkpoint, or --quantization fp8): the FP8 GEMV's shapes as well.
  const std::string quant = f.str("quantization", "none");
  KILN_CHECK(quant == "none" || quant == "fp8", "--quantization must be none or fp8, got '", quant, "'");
  const bool fp8 = quant == "fp8" || cfg.quant.fp8();
  if (quant == "fp8" && cfg.quant.method.empty()) cfg.quant.online = true;
  const std::string moe_path = kiln::ops::moe_tune_cache_path(path);
  const auto shapes =
      kiln::cuda::qwen3_gemm_shapes(cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size,
                                    cfg.vocab_size, max_tokens, lm_head ? max_rows : 0, fp8);
  kiln::cuda::GemmEngine eng;
  const bool have = eng.load(path);
  std::printf("tactic cache %s (%s)\nkey %s\n", path.c_str(), have ? "loaded" : "none for this GPU/version",
              eng.key().c_str());
  if (f.flag("show")) {
    int missing = 0;
    for (const auto& s : shapes) {
      const auto it = eng.tactics().find(s);
      std::printf("M<=%-5lld N %-6lld K %-5lld %-4s%s ", (long long)s.m_bucket, (long long)s.n,
                  (long long)s.k, s.out == kiln::cuda::GemmOut::f32 ? "f32" : "bf16",
                  s.weight == kiln::cuda::GemmWeight::fp8 ? " W e4m3" : "");
      if (it == eng.tactics().end()) {
        ++missing;
        std::printf("(not tuned: the heuristic's first choice)\n");
      } else {
        std::printf("%9.2f us  %s\n", double(it->second.us), it->second.describe.c_str());
      }
    }
    std::printf("%zu shapes, %d not tuned\n", shapes.size(), missing);
    if (cfg.has_moe_layers()) {
      const kiln::ops::MoeTuneKey key = kiln::ops::cuda::moe_tune_key(kiln::cuda_moe_tune_shape(cfg));
      const kiln::ops::MoeTuneCache moe = kiln::ops::load_moe_tune_cache(moe_path);
      const auto it = moe.find(key);
      std::printf("MoE %s: %s\n", key.text().c_str(),
                  key.below == 0    ? "nothing to choose on this GPU"
                  : it == moe.end() ? "not tuned (the defaults)"
                                    : kiln::ops::format_moe_tune_line(key, it->second).c_str());
    }
    return 0;
  }
  std::printf("tuning %zu shapes (M buckets up to %lld)...\n", shapes.size(), (long long)max_tokens);
  eng.tune(shapes, /*verbose=*/true);
  eng.save(path);
  std::printf("saved %zu tactics to %s\n", eng.tactics().size(), path.c_str());
  if (cfg.has_moe_layers()) {
    const kiln::MoeAutotuneResult r =
        kiln::cuda_moe_autotune(kiln::cuda_moe_tune_shape(cfg), moe_path, {.retune = true, .verbose = true});
    const char* kernel = r.key.shape.fp8 ? "W8A8 grouped GEMM" : "wgmma grouped GEMM";
    switch (r.source) {
      case kiln::MoeTuneSource::tuned:
      case kiln::MoeTuneSource::cache:
        std::printf("MoE %s: the %s from %lld tokens, the gather GEMV below (%s)\n", r.key.text().c_str(),
                    kernel, (long long)r.entry.grouped_from, moe_path.c_str());
        break;
      case kiln::MoeTuneSource::env:
        std::printf("MoE: not tuned, %s is set\n",
                    r.key.shape.fp8 ? "KILN_MOE_FP8_W8A8_MIN_TOKENS" : "KILN_MOE_GEMV_MAX_TOKENS");
        break;
      case kiln::MoeTuneSource::untunable:
        std::printf("MoE: not tuned, the %s does not run here (or memory was short)\n", kernel);
        break;
      case kiln::MoeTuneSource::off:
        std::printf("MoE: not tuned (KILN_MOE_TUNE=0)\n");
        break;
    }
  }
  return 0;
#else
  (void)f;
  KILN_FAIL("kiln was built without CUDA: nothing to tune");
#endif
}

}  // namespace

KILN_COMMAND(
    "tune", "autotune cuBLASLt GEMM tactics for a model's shapes (--model DIR [--quantization fp8] [--show])",
    run_tune);
