// Unfused attention preparation: one kernel per step of ops/attn_prep.h, element loads/stores (any
// alignment, any head_dim the contract allows). The runtime fallback and the tests' second implementation.
//   1. rms_norm_kernel   Q heads: qkv -> Q destination (q_out or in place); without norm weights a copy
//   2. rms_norm_kernel   K heads: qkv -> K scratch [T, Hkv, D] (cudaMallocAsync, stream-ordered), likewise
//   3. rope_kernel       Q destination and K scratch in place
//   4. append_kernel     K scratch and V (from qkv) -> cache
// Mapping: norm and append: one warp per (token, head), lane l owns elements [8l, 8l + 8) (the contract's
// canonical lanes; D <= 256), 128-thread blocks. rope: one thread per (token, head, pair i < R / 2).
#include "ops/cuda/attn_prep_common.cuh"

namespace kiln::cuda {
namespace {

using namespace attn;

struct HeadRows {  // where head h of token t starts: base + t * row + h * head (elements)
  uint16_t* base;
  int64_t row, head;
};

template <ActKind A>
__global__ void __launch_bounds__(128) rms_norm_kernel(const __grid_constant__ AttnPrepParams p, int head0,
                                                       int nheads, HeadRows dst, const void* w) {
  const int64_t item = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (item >= int64_t(p.T) * nheads) return;  // whole warps leave together
  const int t = int(item / nheads), h = int(item % nheads), l = threadIdx.x % 32;
  const uint16_t* src =
      static_cast<const uint16_t*>(p.qkv) + int64_t(t) * p.qkv_row + int64_t(head0 + h) * p.D;
  const bool mine = 8 * l < p.D;
  float x[8] = {};
  float ss = 0.f;
  if (mine) {
    for (int j = 0; j < 8; ++j) {
      x[j] = act_widen<A>(src[8 * l + j]);
      ss = __fmaf_rn(x[j], x[j], ss);
    }
  }
  for (int o = 16; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(p.D)), p.eps)));
  if (!mine) return;
  uint16_t* out = dst.base + int64_t(t) * dst.row + int64_t(h) * dst.head;
  if (w == nullptr) {  // no per-head norm (ops/attn_prep.h): the head's values as they are
    for (int j = 0; j < 8; ++j) out[8 * l + j] = src[8 * l + j];
    return;
  }
  for (int j = 0; j < 8; ++j) {
    const float n = act_widen<A>(act_round<A>(__fmul_rn(x[j], r)));
    out[8 * l + j] = act_round<A>(__fmul_rn(n, act_widen<A>(static_cast<const uint16_t*>(w)[8 * l + j])));
  }
}

template <ActKind A>
__global__ void __launch_bounds__(256)
    rope_kernel(const __grid_constant__ AttnPrepParams p, HeadRows q, HeadRows k) {
  const int hr = p.rotary_dim / 2, H = p.Hq + p.Hkv;
  const int64_t idx = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= int64_t(p.T) * H * hr) return;
  const int i = int(idx % hr);
  const int h = int(idx / hr % H);
  const int t = int(idx / hr / H);
  const HeadRows& d = h < p.Hq ? q : k;
  uint16_t* y = d.base + int64_t(t) * d.row + int64_t(h < p.Hq ? h : h - p.Hq) * d.head;
  const int64_t pos = load_position(p, p.mrope == MRopeMode::none ? 0 : mrope_axis(p, i), t);
  const float c = p.rope[pos * p.rotary_dim + i], s = p.rope[pos * p.rotary_dim + hr + i];
  const float a = act_widen<A>(y[i]), b = act_widen<A>(y[i + hr]);
  const float bs = __fmul_rn(b, s), as = __fmul_rn(a, s);
  y[i] = act_round<A>(__fmaf_rn(a, c, -bs));
  y[i + hr] = act_round<A>(__fmaf_rn(b, c, as));
}

