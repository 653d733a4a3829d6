// Ranking logit rows (ops/argmax.h has the contracts: lowest index among equal maxima, NaN below every
// number): each row's argmax, or its top k with log-probabilities, plus a per-index offset. Raw device
// pointers; enqueued on `stream`.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// logits: f32 [R, V], row stride ld (elements) >= V; offsets: i64 [V] or null; out: i32 [R].
void argmax_rows(const float* logits, int64_t ld, int64_t R, int64_t V, const int64_t* offsets, int32_t* out,
                 cudaStream_t stream, bool pdl = false);

// topk.cu. logits: f32 [R, V], row stride ld >= V, V < 2^31; offsets: i64 [V] or null; 1 <= k <= min(V, 16);
// tokens: i32 [R, k]; logprobs: f32 [R, k].
void topk_rows(const float* logits, int64_t ld, int64_t R, int64_t V, const int64_t* offsets, int k,
               int32_t* tokens, float* logprobs, cudaStream_t stream, bool pdl = false);

}  // namespace kiln::cuda
