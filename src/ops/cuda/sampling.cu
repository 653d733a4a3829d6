// GPU sampling: one block of 1024 threads per row; contract in sampling.h.
#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr float kNegInf = -__builtin_huge_valf();

// Order-preserving map of a float to uint32 (NaN excluded by the caller: treated as -inf).
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x != x) x = kNegInf;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// u in (0, 1): 24 random bits, offset by half a step so neither end is reached.
__device__ __forceinline__ float uniform(uint64_t seed, uint64_t step, int64_t i) {
  const uint64_t h = mix64(mix64(seed ^ 0x5851f42d4c957f2dull) + step * 0x9e3779b97f4a7c15ull + uint64_t(i));
  return (float(uint32_t(h >> 40)) + 0.5f) * (1.0f / 16777216.0f);
}

// Block-wide reductions over kThreads threads: block_reduce.cuh's.
__device__ __forceinline__ float block_sum(float v, float* sm) {
  return cuda::block_sum<kThreads>(v, sm);
}
// (value, index) argmax; ties go to the lowest index.
__device__ void block_argmax(float& v, int& idx, float* smv, int* smi) {
  for (int o = 16; o >= 1; o /= 2) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (v2 > v || (v2 == v && i2 < idx)) v = v2, idx = i2;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) smv[threadIdx.x / 32] = v, smi[threadIdx.x / 32] = idx;
  __syncthreads();
  v = smv[0], idx = smi[0];
  for (int w = 1; w < kThreads / 32; ++w)
    if (smv[w] > v || (smv[w] == v && smi[w] < idx)) v = smv[w], idx = smi[w];
}

struct SampleArgs {
  const float* logits;  // [R, V], row stride ld
  int64_t ld, V;
  const SampleParams* params;  // [R]
  int32_t* tokens;             // [R]
  float* logprobs;             // [R]
  int top_n;
  int32_t* top_ids;     // [R, top_n]
  float* top_logprobs;  // [R, top_n]
};

// Grid (R); block 1024. Each pass below is a grid-stride sweep of the row (L2-resident after the first).
__global__ void __launch_bounds__(kThreads) sample_kernel(const __grid_constant__ SampleArgs a) {
  __shared__ float smf[kThreads / 32];
  __shared__ int smi[kThreads / 32];
  __shared__ int chosen_top[kMaxTopN];
  const int64_t r = blockIdx.x;
  const float* x = a.logits + r * a.ld;
  const SampleParams sp = a.params[r];
  const int64_t V = a.V;

  float mx = kNegInf;
  int amax = int(V);
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = x[i];
    if (v > mx) mx = v, amax = int(i);  // ascending i per thread: the first maximum stays
  }
  block_argmax(mx, amax, smf, smi);
  float se = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) se += expf(x[i] - mx);
  const float lse = mx + logf(block_sum(se, smf));

  int token = amax;
  if (sp.temperature > 0.0f) {
    const float inv_t = 1.0f / sp.temperature;
    uint32_t lo_key = 0;  // kept: order_key(x) >= lo_key
    if (sp.top_k > 0 && sp.top_k < V) {
      // Largest key t with count(key >= t) >= k: the k-th largest logit's key, built bit by bit.
      uint32_t t = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = t | (1u << bit);
        float cnt = 0.0f;
        for (int64_t i = threadIdx.x; i < V; i += kThreads) cnt += order_key(x[i]) >= cand ? 1.0f : 0.0f;
        if (block_sum(cnt, smf) >= float(sp.top_k)) t = cand;
      }
      lo_key = t;
    }
    if (sp.top_p < 1.0f) {
      float z = 0.0f;
      for (int64_t i = threadIdx.x; i < V; i += kThreads)
        if (order_key(x[i]) >= lo_key) z += expf((x[i] - mx) * inv_t);
      const float need = sp.top_p * block_sum(z, smf);
      // Largest key t whose mass over {key >= max(t, lo_key)} is >= need (monotone in t; t >= lo_key
      // because that mass is the whole kept mass there).
      uint32_t t = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = t | (1u << bit);
        const uint32_t bound = cand > lo_key ? cand : lo_key;
        float m = 0.0f;
        for (int64_t i = threadIdx.x; i < V; i += kThreads)
          if (order_key(x[i]) >= bound) m += expf((x[i] - mx) * inv_t);
        if (block_sum(m, smf) >= need) t = cand;
      }
      t = t > lo_key ? t : lo_key;
      lo_key = t;
    }
    float best = kNegInf;
    int best_i = int(V);
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      if (order_key(x[i]) < lo_key) continue;
      const float g = -logf(-logf(uniform(sp.seed, sp.step, i)));
      const float s = x[i] * inv_t + g;
      if (s > best) best = s, best_i = int(i);
    }
    block_argmax(best, best_i, smf, smi);
    token = best_i < V ? best_i : amax;  // all logits NaN / -inf: fall back to the argmax
  }
  if (threadIdx.x == 0) {
    a.tokens[r] = token;
    a.logprobs[r] = x[token < V ? token : 0] - lse;
  }
  for (int n = 0; n < a.top_n; ++n) {
    float v = kNegInf;
    int idx = int(V);
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      bool taken = false;
      for (int j = 0; j < n; ++j) taken |= chosen_top[j] == int(i);
      if (!taken && (x[i] > v || idx == int(V))) v = x[i], idx = int(i);
    }
    block_argmax(v, idx, smf, smi);
    if (threadIdx.x == 0) {
      chosen_top[n] = idx;
      a.top_ids[r * a.top_n + n] = idx;
      a.top_logprobs[r * a.top_n + n] = v - lse;
    }
    __syncthreads();
  }
}

}  // namespace

void sample(const float* logits, int64_t ld, int64_t R, int64_t V, const SampleParams* params,
            int32_t* tokens, float* logprobs, int top_n, int32_t* top_ids, float* top_logprobs,
            cudaStream_t stream) {
  KILN_CHECK(R >= 0 && V > 0 && V < (int64_t(1) << 31) && ld >= V, "sample: bad logits shape R ", R, " V ", V,
             " ld ", ld);
  KILN_CHECK(top_n >= 0 && top_n <= kMaxTopN && top_n <= V, "sample: top_n must be in [0, ", kMaxTopN,
             "], got ", top_n);
  KILN_CHECK(logits && params && tokens && logprobs, "sample: null pointer");
  KILN_CHECK(top_n == 0 || (top_ids && top_logprobs), "sample: top_n > 0 needs top_ids and top_logprobs");
  if (R == 0) return;
  const SampleArgs a{.logits = logits,
                     .ld = ld,
                     .V = V,
                     .params = params,
                     .tokens = tokens,
                     .logprobs = logprobs,
                     .top_n = top_n,
                     .top_ids = top_ids,
                     .top_logprobs = top_logprobs};
  launch({.grid = dim3(unsigned(R)), .block = dim3(kThreads), .stream = stream}, sample_kernel, a);
}

}  // namespace kiln::cuda
