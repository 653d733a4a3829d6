// Whole-step kernel choices (see cuda_step_choice.h).
#include "model/cuda_step_choice.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "model/cuda_graph.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#endif

namespace kiln {

#ifdef KILN_HAVE_CUDA
namespace {

// One padding sequence: a token at position 0 that writes no K/V (slot -1) and attends to page 0's first row.
BatchDesc padding_step(int32_t page_size) {
  BatchDesc b;
  b.page_size = page_size;
  b.pages_stride = 1;
  b.tokens = {0};
  b.positions = {0};
  b.slot_mapping = {-1};
  b.cu_q = {0, 1};
  b.kv_lens = {1};
  b.page_table = {0};
  b.logit_rows = {0};
  return b;
}

// The share by which the step without the prologue must be faster to leave it out.
constexpr double kMargin = 0.005;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

StepChoice cuda_choose_norm_in_by_step(Qwen3Model& model, KvCache& cache, bool pdl) {
  cuda::GemmEngine& eng = cuda::gemm_engine();
  StepChoice c;
  const char* env = std::getenv("KILN_GEMV_NORM_IN");
  if ((env && *env) || model.tp() || !eng.gemv_norm_in_tuned_at(1)) return c;
  // A failure here (a graph that does not capture, memory short) leaves the tuner's choice and says why: the
  // choice is an optimisation, not a reason to refuse to start.
  std::vector<double> t_with, t_without;
  try {
    const BatchDesc step = padding_step(cache.page_size());
    eng.set_gemv_norm_in_off_at(1, false);
    CudaDecodeGraph with(model, cache, 1, 1, {}, pdl);
    with.step(step);  // captured with the prologue
    eng.set_gemv_norm_in_off_at(1, true);
    CudaDecodeGraph without(model, cache, 1, 1, {}, pdl);
    without.step(step);  // and without it
    // Rounds of kSteps replays each, alternating, every replay waited for (as bench model times its steps).
    constexpr int kRounds = 6, kSteps = 8;
    const auto time_round = [&](CudaDecodeGraph& g, std::vector<double>& out) {
      for (int i = 0; i < kSteps + 1; ++i) {
        const auto a = std::chrono::steady_clock::now();
        g.step(step);
        KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(g.stream())));
        if (i > 0)  // the first replay of a round warms up after the other graph's
          out.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
      }
    };
    for (int r = 0; r < kRounds; ++r) {
      time_round(with, t_with);
      time_round(without, t_without);
    }
  } catch (const std::exception& e) {
    eng.set_gemv_norm_in_off_at(1, false);
    std::fprintf(stderr,
                 "kiln: the batch-1 residual-norm prologue not timed (the tuner's choice stays): %s\n",
                 e.what());
    return c;
  }
  c.timed = true;
  c.with_ms = median_of(t_with);
  c.without_ms = median_of(t_without);
  // Left out only where that is clearly faster: the 8B FP8 step's two medians differed by 0.15 % (H100,
  // 2026-12-07, docs/PERF.md E18), within a run's spread.
  c.norm_in = c.without_ms >= c.with_ms * (1.0 - kMargin);
  eng.set_gemv_norm_in_off_at(1, !c.norm_in);
  std::fprintf(stderr,
               "kiln: batch-1 decode step %.3f ms with the residual-norm prologue, %.3f ms without: %s at "
               "batch 1\n",
               c.with_ms, c.without_ms, c.norm_in ? "kept" : "left out");
  return c;
}
#else
StepChoice cuda_choose_norm_in_by_step(Qwen3Model&, KvCache&, bool) {
  return {};
}
#endif

}  // namespace kiln
