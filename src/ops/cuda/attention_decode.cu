// Split-KV paged decode attention (one query row per sequence) and its combine kernel.
#include "ops/cuda/attention_common.cuh"

namespace kiln::cuda {
namespace {

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

// Grid (splits, Hkv, B); block 4 warps. Lane mapping: LPT = D/8 lanes per key, each owning 8 consecutive
// elements of head_dim (one 16-byte bf16 load or 8-byte fp8 load); TPW = 32/LPT keys per warp step.
// Warp w handles keys t_begin + (step * 4 + w) * TPW + slot. The G query heads of KV head hk live in
// registers of every lane and share each K/V load. Partial states merge across slots (shuffles), then
// across warps (shared memory); splits == 1 writes bf16 out, else (o/l, m, l) go to the workspace.
template <int D, int G, KvDtype KT>
__device__ __forceinline__ void decode_row(const PagedAttnParams& p, float* ws, int splits, int chunk, int b,
                                           int row, int ctx) {
  constexpr int LPT = D / 8, TPW = 32 / LPT;
  const int split = blockIdx.x, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slot = lane / LPT, sub = lane % LPT;
  const int t_begin = split * chunk, t_end = min(ctx, t_begin + chunk);

  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
    unpack8(*reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + int64_t(row) * p.q_stride_t +
                                            int64_t(hk * G + g) * p.q_stride_h + sub * 8),
            q[g]);
  SoftmaxState<G> st;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    st.m[g] = kNegInf;
    st.l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) st.acc[g][j] = 0.0f;
  }

  // The trip count is uniform across the warp so every lane takes part in the shuffles.
  for (int t0 = t_begin + warp * TPW; t0 < t_end; t0 += kWarps * TPW) {
    const int t = t0 + slot;
    const bool valid = t < t_end;
    float k[8], v[8];
    if (valid) {
      int64_t sc_off;
      const int64_t off = kv_row_offset(p, b, t, hk, &sc_off);
      load_kv8<KT>(p.k, p.k_scale, off, sc_off, sub * 8, k);
      load_kv8<KT>(p.v, p.v_scale, off, sc_off, sub * 8, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) k[j] = v[j] = 0.0f;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) s = fmaf(q[g][j], k[j], s);
#pragma unroll
      for (int off = LPT / 2; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      s = valid ? s * p.scale : kNegInf;
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
  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][D];
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int j = 0; j < 8; ++j) sm_acc[warp][g][sub * 8 + j] = st.acc[g][j];
      if (sub == 0) sm_m[warp][g] = st.m[g], sm_l[warp][g] = st.l[g];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
    const int g = idx / D, d = idx % D;
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.0f, O = 0.0f;
    if (M != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float c = expf(sm_m[w][g] - M);
        L = fmaf(sm_l[w][g], c, L);
        O = fmaf(sm_acc[w][g][d], c, O);
      }
    }
    const int h = hk * G + g;
    if (splits == 1) {
      static_cast<uint16_t*>(p.out)[int64_t(row) * p.o_stride_t + int64_t(h) * p.o_stride_h + d] =
          uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
    } else {
      const int64_t part = (int64_t(row) * p.Hq + h) * splits + split;
      ws[part * D + d] = L > 0.0f ? __fdiv_rn(O, L) : 0.0f;
      if (d == 0) {
        float* ml = ws + int64_t(p.T) * p.Hq * splits * D;
        ml[2 * part] = M;
        ml[2 * part + 1] = L;
      }
    }
  }
  __syncthreads();  // the shared partials may be reused by the next row
}

// The rows a decode block handles for sequence b: its one row when q_len == 1; with all_rows (a launch
// where T == B, so no prefill kernel runs) every row of the sequence, each with its causal context.
__device__ __forceinline__ bool decode_rows(const PagedAttnParams& p, int b, bool all_rows, int* row0, int* n,
                                            int* kv_len) {
  *row0 = p.cu_q[b];
  *n = p.cu_q[b + 1] - *row0;
  *kv_len = p.kv_lens[b];
  // kv_lens beyond the page table's reach violate the contract: such a sequence is skipped, never read.
  return *n >= 1 && (*n == 1 || all_rows) && *kv_len >= *n &&
         *kv_len <= int64_t(p.pages_stride) * p.page_size;
}

// Grid (splits, Hkv, B); block 4 warps (see decode_row).
template <int D, int G, KvDtype KT>
__global__ void __launch_bounds__(kWarps * 32)
    decode_kernel(const __grid_constant__ PagedAttnParams p, float* ws, int splits, int chunk,
                  bool all_rows) {
  pdl_wait();
  int row0, n, kv_len;
  if (decode_rows(p, blockIdx.z, all_rows, &row0, &n, &kv_len)) {
    for (int i = 0; i < n; ++i)
      decode_row<D, G, KT>(p, ws, splits, chunk, blockIdx.z, row0 + i, kv_len - n + 1 + i);
  }
  pdl_launch_dependents();
}