template <ActKind A, CacheKind C>
__global__ void __launch_bounds__(128) append_kernel(const __grid_constant__ AttnPrepParams p, HeadRows k) {
  const int64_t item = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (item >= int64_t(p.T) * 2 * p.Hkv) return;
  const int t = int(item / (2 * p.Hkv)), hh = int(item % (2 * p.Hkv)), l = threadIdx.x % 32;
  const int64_t slot = load_slot(p, t);
  if (slot < 0) return;
  const bool is_v = hh >= p.Hkv;
  const int kvh = is_v ? hh - p.Hkv : hh;
  const uint16_t* src =
      is_v ? static_cast<const uint16_t*>(p.qkv) + int64_t(t) * p.qkv_row + int64_t(p.Hq + p.Hkv + kvh) * p.D
           : k.base + int64_t(t) * k.row + int64_t(kvh) * k.head;
  uint16_t b[8] = {};
  if (8 * l < p.D) {
    for (int j = 0; j < 8; ++j) b[j] = src[8 * l + j];
  }
  const uint4 bits = pack8(b);
  // Lanes past D hold zeros: for fp8 their 8-lane blocks lie wholly past D (D % 64 == 0) and store nothing.
  if constexpr (C == CacheKind::fp8) {
    float v[8];
    unpack8<A>(bits, v);
    uint8_t sb;
    const uint2 q = fp8_quant8(v, 0xffffffffu, sb);
    if (8 * l >= p.D) return;
    const int64_t page = slot / p.page_size, row = slot - page * p.page_size;
    uint8_t* dst = static_cast<uint8_t*>(is_v ? p.v_cache : p.k_cache) + page * p.c_page + row * p.c_row +
                   int64_t(kvh) * p.c_head + 8 * l;
    for (int j = 0; j < 8; ++j) dst[j] = uint8_t((j < 4 ? q.x : q.y) >> (8 * (j % 4)));
    if (l % 8 == 0) {
      (is_v ? p.v_scale : p.k_scale)[page * p.s_page + row * p.s_row + int64_t(kvh) * p.s_head + l / 8] = sb;
    }
  } else {
    if (8 * l >= p.D) return;
    const int64_t page = slot / p.page_size, row = slot - page * p.page_size;
    const int64_t off = page * p.c_page + row * p.c_row + int64_t(kvh) * p.c_head + 8 * l;
    store_cache_chunk<A, C, false>(is_v ? p.v_cache : p.k_cache, nullptr, off, 0, l, bits, 0xffffffffu);
  }
}

template <ActKind A, CacheKind C>
void run_unfused(const AttnPrepParams& p, cudaStream_t stream) {
  const int64_t T = p.T;
  const size_t scratch_bytes = size_t(T) * p.Hkv * p.D * 2;
  void* scratch = nullptr;
  KILN_CUDA_CHECK(cudaMallocAsync(&scratch, scratch_bytes, stream));
  const HeadRows q{static_cast<uint16_t*>(p.q_dst), p.q_row, p.q_head};
  const HeadRows k{static_cast<uint16_t*>(scratch), int64_t(p.Hkv) * p.D, p.D};
  auto blocks = [](int64_t n, int per) { return dim3(unsigned((n + per - 1) / per)); };
  launch(LaunchCfg{blocks(T * p.Hq, 4), dim3(128), 0, stream}, rms_norm_kernel<A>, p, 0, p.Hq, q, p.q_norm);
  launch(LaunchCfg{blocks(T * p.Hkv, 4), dim3(128), 0, stream}, rms_norm_kernel<A>, p, p.Hq, p.Hkv, k,
         p.k_norm);
  launch(LaunchCfg{blocks(T * (p.Hq + p.Hkv) * (p.rotary_dim / 2), 256), dim3(256), 0, stream},
         rope_kernel<A>, p, q, k);
  launch(LaunchCfg{blocks(T * 2 * p.Hkv, 4), dim3(128), 0, stream}, append_kernel<A, C>, p, k);
  KILN_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

template <ActKind A>
void run_unfused_act(const AttnPrepParams& p, cudaStream_t s) {
  switch (p.cache) {
    case CacheKind::bf16:
      return run_unfused<A, CacheKind::bf16>(p, s);
    case CacheKind::f16:
      return run_unfused<A, CacheKind::f16>(p, s);
    case CacheKind::fp8:
      return run_unfused<A, CacheKind::fp8>(p, s);
  }
}

}  // namespace

void launch_attn_prep_unfused(const AttnPrepParams& p, void* stream) {
  if (p.T == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.act == ActKind::bf16) {
    run_unfused_act<ActKind::bf16>(p, s);
  } else {
    run_unfused_act<ActKind::f16>(p, s);
  }
}

}  // namespace kiln::cuda
