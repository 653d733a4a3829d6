// Fused attention preparation (ops/attn_prep.h): RMSNorm + RoPE/M-RoPE of Q and K, Q out, K and V into the
// paged cache, one launch. Included by one .cu per head_dim (attn_prep_fused_d{64,128,256}.cu).
//
// Mapping (all three kernels): a "group" of G = D / 8 consecutive lanes owns one (token, head); lane c of
// the group owns elements [8c, 8c + 8) and moves them with one 16-byte load / store. The group's lanes are
// the canonical reduction's lanes 0..G-1 (lanes G..31 of the contract hold +0, so their butterfly steps are
// exact no-ops): the sum of squares is a butterfly G/2 .. 1 inside the group. The NeoX partner chunk of
// lane c < R/16 is lane c + R/16 (and back), exchanged as packed act bits with 4 shuffles. The 64-element
// FP8 blocks are 8 consecutive lanes (max by xor 4, 2, 1). Heads: [0, Hq) Q, [Hq, Hq + Hkv) K,
// [Hq + Hkv, Hq + 2*Hkv) V (V is only converted into the cache). All shuffles use the group's lane mask,
// so groups of one warp may branch independently. Per token, a lane needs one slot and 8 cos + 8 sin
// values (its chunk's angles), shared by every head of the token (TokenCtx).
//   decode (small batch, T <= 128): grid (ceil(H / groups per block), T), block 128, one head per group:
//     every load is issued at the start (latency: qkv, slot, position -> cos/sin).
//   prefill (bandwidth, T > 1024): grid min(T, resident blocks), block 256; a block walks tokens, its
//     groups walk the token's heads (U = 4 at a time, all four 16-byte loads in flight) and prefetch the
//     next token's rows into L2. Norm weights are loaded once per thread, cos/sin once per token.
//   streaming (129..1024 tokens, H <= 4 * groups per block, e.g. 32/8 at D128): the same token loop as a
//     4-stage cp.async pipeline in shared memory: while token i is processed, tokens i+1..i+3 (qkv chunks,
//     cos/sin, slot) are in flight. qkv chunks are per thread; group 0 stages the token's cos/sin and
//     thread 0 its slot for the whole block, published by one __syncthreads per token. Two Q heads of a
//     group are processed together (process_q2) for instruction-level parallelism.
// Every kernel waits for the previous kernel (griddepcontrol.wait) before its first load when launched with
// PDL, and is a plain launch otherwise.
#pragma once

#include "ops/cuda/attn_prep_common.cuh"
#include "ops/cuda/common.cuh"

namespace kiln::cuda::attn {

struct TokenCtx {
  int64_t off = -1;  // cache element offset of (slot, kv head 0, chunk c); -1: the token is not written
  int64_t soff = 0;  // scale byte offset of (slot, kv head 0, block c / 8)
  float cs[8], sn[8];
};

// Loads what chunk c of token t needs: the slot's cache offsets, and (rope) the cos/sin of its angles.
template <int D>
__device__ __forceinline__ void load_token(const AttnPrepParams& p, int t, int c, bool rope, TokenCtx& k) {
  const int64_t slot = load_slot(p, t);
  if (slot >= 0) {  // num_slots < 2^31 (fused guard): 32-bit division
    const uint32_t page = uint32_t(slot) / uint32_t(p.page_size),
                   row = uint32_t(slot) - page * uint32_t(p.page_size);
    k.off = int64_t(page) * p.c_page + int64_t(row) * p.c_row + 8 * c;
    k.soff = int64_t(page) * p.s_page + int64_t(row) * p.s_row + c / 8;
  }
  const int half_lanes = p.rotary_dim / 16;
  if (!rope || c >= 2 * half_lanes) return;
  const int R = p.rotary_dim, hr = R / 2;
  const int i0 = c < half_lanes ? 8 * c : 8 * c - hr;  // angle index of element j: i0 + j
  if (p.mrope == MRopeMode::none) {
    const float* row = p.rope + load_position(p, 0, t) * R + i0;
    const float4 c0 = __ldg(reinterpret_cast<const float4*>(row));
    const float4 c1 = __ldg(reinterpret_cast<const float4*>(row + 4));
    const float4 s0 = __ldg(reinterpret_cast<const float4*>(row + hr));
    const float4 s1 = __ldg(reinterpret_cast<const float4*>(row + hr + 4));
    k.cs[0] = c0.x, k.cs[1] = c0.y, k.cs[2] = c0.z, k.cs[3] = c0.w;
    k.cs[4] = c1.x, k.cs[5] = c1.y, k.cs[6] = c1.z, k.cs[7] = c1.w;
    k.sn[0] = s0.x, k.sn[1] = s0.y, k.sn[2] = s0.z, k.sn[3] = s0.w;
    k.sn[4] = s1.x, k.sn[5] = s1.y, k.sn[6] = s1.z, k.sn[7] = s1.w;
  } else {
    const int64_t p0 = load_position(p, 0, t), p1 = load_position(p, 1, t), p2 = load_position(p, 2, t);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int ax = mrope_axis(p, i0 + j);
      const float* row = p.rope + (ax == 0 ? p0 : ax == 1 ? p1 : p2) * R + i0 + j;
      k.cs[j] = __ldg(row);
      k.sn[j] = __ldg(row + hr);
    }
  }
}

