// Log-probabilities of chosen ids in rows of logits, on the GPU (prompt log-probabilities and reranker
// scores; the contract and its host reference are in runtime/prompt_logprobs.h, row_logprobs()).
//
// logits: f32 [R, V], row stride ld (elements). ids: device i32 [R, n]. Per row r (one block):
//   m = max_i x_i; lse = m + log(sum_i exp(x_i - m)) in fp32 (per-thread partials in index order, a warp xor
//   butterfly 16..1, then the warps' sums in warp order: deterministic);
//   logprobs[r, j] = x[ids[r, j]] - lse; ranks[r, j] = 1 + #{i : x_i > x[ids[r, j]]}.
// The top-n of a row come from cuda::sample with temperature 0 (sampling.h), whose lse is computed alike.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

inline constexpr int kMaxRowLogprobIds = 16;

// Validates sizes (R >= 0, 0 < V < 2^31, ld >= V, 1 <= n <= 16, non-null pointers); ids are read on the
// device and must lie in [0, V) (the caller checks them on the host).
void row_logprobs(const float* logits, int64_t ld, int64_t R, int64_t V, const int32_t* ids, int n,
                  float* logprobs, int32_t* ranks, cudaStream_t stream);

}  // namespace kiln::cuda
