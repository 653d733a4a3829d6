// The decode QKV projection fused with the attention preparation: one launch computes
//   qkv[m, :] = bf16(x[m, :] · W_qkv^T)                  (gemv.h, bf16 epilogue, the given config)
// and then ops/attn_prep.h on those rows (per-head Q/K RMSNorm, RoPE or M-RoPE, Q in place or into q_out,
// K and V into the paged cache, slot < 0 skipped), bitwise equal to gemv (same config) followed by any
// attn_prep kernel: qkv, Q, the cache pages and the UE8M0 scales hold the same bytes, and bytes that path
// leaves alone are left alone here too.
//
// Shapes and dtypes: x bf16 [m, k] (row stride ldx), W bf16 or block-FP8 [(Hq + 2 Hkv) D, k] (gemv.h:
// GemvWeight; FP8: bitwise this op on dequantize_fp8's bf16 W, as every GEMV form), the
// AttnPrepParams p as ops/attn_prep.cpp builds them for the qkv rows (p.T == m, p.qkv_row the qkv row
// stride). Covered: 1 <= m <= 8, bf16 activations, a bf16 or fp8 (E4M3 + UE8M0) cache in any layout (the
// strides of p) and page size, head_dim 64 or 128, rotary_dim % 16 == 0, at most kGemvAttnPrepMaxHeads heads,
// and what gemv and the fused attn_prep kernels need (gemv_attn_prep_supported). Everything else: the caller
// runs the two ops (ops::linear_attn_prep in ops/linear.cpp does).
//
// How (gemv_attn_prep_kernel.cuh): the GEMV kernels of gemv_kernels.cuh with a tail. A block owns R = 4 (FMA)
// or 8 (tensor-core) rows of W, so all of them belong to one head h = first row / D, and D / R blocks make a
// head. Each block stores its bf16 outputs into qkv as the plain GEMV does, then counts itself done on the
// head's counter (release fence, atomicAdd). The block that completes the head resets the counter and runs
// attn_prep for head h of every token on the rows just written (read back through L2): the fused decode
// kernel's own device code (attn_prep_fused.cuh: load_token, process_qk, store_v), groups of D / 8 lanes
// per token. The counters (one __device__ word per head, per device) are reset by the block that completes
// each head, so every launch (a graph replay too) starts from 0; they are touched only after the PDL wait,
// so launches on one stream never overlap on them. Not for two launches in flight at once on two streams of
// one device (as gemv_add_rms_norm). PDL: as gemv.
#pragma once

#include <cstdint>

#include "ops/cuda/attn_prep_params.h"
#include "ops/cuda/gemv.h"

namespace kiln::cuda {

constexpr int kGemvAttnPrepMaxHeads = 512;

// True when gemv_attn_prep covers this call (see above); alignment of every pointer included.
bool gemv_attn_prep_supported(int64_t m, int64_t k, const void* x, int64_t ldx, const GemvWeight& w,
                              const AttnPrepParams& p);
inline bool gemv_attn_prep_supported(int64_t m, int64_t k, const void* x, int64_t ldx, const void* w,
                                     int64_t ldw, const AttnPrepParams& p) {
  return gemv_attn_prep_supported(m, k, x, ldx, GemvWeight{w, ldw, nullptr}, p);
}

// Runs the fused kernel; throws kiln::Error before launching anything when gemv_attn_prep_supported fails
// or the config is not a one-tile config of kGemvConfigs (gemv.h: gemv_fusable). m == 0 is a no-op.
// tc_min_blocks: the tensor-core kernel's register cap (gemv.h: gemv_tail_min_blocks), 0 or 3; -1 takes the
// process default.
void gemv_attn_prep(const void* x, int64_t ldx, const GemvWeight& w, int64_t m, int64_t k,
                    const AttnPrepParams& p, GemvConfig cfg, cudaStream_t stream, bool pdl = false,
                    int tc_min_blocks = -1);
inline void gemv_attn_prep(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m, int64_t k,
                           const AttnPrepParams& p, GemvConfig cfg, cudaStream_t stream, bool pdl = false,
                           int tc_min_blocks = -1) {
  gemv_attn_prep(x, ldx, GemvWeight{w, ldw, nullptr}, m, k, p, cfg, stream, pdl, tc_min_blocks);
}

}  // namespace kiln::cuda
