// The MoE expert-kernel tuner: times the gather GEMV against the grouped GEMM for one expert shape on the
// current device and picks the batch size from which moe_mlp (by_rows) takes the grouped GEMM.
//
// Contract:
//   - What is compared: whole ops::cuda::moe_mlp calls (router, routing, permutation, experts, combine) with
//     an explicit MoeExperts: gather_gemv against grouped_gemm_fp8_w8a8 for block-FP8 experts, against
//     grouped_gemm_sm90 for bf16 experts, at T = 1, 2, 4, ..., 128 (ops/moe_tune_table.h kMoeTuneLadder; FP8:
//     only T below moe_fp8_dequant_min_tokens()).
//   - The experts are synthetic, of the shape's size and dtype, on the device: bf16 uniform in [-0.05, 0.05]
//     (FP8: those quantized per 128 x 128 block by quantize_weight_fp8, so every value and scale is finite),
//     a random bf16 router and random inputs (fixed seeds), so tokens spread over the experts as in a
//     load-balanced model. Each call takes the next of 8 input batches: consecutive calls choose different
//     experts, which at small T would otherwise be re-read from the L2.
//   - Each (T, kernel): one eager warm-up call, then the 8 calls (one per input batch) captured in a CUDA
//     graph, as the decode step runs its layers (eager where the capture fails: MoeThresholds::graphs),
//     replayed once untimed and 7 times between CUDA events on a stream of its own; the median replay's time
//     per call.
//   - The choice: ops::moe_grouped_from (the smallest T from which the grouped GEMM is within
//     kMoeTuneGroupedMargin of the GEMV at that and every larger T timed); where the GEMV wins at the
//     ladder's top, `below`: block-FP8, the dequant threshold (the GEMV up to it, as before the W8A8 GEMM had
//     its own threshold); bf16, 129 (the GEMV up to 128, the largest T timed).
//   - Nothing is timed where the result could not change what runs (moe_tune_below() == 0): block-FP8
//     experts where the W8A8 grouped GEMM does not run (not sm_90a, KILN_MOE_FP8_W8A8=0,
//     KILN_MOE_EXPERTS=gemm, dequant threshold 0 or 1); bf16 experts where the wgmma grouped GEMM does not
//     apply or KILN_MOE_EXPERTS names a kernel. Nor where the device lacks the memory for the synthetic
//     experts (a warning on stderr).
//   - It frees everything it allocated and leaves the thresholds as they were: applying the result (and the
//     cache, and the environment's precedence) is the caller's (model/cuda_tune.h).
//   - The block-FP8 GEMV timed is the form the switches select (kiln::cuda::moe_fp8_e4m3x16(): path (d),
//     else path (c), ops/cuda/moe.h); the tuner does not time the forms against each other, and the cache key
//     does not name the form, so a threshold cached under one form is reused under the other.
#pragma once

#include <cstdint>

#include "ops/moe_tune_table.h"

namespace kiln::ops::cuda {

// The result for one shape. tuned false: nothing was timed (see above); grouped_from and times empty.
struct MoeThresholds {
  bool tuned = false;
  int64_t grouped_from = 0;  // the first T that takes the grouped GEMM, in [1, below]
  int64_t below = 0;         // moe_tune_below(s) when it was timed
  MoeTuneTimes times;
  double seconds = 0;  // wall time of the whole tuning (allocations and fills included)
  bool graphs = true;  // every time from graph replays (false: some capture failed, those timed eagerly)
};

// The exclusive end of the thresholds the tuner may choose for s under this process's settings (the value
// meaning "the GEMV over the whole ladder"); 0 where it times nothing.
int64_t moe_tune_below(const MoeTuneShape& s);
// The cache key of s on the current device (its name and SM count; below = moe_tune_below(s)).
MoeTuneKey moe_tune_key(const MoeTuneShape& s);
MoeThresholds tune_moe_thresholds(const MoeTuneShape& s);

}  // namespace kiln::ops::cuda
