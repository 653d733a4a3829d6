// The portable decode kernels' per-key arithmetic, shared by attention_decode_portable.cu (v1, v2) and
// attention_tree.cu (token-tree rows): the query heads of a KV group in registers, one key at a time into an
// online softmax per head (fp32), and the merge of a block's partial states. Lane mapping: LPT = D / 8 lanes
// a key, each owning 8 consecutive elements of head_dim; TPW = 32 / LPT keys a warp step.
#pragma once

#include "ops/cuda/attention_common.cuh"

namespace kiln::cuda::portable_decode {

constexpr int kWarps = 4;
constexpr float kNegInf = -__builtin_huge_valf();

// Online-softmax state of one query head over a set of keys: running max m, sum l, unnormalised acc.
template <int G>
struct SoftmaxState {
  float m[G], l[G], acc[G][8];
};

// Merges (m2, l2, acc2) into (m, l, acc).
__device__ __forceinline__ void merge(float& m, float& l, float (&acc)[8], float m2, float l2,
                                      const float (&acc2)[8]) {
  const float mn = fmaxf(m, m2);
  if (mn == kNegInf) return;  // both empty
  const float c1 = expf(m - mn), c2 = expf(m2 - mn);
  l = l * c1 + l2 * c2;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = acc[j] * c1 + acc2[j] * c2;
  m = mn;
}

// Lane mapping of the kernels on these helpers (v1, v2, tree): LPT = D/8 lanes per key, each owning 8
// consecutive elements of head_dim (one 16-byte bf16 load or 8-byte fp8 load); TPW = 32/LPT keys per warp
// step. The G query heads of KV head hk live in registers of every lane and share each K/V load.
template <int D, int G>
__device__ __forceinline__ void load_q(const PagedAttnParams& p, int row, int hk, int sub, float (&q)[G][8]) {
#pragma unroll
  for (int g = 0; g < G; ++g)
    unpack8(*reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + int64_t(row) * p.q_stride_t +
                                            int64_t(hk * G + g) * p.q_stride_h + sub * 8),
            q[g]);
}

template <int G>
__device__ __forceinline__ void init_state(SoftmaxState<G>& st) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    st.m[g] = kNegInf;
    st.l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) st.acc[g][j] = 0.0f;
  }
}

// q·k over head_dim: this lane's 8 elements (FMAs in order), then an xor butterfly over the D / 8 lanes of
// the key; every lane of the warp must call it (full-mask shuffles).
template <int D>
__device__ __forceinline__ float key_dot(const float (&q)[8], const float (&k)[8]) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s = fmaf(q[j], k[j], s);
#pragma unroll
  for (int off = D / 16; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

// One key (this lane's 8 elements of k and v; zeros when !valid) into the running state of every head.
// Every lane of the warp must call it (the dot product is reduced by shuffles over the key's LPT lanes).
template <int D, int G>
__device__ __forceinline__ void update_key(SoftmaxState<G>& st, const float (&q)[G][8], const float (&k)[8],
                                           const float (&v)[8], bool valid, float scale) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float s = key_dot<D>(q[g], k);
    s = valid ? s * scale : kNegInf;
    const float mn = fmaxf(st.m[g], s);
    if (mn != kNegInf) {
      const float corr = expf(st.m[g] - mn), pj = expf(s - mn);
      st.l[g] = st.l[g] * corr + pj;
#pragma unroll
      for (int j = 0; j < 8; ++j) st.acc[g][j] = fmaf(pj, v[j], st.acc[g][j] * corr);
      st.m[g] = mn;
    }
  }
}

// Floats of shared scratch finish_row needs: m and l [kWarps][G], acc [kWarps][G][D].
template <int D, int G>
constexpr int finish_scratch_floats() {
  return 2 * kWarps * G + kWarps * G * D;
}

// Merges the block's partial states: the TPW slots of each warp (shuffles), then the warps (scratch in
// shared memory). direct: writes the bf16 row of out; else (o/l, m, l) of `split` go to workspace entry
// `ws_row` of ws_rows ([ws_rows, Hq, splits, D] outputs, then [ws_rows, Hq, splits, 2] (m, l)). Ends with
// __syncthreads (the scratch may be reused at once).
template <int D, int G>
__device__ __forceinline__ void finish_row(const PagedAttnParams& p, SoftmaxState<G>& st, float* scratch,
                                           float* ws, int64_t ws_rows, bool direct, int split, int splits,
                                           int row, int ws_row, int hk) {
  constexpr int LPT = D / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slot = lane / LPT, sub = lane % LPT;
  // Merge the TPW slots of the warp (lanes sub, sub + LPT, ...).
#pragma unroll
  for (int off = LPT; off < 32; off *= 2) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float acc2[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc2[j] = __shfl_xor_sync(0xffffffffu, st.acc[g][j], off);
      const float m2 = __shfl_xor_sync(0xffffffffu, st.m[g], off);
      const float l2 = __shfl_xor_sync(0xffffffffu, st.l[g], off);
      merge(st.m[g], st.l[g], st.acc[g], m2, l2, acc2);
    }
  }
  float* sm_m = scratch;              // [kWarps][G]
  float* sm_l = sm_m + kWarps * G;    // [kWarps][G]
  float* sm_acc = sm_l + kWarps * G;  // [kWarps][G][D]
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int j = 0; j < 8; ++j) sm_acc[(warp * G + g) * D + sub * 8 + j] = st.acc[g][j];
      if (sub == 0) sm_m[warp * G + g] = st.m[g], sm_l[warp * G + g] = st.l[g];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
    const int g = idx / D, d = idx % D;
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w * G + g]);
    float L = 0.0f, O = 0.0f;
    if (M != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float c = expf(sm_m[w * G + g] - M);
        L = fmaf(sm_l[w * G + g], c, L);
        O = fmaf(sm_acc[(w * G + g) * D + d], c, O);
      }
    }
    const int h = hk * G + g;
    if (direct) {
      static_cast<uint16_t*>(p.out)[int64_t(row) * p.o_stride_t + int64_t(h) * p.o_stride_h + d] =
          uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
    } else {
      const int64_t part = (int64_t(ws_row) * p.Hq + h) * splits + split;
      ws[part * D + d] = L > 0.0f ? __fdiv_rn(O, L) : 0.0f;
      if (d == 0) {
        float* ml = ws + ws_rows * p.Hq * splits * D;
        ml[2 * part] = M;
        ml[2 * part + 1] = L;
      }
    }
  }
  __syncthreads();  // the shared partials may be reused by the next row
}

}  // namespace kiln::cuda::portable_decode
