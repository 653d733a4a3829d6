// Whole-step kernel choices (see cuda_step_choice.h).
#include "model/cuda_step_choice.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

// One sequence of one new token at position ctx - 1 that writes no K/V (slot -1) and attends to ctx rows, its
// page table all page 0: the attention reads as many rows as a real step at that context (from the L2, the
// same page again), so the kernels around the GEMVs overlap as they do in serving. ctx: a multiple of the
// page size.
BatchDesc timing_step(int32_t page_size, int32_t ctx) {
  BatchDesc b;
  b.page_size = page_size;
  b.pages_stride = ctx / page_size;
  b.tokens = {0};
  b.positions = {ctx - 1};
  b.slot_mapping = {-1};
  b.cu_q = {0, 1};
  b.kv_lens = {ctx};
  b.page_table.assign(size_t(b.pages_stride), 0);
  b.logit_rows = {0};
  return b;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The context of the timed step (the decode-step rows of docs/PERF.md run at 1024), and the share by which
// the step without the prologue must be faster to leave it out.
constexpr int32_t kTimingContext = 1024;
constexpr double kMargin = 0.005;

}  // namespace

StepChoice cuda_choose_norm_in_by_step(Qwen3Model& model, KvCache& cache, bool pdl, int32_t max_context) {
  cuda::GemmEngine& eng = cuda::gemm_engine();
  StepChoice c;
  const char* env = std::getenv("KILN_GEMV_NORM_IN");
  if ((env && *env) || model.tp() || !eng.gemv_norm_in_tuned_at(1)) return c;
  const int32_t ps = cache.page_size();
  const int64_t max_pos = model.config().max_position_embeddings;  // 0: not given
  const int64_t limit =
      std::min<int64_t>({kTimingContext, max_context, max_pos > 0 ? max_pos : kTimingContext});
  const int32_t ctx = std::max(ps, int32_t(limit) / ps * ps);
  const BatchDesc step = timing_step(ps, ctx);
  eng.set_gemv_norm_in_off_at(1, false);
  CudaDecodeGraph with(model, cache, step.pages_stride, 1, {}, pdl);
  with.step(step);  // captured with the prologue
  eng.set_gemv_norm_in_off_at(1, true);
  CudaDecodeGraph without(model, cache, step.pages_stride, 1, {}, pdl);
  without.step(step);  // and without it
  // Rounds of kSteps replays each, alternating, every replay waited for (as bench model times its steps).
  constexpr int kRounds = 6, kSteps = 8;
  std::vector<double> t_with, t_without;
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
  c.timed = true;
  c.with_ms = median_of(t_with);
  c.without_ms = median_of(t_without);
  // Left out only where that is clearly faster: the two medians of one process differ by ~0.2 % run to run
  // (8B FP8, H100, 2026-12-07).
  c.norm_in = c.without_ms >= c.with_ms * (1.0 - kMargin);
  eng.set_gemv_norm_in_off_at(1, !c.norm_in);
  std::fprintf(stderr,
               "kiln: batch-1 decode step at context %d %.3f ms with the residual-norm prologue, %.3f ms "
               "without: %s at batch 1\n",
               ctx, c.with_ms, c.without_ms, c.norm_in ? "kept" : "left out");
  return c;
}
#else
StepChoice cuda_choose_norm_in_by_step(Qwen3Model&, KvCache&, bool) {
  return {};
}
#endif

}  // namespace kiln
