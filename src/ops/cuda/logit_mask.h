// Structured output on the GPU: a grammar's allowed-token bitmask applied to logits before
// kiln::cuda::sample. For each masked row j < n: logits[rows[j], id] = -inf for every id in [0, V) whose bit
// (bit id % 32 of masks[j * words + id / 32]) is clear; ids at or past words * 32 count as clear. Rows not
// listed are not touched; allowed logits are not changed (no arithmetic, so CPU and GPU agree bit for bit:
// the CPU reference is kiln::apply_token_bitmask in runtime/logit_processor.h).
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// logits: device f32 [R, V], row stride ld >= V; rows: device i32 [n], each in [0, R); masks: device u32
// [n, words]. Nothing runs when n == 0.
void apply_token_bitmask(float* logits, int64_t ld, int64_t V, const int32_t* rows, const uint32_t* masks,
                         int64_t words, int64_t n, cudaStream_t stream);

}  // namespace kiln::cuda