// Q or K head h (< Hq + Hkv) of token t: norm, rope, store. wb: this chunk's 8 norm weights (act bits).
template <ActKind A, CacheKind C, int D>
__device__ __forceinline__ void process_qk(const AttnPrepParams& p, int t, int h, int c, unsigned mask,
                                           const uint4& raw, const uint4& wb, const TokenCtx& k) {
  constexpr int G = D / 8;
  const bool is_q = h < p.Hq;
  if (!is_q && k.off < 0) return;  // K not stored: nothing of this head is visible
  // 1. RMSNorm, canonical order. ss / D == ss * (1 / D) exactly: D is a power of two.
  float x[8], w[8];
  unpack8<A>(raw, x);
  unpack8<A>(wb, w);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) ss = __fmaf_rn(x[j], x[j], ss);
#pragma unroll
  for (int o = G / 2; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(mask, ss, o, G));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fmul_rn(ss, 1.0f / D), p.eps)));
  float n[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) n[j] = __fmul_rn(x[j], r);
  unpack8<A>(round_pack8<A>(n), n);
#pragma unroll
  for (int j = 0; j < 8; ++j) n[j] = __fmul_rn(n[j], w[j]);
  const uint4 ybits = round_pack8<A>(n);
  // 2. RoPE (NeoX halves are lane chunks c and c +- R/16).
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
    float y[8], yp[8], o[8];
    unpack8<A>(ybits, y);
    unpack8<A>(pbits, yp);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float ps = __fmul_rn(yp[j], k.sn[j]);
      o[j] = __fmaf_rn(y[j], k.cs[j], first ? -ps : ps);
    }
    out = round_pack8<A>(o);
  }
  // 3. Outputs.
  if (is_q) {
    uint16_t* dst = static_cast<uint16_t*>(p.q_dst) + int64_t(t) * p.q_row + int64_t(h) * p.q_head + 8 * c;
    *reinterpret_cast<uint4*>(dst) = out;
  } else {
    const int kvh = h - p.Hq;
    store_cache_chunk<A, C>(p.k_cache, p.k_scale, k.off + int64_t(kvh) * p.c_head,
                            k.soff + int64_t(kvh) * p.s_head, c, out, mask);
  }
}

