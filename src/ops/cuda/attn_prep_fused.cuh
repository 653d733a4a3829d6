// Fused attention preparation (ops/attn_prep.h): RMSNorm + RoPE/M-RoPE of Q and K, Q out, K and V into the
// paged cache, one launch. Included by one .cu per head_dim (attn_prep_fused_d{64,128,256}.cu).
//
// Mapping (both variants): a "group" of G = D / 8 consecutive lanes owns one (token, head) item; lane c of
// the group owns elements [8c, 8c + 8) and moves them with one 16-byte load / store. The group's lanes are
// the canonical reduction's lanes 0..G-1 (lanes G..31 of the contract hold +0, so their butterfly steps are
// exact no-ops): the sum of squares is a butterfly G/2 .. 1 inside the group. The NeoX partner chunk of
// lane c < R/16 is lane c + R/16 (and back), exchanged as packed act bits with 4 shuffles. The 64-element
// FP8 blocks are 8 consecutive lanes (max by xor 4, 2, 1). Heads: [0, Hq) Q, [Hq, Hq + Hkv) K,
// [Hq + Hkv, Hq + 2*Hkv) V (V is only converted into the cache). All shuffles use the group's lane mask,
// so groups of one warp may branch independently.
//   decode (small batch, T <= 128): grid (ceil(H / groups_per_block), T), block 128: no loop, no division.
//   prefill (bandwidth): grid-stride over T * H items, block 256, two items per iteration with both
//     16-byte loads issued before either is used (memory-level parallelism).
#pragma once

#include "ops/cuda/attn_prep_common.cuh"

namespace kiln::cuda::attn {

struct ItemIn {
  uint4 raw;  // this lane's 8 act values of the head
  int t, h;
};

template <int D>
__device__ __forceinline__ ItemIn load_item(const AttnPrepParams& p, int t, int h, int c) {
  const uint16_t* src = static_cast<const uint16_t*>(p.qkv) + int64_t(t) * p.qkv_row + int64_t(h) * D + 8 * c;
  return ItemIn{__ldg(reinterpret_cast<const uint4*>(src)), t, h};
}

template <ActKind A, CacheKind C, int D>
__device__ __forceinline__ void finish_item(const AttnPrepParams& p, const ItemIn& in, int c, unsigned mask) {
  constexpr int G = D / 8;
  const int t = in.t, h = in.h, Hq = p.Hq, Hkv = p.Hkv;
  if (h >= Hq + Hkv) {  // V: straight into the cache
    const int64_t slot = load_slot(p, t);
    if (slot >= 0) store_cache_chunk<A, C>(p, p.v_cache, p.v_scale, slot, h - Hq - Hkv, c, in.raw, mask);
    return;
  }
  const bool is_q = h < Hq;
  int64_t slot = -1;
  if (!is_q) {
    slot = load_slot(p, t);
    if (slot < 0) return;  // K not stored: nothing of this item is visible
  }
  // 1. RMSNorm, canonical order.
  float x[8];
  unpack8<A>(in.raw, x);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) ss = __fmaf_rn(x[j], x[j], ss);
#pragma unroll
  for (int o = G / 2; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(mask, ss, o, G));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), p.eps)));
  float w[8];
  unpack8<A>(
      __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(is_q ? p.q_norm : p.k_norm) + 8 * c)),
      w);
  uint16_t yb[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float n = act_widen<A>(act_round<A>(__fmul_rn(x[j], r)));
    yb[j] = act_round<A>(__fmul_rn(n, w[j]));
  }
  // 2. RoPE (NeoX halves are lane chunks c and c +- R/16).
  const uint4 ybits = pack8(yb);
  const int half_lanes = p.rotary_dim / 16;
  const int partner = c < half_lanes ? c + half_lanes : (c < 2 * half_lanes ? c - half_lanes : c);
  uint4 pbits;
  pbits.x = __shfl_sync(mask, ybits.x, partner, G);
  pbits.y = __shfl_sync(mask, ybits.y, partner, G);
  pbits.z = __shfl_sync(mask, ybits.z, partner, G);
  pbits.w = __shfl_sync(mask, ybits.w, partner, G);
  uint4 out = ybits;  // elements past rotary_dim: act(y) == y
  if (c < 2 * half_lanes) {
    const bool first = c < half_lanes;
    const int R = p.rotary_dim, hr = R / 2;
    const int i0 = first ? 8 * c : 8 * c - hr;  // angle index of element j: i0 + j
    float cs[8], sn[8];
    if (p.mrope == MRopeMode::none) {
      const float* row = p.rope + load_position(p, 0, t) * R + i0;
      const float4 c0 = __ldg(reinterpret_cast<const float4*>(row));
      const float4 c1 = __ldg(reinterpret_cast<const float4*>(row + 4));
      const float4 s0 = __ldg(reinterpret_cast<const float4*>(row + hr));
      const float4 s1 = __ldg(reinterpret_cast<const float4*>(row + hr + 4));
      cs[0] = c0.x, cs[1] = c0.y, cs[2] = c0.z, cs[3] = c0.w, cs[4] = c1.x, cs[5] = c1.y, cs[6] = c1.z,
      cs[7] = c1.w;
      sn[0] = s0.x, sn[1] = s0.y, sn[2] = s0.z, sn[3] = s0.w, sn[4] = s1.x, sn[5] = s1.y, sn[6] = s1.z,
      sn[7] = s1.w;
    } else {
      const int64_t p0 = load_position(p, 0, t), p1 = load_position(p, 1, t), p2 = load_position(p, 2, t);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int ax = mrope_axis(p, i0 + j);
        const float* row = p.rope + (ax == 0 ? p0 : ax == 1 ? p1 : p2) * R + i0 + j;
        cs[j] = __ldg(row);
        sn[j] = __ldg(row + hr);
      }
    }
    float y[8], yp[8];
    unpack8<A>(ybits, y);
    unpack8<A>(pbits, yp);
    uint16_t ob[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float ps = __fmul_rn(yp[j], sn[j]);
      ob[j] = act_round<A>(__fmaf_rn(y[j], cs[j], first ? -ps : ps));
    }
    out = pack8(ob);
  }
  // 3. Outputs.
  if (is_q) {
    uint16_t* dst = static_cast<uint16_t*>(p.q_dst) + int64_t(t) * p.q_row + int64_t(h) * p.q_head + 8 * c;
    *reinterpret_cast<uint4*>(dst) = out;
  } else {
    store_cache_chunk<A, C>(p, p.k_cache, p.k_scale, slot, h - Hq, c, out, mask);
  }
}

