// The expert kernels behind moe_experts_launch (moe.h step 4), one unit each, and the parameters they all
// take: internal to src/ops/cuda.
#pragma once

#include "ops/cuda/moe.h"

namespace kiln::cuda {

// One of step 4's two products: gate_up with SiLU-and-multiply (out = act, N = I, K = H, 2N weight rows an
// expert) or down (out = y, N = H, K = I).
struct MoeProductParams {
  const uint16_t* a;  // gate_up: x bf16 [T, K] row stride as, read at the token of a sorted row's pair;
                      // down: act bf16 [max_rows, K] row stride as, read at the sorted row
  int64_t as;
  const uint16_t* w;           // bf16 [L, N_w, K] contiguous (L = MoeShape::local_experts())
  const uint8_t* w8;           // block-FP8: e4m3 [L, N_w, K] contiguous (w unused)
  const float* ws;             // block-FP8: f32 [L, N_w / 128, skb] scales; nullptr: bf16 weights
  int skb;                     // ceil(K / 128)
  uint16_t* out;               // bf16 [max_rows, N] contiguous
  const int32_t* sorted_pair;  // i32 [max_rows]
  const int32_t* tile_expert;  // i32 [max_tiles]  (the grouped GEMMs)
  const int32_t* num_tiles;    // i32 [1]
  const int32_t* offsets;      // i32 [E + 1]      (the gather GEMV)
  const int32_t* counts;       // i32 [E]
  const int32_t* active;       // i32 [E + 1]
  int E, N, K, k;              // k: top_k
  int expert_begin;            // router expert e's weights are w[e - expert_begin] (MoeShape; 0 but on EP)
};
MoeProductParams moe_gate_up_params(const uint16_t* x, int64_t xs, const uint16_t* gate_up, const MoeShape& s,
                                    const MoeBuffers& b);
MoeProductParams moe_down_params(const uint16_t* down, const MoeShape& s, const MoeBuffers& b);
// Points p at block-FP8 weights w8 (e4m3) with their scales.
void moe_set_fp8(MoeProductParams& p, const void* w8, const float* scales);

#ifdef __CUDACC__
// The A row of sorted row `row`: for gate_up (kSilu) its pair's token row of x, nullptr on a padding row
// (pair -1); for down its act row.
template <bool kSilu>
__device__ __forceinline__ const uint16_t* moe_a_row(const MoeProductParams& p, int row) {
  if constexpr (kSilu) {
    const int pair = p.sorted_pair[row];
    return pair >= 0 ? p.a + int64_t(pair / p.k) * p.as : nullptr;
  } else {
    return p.a + int64_t(row) * p.as;
  }
}
#endif

void moe_grouped_gemm_launch(const MoeShape& s, const MoeProductParams& gate_up, const MoeProductParams& down,
                             cudaStream_t stream);
// sm_90a wgmma; only where moe_grouped_gemm_sm90_applies() (an sm_90 device running the build's sm_90a code).
void moe_grouped_gemm_sm90_launch(const MoeShape& s, const MoeProductParams& gate_up,
                                  const MoeProductParams& down, cudaStream_t stream);
// Block-FP8 experts, W8A8 (moe_grouped_gemm_fp8_sm90.cu): only where moe_grouped_gemm_fp8_sm90_applies(),
// with s.fp8_w8a8 (b.act_q, b.act_qs carved); gate_up and down with moe_set_fp8 applied, H and I multiples
// of 128. Four launches: the gate_up inputs quantized, its GEMM into act, act quantized, the down GEMM into
// y.
void moe_grouped_gemm_fp8_sm90_launch(const MoeShape& s, const MoeProductParams& gate_up,
                                      const MoeProductParams& down, const MoeBuffers& b, cudaStream_t stream);
// The gather GEMV and the fused down + combine issue the weight loads of 2 chunks a row before their first
// product (depths 4 and 8 gave the same bits and were slower at every T on the H100: docs/PERF.md "Mixture
// of experts", E4; removed after `776f1f6`, as was the GEMV's 2 column pairs a warp, slower from T = 8).
// down nullptr: the gate_up GEMV alone (moe_down_combine_launch then does down and the combine).
void moe_gather_gemv_launch(const MoeShape& s, const MoeProductParams& gate_up, const MoeProductParams* down,
                            cudaStream_t stream);
inline void moe_gather_gemv_launch(const MoeShape& s, const MoeProductParams& gate_up,
                                   const MoeProductParams& down, cudaStream_t stream) {
  moe_gather_gemv_launch(s, gate_up, &down, stream);
}
// Steps 4 (down) and 5 in one kernel (moe_down_combine.cu): y as the gather GEMV leaves it and out bf16
// [T, H] row stride os bitwise moe_combine_launch's, for any T (a block a token and 4 columns).
void moe_down_combine_launch(const MoeShape& s, const MoeProductParams& down, const MoeBuffers& b,
                             uint16_t* out, int64_t os, cudaStream_t stream);

}  // namespace kiln::cuda