// Two Q heads ha, hb of token t at once: process_qk's arithmetic, step for step, on two independent heads
// so their dependency chains (fma chain, butterfly, sqrt and division, shuffles) interleave.
template <ActKind A, int D>
__device__ __forceinline__ void process_q2(const AttnPrepParams& p, int t, int ha, int hb, int c,
                                           unsigned mask, const uint4& ra, const uint4& rb, const uint4& wb,
                                           const TokenCtx& k) {
  constexpr int G = D / 8;
  float x[2][8], w[8], ss[2] = {0.f, 0.f}, r[2];
  unpack8<A>(ra, x[0]);
  unpack8<A>(rb, x[1]);
  unpack8<A>(wb, w);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    ss[0] = __fmaf_rn(x[0][j], x[0][j], ss[0]);
    ss[1] = __fmaf_rn(x[1][j], x[1][j], ss[1]);
  }
#pragma unroll
  for (int o = G / 2; o >= 1; o /= 2) {
    const float s0 = __shfl_xor_sync(mask, ss[0], o, G), s1 = __shfl_xor_sync(mask, ss[1], o, G);
    ss[0] = __fadd_rn(ss[0], s0);
    ss[1] = __fadd_rn(ss[1], s1);
  }
#pragma unroll
  for (int e = 0; e < 2; ++e)
    r[e] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fmul_rn(ss[e], 1.0f / D), p.eps)));
  uint4 ybits[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float n[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) n[j] = __fmul_rn(x[e][j], r[e]);
    unpack8<A>(round_pack8<A>(n), n);
#pragma unroll
    for (int j = 0; j < 8; ++j) n[j] = __fmul_rn(n[j], w[j]);
    ybits[e] = round_pack8<A>(n);
  }
  const int half_lanes = p.rotary_dim / 16;
  const int partner = c < half_lanes ? c + half_lanes : (c < 2 * half_lanes ? c - half_lanes : c);
  uint4 pbits[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    pbits[e].x = __shfl_sync(mask, ybits[e].x, partner, G);
    pbits[e].y = __shfl_sync(mask, ybits[e].y, partner, G);
    pbits[e].z = __shfl_sync(mask, ybits[e].z, partner, G);
    pbits[e].w = __shfl_sync(mask, ybits[e].w, partner, G);
  }
  uint4 out[2] = {ybits[0], ybits[1]};
  if (c < 2 * half_lanes) {
    const bool first = c < half_lanes;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float y[8], yp[8], o[8];
      unpack8<A>(ybits[e], y);
      unpack8<A>(pbits[e], yp);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float ps = __fmul_rn(yp[j], k.sn[j]);
        o[j] = __fmaf_rn(y[j], k.cs[j], first ? -ps : ps);
      }
      out[e] = round_pack8<A>(o);
    }
  }
  uint16_t* base = static_cast<uint16_t*>(p.q_dst) + int64_t(t) * p.q_row + 8 * c;
  *reinterpret_cast<uint4*>(base + int64_t(ha) * p.q_head) = out[0];
  *reinterpret_cast<uint4*>(base + int64_t(hb) * p.q_head) = out[1];
}

template <ActKind A, CacheKind C>
__device__ __forceinline__ void store_v(const AttnPrepParams& p, int kvh, int c, unsigned mask,
                                        const uint4& raw, const TokenCtx& k) {
  if (k.off < 0) return;
  store_cache_chunk<A, C>(p.v_cache, p.v_scale, k.off + int64_t(kvh) * p.c_head,
                          k.soff + int64_t(kvh) * p.s_head, c, raw, mask);
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

template <int D>
__device__ __forceinline__ uint4 load_chunk(const AttnPrepParams& p, int t, int h, int c) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.qkv) + int64_t(t) * p.qkv_row +
                                              int64_t(h) * D + 8 * c));
}