template <int D>
__device__ __forceinline__ unsigned group_mask() {
  constexpr int G = D / 8;
  if constexpr (G == 32) {
    return 0xffffffffu;
  } else {
    return ((1u << G) - 1u) << ((threadIdx.x & 31) / G * G);
  }
}

template <ActKind A, CacheKind C, int D>
__global__ void __launch_bounds__(128) attn_prep_decode_kernel(const __grid_constant__ AttnPrepParams p) {
  constexpr int G = D / 8, kGroups = 128 / G;
  const int H = p.Hq + 2 * p.Hkv;
  const int h = blockIdx.x * kGroups + threadIdx.x / G;
  if (h >= H) return;  // whole groups leave together
  const int c = threadIdx.x % G;
  finish_item<A, C, D>(p, load_item<D>(p, blockIdx.y, h, c), c, group_mask<D>());
}

template <ActKind A, CacheKind C, int D>
__global__ void __launch_bounds__(256, 4) attn_prep_prefill_kernel(const __grid_constant__ AttnPrepParams p) {
  constexpr int G = D / 8, kGroups = 256 / G;
  const int H = p.Hq + 2 * p.Hkv;
  const int64_t total = int64_t(p.T) * H;
  const int64_t stride = int64_t(gridDim.x) * kGroups;
  const int c = threadIdx.x % G;
  const unsigned mask = group_mask<D>();
  for (int64_t it = int64_t(blockIdx.x) * kGroups + threadIdx.x / G; it < total; it += 2 * stride) {
    const int64_t it2 = it + stride;
    const ItemIn a = load_item<D>(p, int(it / H), int(it % H), c);
    ItemIn b{};
    if (it2 < total) b = load_item<D>(p, int(it2 / H), int(it2 % H), c);
    finish_item<A, C, D>(p, a, c, mask);
    if (it2 < total) finish_item<A, C, D>(p, b, c, mask);
  }
}

// Launches one variant for one head_dim (the .cu per head_dim instantiates act x cache).
template <int D>
void launch_fused_d(const AttnPrepParams& p, bool prefill, cudaStream_t stream) {
  constexpr int G = D / 8;
  const int H = p.Hq + 2 * p.Hkv;
  auto pick = [&](auto act_tag, auto cache_tag) {
    constexpr ActKind A = decltype(act_tag)::value;
    constexpr CacheKind C = decltype(cache_tag)::value;
    if (prefill) {
      // Resident blocks on this device: the grid of the grid-stride loop (thread-safe static init).
      static const int max_blocks = [] {
        int dev = 0, sms = 0, per_sm = 0;
        KILN_CUDA_CHECK(cudaGetDevice(&dev));
        KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, attn_prep_prefill_kernel<A, C, D>, 256, 0));
        return sms * (per_sm > 0 ? per_sm : 1);
      }();
      const int64_t need = (int64_t(p.T) * H * G + 255) / 256;
      const int blocks = int(need < max_blocks ? need : max_blocks);
      launch(LaunchCfg{dim3(blocks), dim3(256), 0, stream}, attn_prep_prefill_kernel<A, C, D>, p);
    } else {
      const int gx = (H + 128 / G - 1) / (128 / G);
      launch(LaunchCfg{dim3(gx, p.T), dim3(128), 0, stream}, attn_prep_decode_kernel<A, C, D>, p);
    }
  };
  auto with_cache = [&](auto act_tag) {
    switch (p.cache) {
      case CacheKind::bf16:
        return pick(act_tag, std::integral_constant<CacheKind, CacheKind::bf16>{});
      case CacheKind::f16:
        return pick(act_tag, std::integral_constant<CacheKind, CacheKind::f16>{});
      case CacheKind::fp8:
        return pick(act_tag, std::integral_constant<CacheKind, CacheKind::fp8>{});
    }
  };
  if (p.act == ActKind::bf16) {
    with_cache(std::integral_constant<ActKind, ActKind::bf16>{});
  } else {
    with_cache(std::integral_constant<ActKind, ActKind::f16>{});
  }
}

}  // namespace kiln::cuda::attn
