// attn_prep of one head for the first M tokens of qkv rows that other blocks of the same launch stored: the
// tail of the fused QKV GEMV (gemv_attn_prep_kernel.cuh) calls it (as did the persistent decode chain,
// `5a145b0`: docs/PERF.md "Tried, measured, not kept"), so it writes attn_prep_decode_kernel's bytes.
//
// Mapping: the caller's `threads` threads form groups of G = D / 8 consecutive lanes; group j takes tokens
// j, j + groups, ... (< M); lane c of a group owns elements [8c, 8c + 8) of the head, exactly as a group of
// attn_prep_decode_kernel does for (token, head), and runs the same device functions on the same 16 bytes.
#pragma once

#include "ops/cuda/attn_prep_fused.cuh"

namespace kiln::cuda::attn {

template <int M, int D, CacheKind C>
__device__ __forceinline__ void prep_head(const AttnPrepParams& a, int h, int threads, int tid) {
  constexpr int G = D / 8;
  const int c = tid % G, groups = threads / G;
  const unsigned mask = group_mask<D>();
  const bool qk = h < a.Hq + a.Hkv;
  uint4 wb = make_uint4(0, 0, 0, 0);
  if (qk)
    wb = __ldg(
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(h < a.Hq ? a.q_norm : a.k_norm) + 8 * c));
  for (int t = tid / G; t < M; t += groups) {  // whole groups take the same tokens (shuffles stay inside)
    // Written by other blocks of this launch: read through L2 (.cg), never the read-only path.
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.qkv) +
                                                            int64_t(t) * a.qkv_row + int64_t(h) * D + 8 * c));
    TokenCtx k;
    load_token<D>(a, t, c, qk, k);
    if (qk) {
      process_qk<ActKind::bf16, C, D>(a, t, h, c, mask, raw, wb, k);
    } else {
      store_v<ActKind::bf16, C>(a, h - a.Hq - a.Hkv, c, mask, raw, k);
    }
  }
}

}  // namespace kiln::cuda::attn