template <ActKind A, CacheKind C, int D>
__global__ void __launch_bounds__(128) attn_prep_decode_kernel(const __grid_constant__ AttnPrepParams p) {
  constexpr int G = D / 8, kGroups = 128 / G;
  const int h = blockIdx.x * kGroups + threadIdx.x / G;
  pdl_wait();
  pdl_launch_dependents();
  if (h >= p.Hq + 2 * p.Hkv) return;  // whole groups leave together
  const int c = threadIdx.x % G, t = blockIdx.y;
  const unsigned mask = group_mask<D>();
  const uint4 raw = load_chunk<D>(p, t, h, c);
  const bool qk = h < p.Hq + p.Hkv;
  TokenCtx k;
  load_token<D>(p, t, c, qk, k);
  if (qk) {
    const uint4 wb = __ldg(
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(h < p.Hq ? p.q_norm : p.k_norm) + 8 * c));
    process_qk<A, C, D>(p, t, h, c, mask, raw, wb, k);
  } else {
    store_v<A, C>(p, h - p.Hq - p.Hkv, c, mask, raw, k);
  }
}

template <ActKind A, CacheKind C, int D>
__global__ void __launch_bounds__(256, 3) attn_prep_prefill_kernel(const __grid_constant__ AttnPrepParams p) {
  constexpr int G = D / 8, kGroups = 256 / G, U = 4;
  const int c = threadIdx.x % G, grp = threadIdx.x / G;
  const unsigned mask = group_mask<D>();
  const int H = p.Hq + 2 * p.Hkv, HQK = p.Hq + p.Hkv;
  pdl_wait();
  pdl_launch_dependents();
  const uint4 qwb = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q_norm) + 8 * c));
  const uint4 kwb = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.k_norm) + 8 * c));
  for (int t = blockIdx.x; t < p.T; t += gridDim.x) {
    if (const int tn = t + gridDim.x;
        tn < p.T) {  // the next token's rows into L2 while this one is processed
      const uint16_t* nrow = static_cast<const uint16_t*>(p.qkv) + int64_t(tn) * p.qkv_row + 8 * c;
      for (int h = grp; h < H; h += kGroups)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(nrow + int64_t(h) * D));
    }
    TokenCtx k;
    load_token<D>(p, t, c, true, k);
    for (int h0 = grp; h0 < H; h0 += kGroups * U) {
      uint4 raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int h = h0 + u * kGroups;
        if (h < H) raw[u] = load_chunk<D>(p, t, h, c);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int h = h0 + u * kGroups;
        if (h >= H) break;
        if (h < HQK) {
          process_qk<A, C, D>(p, t, h, c, mask, raw[u], h < p.Hq ? qwb : kwb, k);
        } else {
          store_v<A, C>(p, h - HQK, c, mask, raw[u], k);
        }
      }
    }
  }
}

constexpr int kStreamU = 4;       // heads per group per token in the streaming kernel (even: pairs)
constexpr int kStreamStages = 4;  // tokens in flight per block: the one processed + 3 loading
// Shared memory: [stages][U][256 threads] qkv chunks, [stages][4][G] cos/sin float4s, [stages] slots.
template <int D>
constexpr size_t stream_smem_bytes() {
  return size_t(kStreamStages) * (kStreamU * 256 * 16 + (D / 8) * 4 * 16 + 16);
}

