// Decode attention v3's folded combine (attention_decode_v3.cu, where the launch folds): the split blocks of
// a row and KV head write their partials to the workspace as for the combine kernel, count themselves done,
// and the last one merges the row's splits for the group's G heads, so no combine launch follows.
//
// Counting: every thread fences its partial stores (__threadfence), the block syncs, thread 0 adds 1 to the
// (row slot, KV head) counter of this device; the block that brings it to the row's active split count
// resets it to 0 (so the next launch, a graph replay included, starts from 0) and merges. The counters are
// touched only after the kernel's PDL wait, once the previous launch has ended; two launches in flight at
// once on two streams of one device would share them (the engine runs one stream a device).
//
// Merge (the last block, 128 threads): the partial outputs of the G heads (G x used x D floats, each head's
// contiguous in the workspace) are copied into the freed stages by 16-byte cp.async, all in flight at once,
// while the threads load the maxima and sums, reduce each head's maximum and compute the weights
// w_s = l_s exp(m_s - M) into shared memory; then thread (g, d) sums w_s o_s[d] over s in order and stores
// O / L. These are combine_kernel's operations in its order (attention_decode_combine.cu), so the outputs
// are its bits.
#pragma once

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/sm90.cuh"  // KILN_SM90A

namespace kiln::cuda::decode_v3 {

// Counters of the folded combine, one per (row slot, KV head): zero at module load.
constexpr int kFoldSlots = 4096;
__device__ unsigned int g_fold_count[kFoldSlots];

// Shared memory the merge needs for `splits` launched splits (the host checks it fits the stages).
constexpr size_t fold_smem_bytes(int G, int D, int splits) {
  return size_t(G) * size_t(splits) * (size_t(D) + 3) * sizeof(float) + 8 * sizeof(float);
}

#ifdef KILN_SM90A
// The last block of (row, hk) merges its `used` splits; smem: the block's freed stages (16-byte aligned).
template <int D, int G, int kThreads>
__device__ __forceinline__ void fold_merge(const PagedAttnParams& p, const float* ws, int splits, int b,
                                           int row, int hk, int used, unsigned char* smem) {
  constexpr float kNegInf = -__builtin_huge_valf();
  float* so = reinterpret_cast<float*>(smem);  // [G][used][D]
  float* sm = so + G * used * D;               // [G][used] maxima (natural-log units)
  float* sw = sm + G * used;                   // [G][used] sums, then weights
  float* sM = sw + G * used;                   // [G]
  const int64_t head0 = int64_t(decode_ws_slot(p, b, row)) * p.Hq + int64_t(hk) * G;
  const int per_head = used * (D / 4);  // 16-byte pieces of one head's partials
  for (int i = int(threadIdx.x); i < G * per_head; i += kThreads) {
    const int g = i / per_head, r = i % per_head;
    cp_async16(so + int64_t(g) * used * D + 4 * r, ws + (head0 + g) * splits * D + 4 * r);
  }
  cp_async_commit();
  const float* ml = ws + int64_t(p.B) * p.Hq * splits * D;
  for (int i = int(threadIdx.x); i < G * used; i += kThreads) {
    const int g = i / used, s = i % used;
    const float2 v = __ldcg(reinterpret_cast<const float2*>(ml + 2 * ((head0 + g) * splits + s)));
    sm[i] = v.x, sw[i] = v.y;
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int g = warp; g < G; g += kThreads / 32) {
    float M = kNegInf;
    for (int s = lane; s < used; s += 32) M = fmaxf(M, sm[g * used + s]);
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    if (lane == 0) sM[g] = M;
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < G * used; i += kThreads) {
    const float ms = sm[i];
    sw[i] = ms == kNegInf ? 0.0f : sw[i] * expf(ms - sM[i / used]);
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int idx = int(threadIdx.x); idx < G * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    const float* w = sw + g * used;
    const float* o = so + int64_t(g) * used * D + d;
    float L = 0.0f, O = 0.0f;
    for (int s = 0; s < used; ++s) {
      L += w[s];
      O = fmaf(w[s], o[s * D], O);
    }
    static_cast<uint16_t*>(p.out)[int64_t(row) * p.o_stride_t + int64_t(hk * G + g) * p.o_stride_h + d] =
        uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
  }
}

// After the block's partial stores: counts the block done for (row, hk) and, in the last one, merges.
template <int D, int G, int kThreads>
__device__ __forceinline__ void fold_count_and_merge(const PagedAttnParams& p, const float* ws, int splits,
                                                     int b, int row, int hk, int used, unsigned char* smem) {
  __shared__ unsigned int last;
  __threadfence();  // this thread's partial is visible device-wide before the block counts itself
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int* count = &g_fold_count[decode_ws_slot(p, b, row) * p.Hkv + hk];
    last = atomicAdd(count, 1u) == unsigned(used - 1);
    if (last) atomicExch(count, 0u);
  }
  __syncthreads();
  if (last) {
    __threadfence();  // the other blocks' partials, counted before this block's add, are read after it
    fold_merge<D, G, kThreads>(p, ws, splits, b, row, hk, used, smem);
  }
}
#endif  // KILN_SM90A

}  // namespace kiln::cuda::decode_v3
