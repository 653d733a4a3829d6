// Token sampling on the GPU: greedy, temperature, top-k, top-p, per-request seed; the chosen token's
// log-probability and, when asked, the top-n log-probabilities.
//
// logits: f32 [R, V], row stride ld (elements). params: device array [R] of SampleParams.
// Per row r (one thread block):
//   lse = log(sum_i exp(x_i)) (fp32, max subtracted). Log-probabilities are x_i - lse: the model's own
//   distribution, before temperature / top-k / top-p (what vLLM and SGLang return by default).
//   temperature <= 0: greedy, the lowest index among the maximal logits.
//   otherwise: kept = top-k (the k largest logits; every logit equal to the k-th is kept too), then
//   top-p over kept (the smallest set of largest probabilities softmax(x / T) whose mass >= top_p times
//   the kept mass; ties at the boundary kept). Thresholds are exact: a bitwise radix search on the
//   logits' order-preserving integer keys (no sort, no approximation).
//   The token is drawn by the Gumbel-max trick, argmax over kept of x_i / T - log(-log(u_i)), with
//   u_i in (0, 1) a counter hash of (seed, step, i): the same (seed, step, logits) give the same token on
//   any launch shape, and it is distributed exactly as softmax(x / T) restricted to kept.
//   tokens[r] = the token; logprobs[r] = its log-probability; for n = top_n > 0, top_ids[r, 0..n) and
//   top_logprobs[r, 0..n) the n most likely tokens (descending, ties by lowest id).
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

struct SampleParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0 or >= V: no top-k
  float top_p = 1.0f;        // in (0, 1]; 1: no top-p
  uint64_t seed = 0;
  uint64_t step = 0;  // the request's output-token index: a fresh draw each step
};

inline constexpr int kMaxTopN = 20;

// Validates sizes (R >= 0, V > 0, 0 <= top_n <= 20, ld >= V) and launches one block per row. The per-row
// params live on the device, so their ranges are checked by the caller on the host.
void sample(const float* logits, int64_t ld, int64_t R, int64_t V, const SampleParams* params,
            int32_t* tokens, float* logprobs, int top_n, int32_t* top_ids, float* top_logprobs,
            cudaStream_t stream);

}  // namespace kiln::cuda