template <ActKind A, CacheKind C, int D>
__global__ void __launch_bounds__(256, 2) attn_prep_stream_kernel(const __grid_constant__ AttnPrepParams p) {
  constexpr int G = D / 8, kGroups = 256 / G, U = kStreamU, S = kStreamStages;
  extern __shared__ uint4 smem[];
  uint4* qkv_s = smem;                                                   // [S][U][256]
  float4* rope_s = reinterpret_cast<float4*>(smem + S * U * 256);        // [S][4][G]: c0 c1 s0 s1 of chunk c
  long long* slot_s = reinterpret_cast<long long*>(rope_s + S * 4 * G);  // [S]
  const int tid = threadIdx.x, c = tid % G, grp = tid / G;
  const unsigned mask = group_mask<D>();
  const int H = p.Hq + 2 * p.Hkv, HQK = p.Hq + p.Hkv;
  const int R = p.rotary_dim, hr = R / 2, half_lanes = R / 16;
  const bool rope_lane = c < 2 * half_lanes;
  const bool stager =
      grp == 0;  // group 0 stages each token's cos/sin (shared by all groups), thread 0 its slot
  const int i0 = c < half_lanes ? 8 * c : 8 * c - hr;
  // Issues token t into `stage`: own qkv chunks; (stager) cos/sin at positions q0..q2; (thread 0) the slot.
  auto issue = [&](int t, int stage, int64_t q0, int64_t q1, int64_t q2) {
    const uint16_t* row = static_cast<const uint16_t*>(p.qkv) + int64_t(t) * p.qkv_row + 8 * c;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int h = grp + u * kGroups;
      if (h < H) cp_async16(&qkv_s[(stage * U + u) * 256 + tid], row + int64_t(h) * D);
    }
    if (tid == 0) cp_async8(&slot_s[stage], p.slots + int64_t(t) * p.slot_stride);
    if (!stager || !rope_lane) return;
    float4* dst = &rope_s[stage * 4 * G + c];
    if (p.mrope == MRopeMode::none) {
      const float* r = p.rope + q0 * R + i0;
      cp_async16(dst, r);
      cp_async16(dst + G, r + 4);
      cp_async16(dst + 2 * G, r + hr);
      cp_async16(dst + 3 * G, r + hr + 4);
    } else {
      for (int j = 0; j < 8; ++j) {
        const int ax = mrope_axis(p, i0 + j);
        const float* r = p.rope + (ax == 0 ? q0 : ax == 1 ? q1 : q2) * R + i0 + j;
        cp_async4(reinterpret_cast<float*>(dst + (j / 4) * G) + j % 4, r);
        cp_async4(reinterpret_cast<float*>(dst + (2 + j / 4) * G) + j % 4, r + hr);
      }
    }
  };
  int64_t n0 = 0, n1 = 0, n2 = 0;  // (stager) positions of the next token to issue
  auto load_pos = [&](int t) {
    if (!stager || t >= p.T) return;
    n0 = load_position(p, 0, t);
    if (p.mrope != MRopeMode::none) {
      n1 = load_position(p, 1, t);
      n2 = load_position(p, 2, t);
    }
  };
  pdl_wait();
  pdl_launch_dependents();
  const int stride = gridDim.x;
  const uint4 qwb = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q_norm) + 8 * c));
  const uint4 kwb = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.k_norm) + 8 * c));
  // Prologue: tokens 0 .. S-2 of this block (one commit group each, possibly empty).
#pragma unroll
  for (int j = 0; j < S - 1; ++j) {
    const int t = blockIdx.x + j * stride;
    load_pos(t);
    if (t < p.T) issue(t, j, n0, n1, n2);
    cp_async_commit();
  }
  load_pos(blockIdx.x + (S - 1) * stride);
  int stage = 0;
  for (int t = blockIdx.x; t < p.T; t += stride) {  // uniform trip count in the block (barrier inside)
    cp_async_wait<S - 2>();                         // this thread's copies for token t have landed
    __syncthreads();  // ... and everyone's (cos/sin, slot); stage (stage - 1) is no longer read
    const int tf = t + (S - 1) * stride;
    const int fstage = stage == 0 ? S - 1 : stage - 1;
    if (tf < p.T) issue(tf, fstage, n0, n1, n2);
    cp_async_commit();
    load_pos(tf + stride);
    TokenCtx k;
    const int64_t slot = slot_s[stage];
    if (slot >= 0 && slot < p.num_slots) {
      const uint32_t page = uint32_t(slot) / uint32_t(p.page_size);
      const uint32_t row = uint32_t(slot) - page * uint32_t(p.page_size);
      k.off = int64_t(page) * p.c_page + int64_t(row) * p.c_row + 8 * c;
      k.soff = int64_t(page) * p.s_page + int64_t(row) * p.s_row + c / 8;
    }
    if (rope_lane) {
      const float4* src = &rope_s[stage * 4 * G + c];
      const float4 c0 = src[0], c1 = src[G], s0 = src[2 * G], s1 = src[3 * G];
      k.cs[0] = c0.x, k.cs[1] = c0.y, k.cs[2] = c0.z, k.cs[3] = c0.w;
      k.cs[4] = c1.x, k.cs[5] = c1.y, k.cs[6] = c1.z, k.cs[7] = c1.w;
      k.sn[0] = s0.x, k.sn[1] = s0.y, k.sn[2] = s0.z, k.sn[3] = s0.w;
      k.sn[4] = s1.x, k.sn[5] = s1.y, k.sn[6] = s1.z, k.sn[7] = s1.w;
    }
    // Heads in pairs (u, u + 1): two Q heads go through process_q2 together (ILP), others one by one.
    const uint4* rs = &qkv_s[stage * U * 256 + tid];
#pragma unroll
    for (int u = 0; u < U; u += 2) {
      const int ha = grp + u * kGroups, hb = ha + kGroups;
      if (ha >= H) break;
      if (hb < p.Hq) {
        process_q2<A, D>(p, t, ha, hb, c, mask, rs[u * 256], rs[(u + 1) * 256], qwb, k);
        continue;
      }
      if (ha < HQK) {
        process_qk<A, C, D>(p, t, ha, c, mask, rs[u * 256], ha < p.Hq ? qwb : kwb, k);
      } else {
        store_v<A, C>(p, ha - HQK, c, mask, rs[u * 256], k);
      }
      if (hb >= H) break;
      if (hb < HQK) {
        process_qk<A, C, D>(p, t, hb, c, mask, rs[(u + 1) * 256], hb < p.Hq ? qwb : kwb, k);
      } else {
        store_v<A, C>(p, hb - HQK, c, mask, rs[(u + 1) * 256], k);
      }
    }
    stage = stage == S - 1 ? 0 : stage + 1;
  }
}

