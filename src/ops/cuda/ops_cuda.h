// Tensor-level CUDA entry points the op dispatchers (src/ops/*.cpp) call from their CUDA branches. The
// dispatchers have validated shapes, dtypes and devices; these map the views onto the raw kernels
// (elementwise.h, gemm.h, attention.h) on kiln::cuda::current_stream(). Contracts: the ops/*.h headers.
#pragma once

#include "kiln/tensor.h"
#include "ops/attention.h"
#include "ops/cuda/attn_prep_params.h"
#include "ops/fp8_linear.h"
#include "ops/stream.h"

namespace kiln::ops::cuda {

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out);
void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out);
void topk_rows(const Tensor& logits, const Tensor& offsets, int k, const Tensor& tokens,
               const Tensor& logprobs);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out);
void silu_and_mul(const Tensor& gate_up, const Tensor& out);
// The projections below take a bf16 or a block-FP8 weight (ops/fp8_linear.h: LinearWeight). FP8: the FP8
// GEMV and its fused forms where the tuner chose it for the shape with an FP8 weight (gemm.h: GemmWeight),
// bitwise the bf16 forms on the dequantized weight; else GemmEngine::run's FP8 path (dequantize into scratch,
// then the bf16 dispatch).
void linear(const Tensor& x, const LinearWeight& weight, const Tensor& out);
// GemmEngine::set_tactic_rows of the current device (ops/linear.h: LinearTacticRows); returns the previous.
int64_t set_linear_tactic_rows(int64_t rows);
// The gate_up GEMM with SiLU-and-multiply: the fused GEMV (gemv.h) when the tuner chose the GEMV for
// [M, 2I, K] (M <= 8), else the GEMM into gate_up followed by the silu_mul kernel.
void linear_silu_mul(const Tensor& x, const LinearWeight& weight, const Tensor& gate_up, const Tensor& out);
// The O / down projection with the residual add and the next RMSNorm: the GEMV with the add + RMSNorm
// epilogue (gemv.h) when the tuner chose the GEMV for [M, N, K] (M <= 8), else the GEMM into tmp followed by
// the rms_norm kernel (add).
void linear_add_rms_norm(const Tensor& x, const LinearWeight& weight, const Tensor& residual,
                         const Tensor& norm_weight, float eps, const Tensor& tmp, const Tensor& normed);
// The QKV projection fused with the attention preparation (gemv_attn_prep.h) for the prep params p of the
// qkv rows: launches it and returns true when the engine's fusion switch is on, the tuner chose the GEMV for
// [M, N, K] and the fused guards hold; else launches nothing and returns false (the caller runs linear, then
// attn_prep). On `stream` (a cudaStream_t), as attn_prep's args.stream.
bool linear_attn_prep(const Tensor& x, const LinearWeight& weight, const ::kiln::cuda::AttnPrepParams& p,
                      void* stream);
// The cheap half of that decision (the switch and the tuner's choice for [m, n, k] with that weight
// format), asked before the params are built.
bool linear_attn_prep_chosen(int64_t m, int64_t n, int64_t k, bool fp8_weight);
// A projection whose input is rms_norm(residual + delta) (ops/linear.h: ResidualNorm), as one launch: the
// GEMV with the residual-norm prologue (gemv.h: gemv_norm_in; residual rewritten, nothing else but out) into
// out, with the silu_mul epilogue when silu (out is then act [M, N / 2]). Launches it and returns true when
// the engine's switch is on, the tuner chose the GEMV for [M, N, K] and the kernel's guards hold; else
// launches nothing and returns false (the caller runs add_rms_norm, then the projection).
bool linear_norm_in(const Tensor& delta, const Tensor& residual, const Tensor& norm_weight, float eps,
                    const LinearWeight& weight, const Tensor& out, bool silu);
// Fused W8A8 activation quantization (fp8_act_producers.h; GemmEngine::fp8_gemm_takes: a block-FP8 weight,
// M > 8, the W8A8 GEMM's tactic, KILN_FP8_FUSED_ACT_QUANT on). Each returns false having launched nothing
// where it does not apply (the caller runs the unfused ops), else runs the producer into the GEMM's
// workspace and the GEMM on it: bitwise the unfused producer then linear.
// Whether the W8A8 GEMM takes a projection of m rows by `weight` into out.
bool fp8_prequantized_takes(int64_t m, const LinearWeight& weight, const Tensor& out);
// out = linear(rms_norm(residual + delta), weight): residual rewritten, the normed rows never stored.
bool linear_norm_in_fp8(const Tensor& delta, const Tensor& residual, const Tensor& norm_weight, float eps,
                        const LinearWeight& weight, const Tensor& out);
// out = linear(silu_and_mul(gate_up), weight): the bf16 act never stored.
bool silu_mul_linear_fp8(const Tensor& gate_up, const LinearWeight& weight, const Tensor& out);
// Grows GemmEngine's FP8 dequantization scratch (gemm.h: reserve_fp8_dequant) to `elements` bf16, before
// any CUDA graph capture.
void reserve_fp8_dequant(int64_t elements);
// Grows GemmEngine's W8A8 GEMM workspace (gemm.h: reserve_fp8_gemm) to m rows of k, before any CUDA graph
// capture.
void reserve_fp8_gemm(int64_t m, int64_t k);
// Gathers the rows into scratch, runs the GEMM with fp32 output into logits, then rounds each logit to
// bf16 in place (the same value a bf16-output GEMM with the same tactic would give).
void lm_head(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& logits);
// ops/rows.h (rows.cu): bf16 add, and the image-row scatter (copy or add) into the decoder's hidden states.
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scatter_rows(const Tensor& dst, const Tensor& rows, const Tensor& src, bool accumulate);
// The vision tower's ops (vision.cu; contracts in ops/layer_norm.h, activation.h, linear.h,
// vision_attention.h, vision_pos_embed.h).
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out);
void gelu(const Tensor& x, const Tensor& out, bool tanh_approx);
void linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
void rope_2d(const Tensor& qkv, const Tensor& pos, const Tensor& table, int num_heads);
void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      const Tensor& out, float scale);
void pos_embed_interpolate(const Tensor& table, const Tensor& lin, int64_t side, int64_t grid_t,
                           int64_t grid_h, int64_t grid_w, int64_t merge, const Tensor& out);
void cast_to_bf16(const Tensor& in, const Tensor& out);
// A pure decode step (T == B) launches only the decode kernel (see ops/cuda/attention.h).
void paged_attention(const PagedAttentionArgs& args);

}  // namespace kiln::ops::cuda
