// DevicePenalties: the GPU half of LogitProcessor, for Qwen3Runner::forward_sampled. It keeps one count
// row per penalized request on the device (u32 [rows, vocab]: bit 31 "in the prompt", bits 0-30 "times
// generated"; ops/cuda/sampling_penalties.h), so a decode step -- a CUDA-graph replay followed by the
// penalty and sampling kernels on the graph's stream -- updates the history from the sampled tokens'
// device buffer with no host round trip.
//
// Per step: apply() (before cuda::sample) gives every penalized row a count row (a fresh one is zeroed
// and gets the prompt), uploads the generated tokens the device has not counted yet (only after a step
// the host sampled, or at the first step), and runs bias / min-token mask / penalties on the logits in
// place. count_sampled() (after cuda::sample) adds the sampled tokens to the rows' counts. The engine
// then observes exactly those tokens, so host and device histories agree; a request that ends without
// observing its last draw is released. A row whose processor carries a grammar mask (structured output)
// has it uploaded with the step's other staging bytes and applied by ops/cuda/logit_mask.h after the
// penalties. Rows without processing cost nothing; CUDA builds only.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kiln/staged_upload.h"
#include "kiln/tensor.h"
#include "runtime/model_runner.h"

struct CUstream_st;

namespace kiln {

class DevicePenalties {
 public:
  DevicePenalties(Device device, int64_t vocab) : device_(device), vocab_(vocab), uploads_(device) {}

  // logits: device f32 [rows.size(), ld]. Returns whether any kernel ran. Its inputs (count updates, biases,
  // grammar masks) leave by one asynchronous copy on `stream` (StagedUploads), ordered after the work queued
  // there before, so it may be called right after the step's forward pass is queued.
  bool apply(float* logits, int64_t ld, const std::vector<ModelRunner::RowSampling>& rows,
             CUstream_st* stream);
  // tokens: device i32 [R] from cuda::sample for the rows of the last apply().
  void count_sampled(const int32_t* tokens, int64_t R, CUstream_st* stream);
  void release(uint64_t request);

  int32_t count_rows_in_use() const { return int32_t(slots_.size()); }  // tests

 private:
  struct Slot {
    int32_t row = -1;
    size_t counted = 0;  // generated tokens already in the device row
  };
  int32_t take_row(CUstream_st* stream);

  Device device_;
  int64_t vocab_;
  std::unordered_map<uint64_t, Slot> slots_;  // by request
  std::vector<int32_t> free_rows_;
  int32_t capacity_ = 0;
  Buffer counts_;          // u32 [capacity_, vocab_]
  Buffer staging_;         // this step's PenaltyRow [R], count rows [R], adds, pending (row, id) pairs, masks
  StagedUploads uploads_;  // staging_'s copy
  std::vector<uint64_t> step_requests_;  // per logit row of the last apply(): request with a count row, or 0
  const int32_t* step_rows_dev_ = nullptr;  // device i32 [R] in staging_
  bool step_counts_ = false;
};

}  // namespace kiln