// Launches one variant for one head_dim (the .cu per head_dim instantiates act x cache).
template <int D>
void launch_fused_d(const AttnPrepParams& p, FusedKernel k, cudaStream_t stream) {
  constexpr int G = D / 8;
  const int H = p.Hq + 2 * p.Hkv;
  auto pick = [&](auto act_tag, auto cache_tag) {
    constexpr ActKind A = decltype(act_tag)::value;
    constexpr CacheKind C = decltype(cache_tag)::value;
    if (k == FusedKernel::streaming) {
      constexpr size_t smem = stream_smem_bytes<D>();
      // Resident blocks on this device: the grid of the token loop (thread-safe static init, which also
      // raises the kernel's shared-memory limit once, outside any graph capture that follows).
      static const int max_blocks = [] {
        int dev = 0, sms = 0, per_sm = 0;
        KILN_CUDA_CHECK(cudaGetDevice(&dev));
        KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        KILN_CUDA_CHECK(cudaFuncSetAttribute(attn_prep_stream_kernel<A, C, D>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, attn_prep_stream_kernel<A, C, D>, 256, smem));
        return sms * (per_sm > 0 ? per_sm : 1);
      }();
      const int blocks = p.T < max_blocks ? p.T : max_blocks;
      launch(LaunchCfg{dim3(blocks), dim3(256), smem, stream, p.pdl, /*smem_attr_set=*/true},
             attn_prep_stream_kernel<A, C, D>, p);
    } else if (k == FusedKernel::prefill) {
      static const int max_blocks = [] {
        int dev = 0, sms = 0, per_sm = 0;
        KILN_CUDA_CHECK(cudaGetDevice(&dev));
        KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, attn_prep_prefill_kernel<A, C, D>, 256, 0));
        return sms * (per_sm > 0 ? per_sm : 1);
      }();
      const int blocks = p.T < max_blocks ? p.T : max_blocks;
      launch(LaunchCfg{dim3(blocks), dim3(256), 0, stream, p.pdl}, attn_prep_prefill_kernel<A, C, D>, p);
    } else {
      const int gx = (H + 128 / G - 1) / (128 / G);
      launch(LaunchCfg{dim3(gx, p.T), dim3(128), 0, stream, p.pdl}, attn_prep_decode_kernel<A, C, D>, p);
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