// Grid (Hq, B); block D threads, per row: the split maxima and weights w_s = l_s exp(m_s - M) computed
// split-parallel into shared memory, then thread d sums w_s o_s[d] over the splits in order, 16 loads in
// flight at a time (empty splits hold o = 0 and weight 0).
template <int D>
__global__ void __launch_bounds__(D)
    combine_kernel(const __grid_constant__ PagedAttnParams p, const float* ws, int splits, bool all_rows) {
  static_assert(D % 32 == 0 && D <= 1024, "one thread per element of head_dim");
  constexpr int kMaxSplits = 128;
  __shared__ float sw[kMaxSplits];
  __shared__ float red[D / 32];
  const int h = blockIdx.x, d = threadIdx.x;
  pdl_wait();
  int row0, n, kv_len;
  if (decode_rows(p, blockIdx.y, all_rows, &row0, &n, &kv_len)) {
    const float* ml = ws + int64_t(p.T) * p.Hq * splits * D;
    for (int row = row0; row < row0 + n; ++row) {
      const int64_t base = (int64_t(row) * p.Hq + h) * splits;
      float m = kNegInf;
      for (int s = d; s < splits; s += D) m = fmaxf(m, ml[2 * (base + s)]);
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      if (d % 32 == 0) red[d / 32] = m;
      __syncthreads();
      float M = kNegInf;
#pragma unroll
      for (int w = 0; w < D / 32; ++w) M = fmaxf(M, red[w]);
      for (int s = d; s < splits; s += D) {
        const float ms = ml[2 * (base + s)];
        sw[s] = ms == kNegInf ? 0.0f : ml[2 * (base + s) + 1] * expf(ms - M);
      }
      __syncthreads();
      float L = 0.0f, O = 0.0f;
      for (int s0 = 0; s0 < splits; s0 += 16) {
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = s0 + i < splits ? ws[(base + s0 + i) * D + d] : 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          if (s0 + i < splits) {
            L += sw[s0 + i];
            O = fmaf(sw[s0 + i], v[i], O);
          }
        }
      }
      static_cast<uint16_t*>(p.out)[int64_t(row) * p.o_stride_t + int64_t(h) * p.o_stride_h + d] =
          uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
      __syncthreads();  // sw and red are reused by the next row
    }
  }
  pdl_launch_dependents();
}

template <int D, KvDtype KT>
void launch_decode_typed(const PagedAttnParams& p, float* ws, int splits, int chunk, bool all_rows,
                         cudaStream_t stream, bool pdl) {
  const LaunchCfg cfg{.grid = dim3(unsigned(splits), unsigned(p.Hkv), unsigned(p.B)),
                      .block = dim3(kWarps * 32),
                      .stream = stream,
                      .pdl = pdl};
  switch (p.Hq / p.Hkv) {
    case 1:
      launch(cfg, decode_kernel<D, 1, KT>, p, ws, splits, chunk, all_rows);
      break;
    case 2:
      launch(cfg, decode_kernel<D, 2, KT>, p, ws, splits, chunk, all_rows);
      break;
    case 3:
      launch(cfg, decode_kernel<D, 3, KT>, p, ws, splits, chunk, all_rows);
      break;
    case 4:
      launch(cfg, decode_kernel<D, 4, KT>, p, ws, splits, chunk, all_rows);
      break;
    case 5:
      launch(cfg, decode_kernel<D, 5, KT>, p, ws, splits, chunk, all_rows);
      break;
    case 6:
      launch(cfg, decode_kernel<D, 6, KT>, p, ws, splits, chunk, all_rows);
      break;
    case 8:
      launch(cfg, decode_kernel<D, 8, KT>, p, ws, splits, chunk, all_rows);
      break;
    default:
      KILN_FAIL("paged decode attention: unsupported GQA group size ", p.Hq / p.Hkv, " (1-6, 8)");
  }
}

}  // namespace

void launch_decode(const PagedAttnParams& p, float* ws, int splits, int chunk, bool all_rows,
                   cudaStream_t stream, bool pdl) {
  KILN_DISPATCH_HEAD_DIM(
      p.D, KILN_DISPATCH_KV_DTYPE(p.kv_dtype,
                                  launch_decode_typed<kD, kKT>(p, ws, splits, chunk, all_rows, stream, pdl);))
}

void launch_decode_combine(const PagedAttnParams& p, const float* ws, int splits, bool all_rows,
                           cudaStream_t stream, bool pdl) {
  KILN_DISPATCH_HEAD_DIM(
      p.D,
      launch({.grid = dim3(unsigned(p.Hq), unsigned(p.B)), .block = dim3(kD), .stream = stream, .pdl = pdl},
             combine_kernel<kD>, p, ws, splits, all_rows);)
}

}  // namespace kiln::cuda
