// Greedy tokens: each logit row's argmax plus a per-index offset (ops/argmax.h has the contract: lowest index
// among equal maxima, NaN below every number). Raw device pointers; enqueued on `stream`.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// logits: f32 [R, V], row stride ld (elements) >= V; offsets: i64 [V] or null; out: i32 [R].
void argmax_rows(const float* logits, int64_t ld, int64_t R, int64_t V, const int64_t* offsets, int32_t* out,
                 cudaStream_t stream, bool pdl = false);

}  // namespace kiln::cuda
