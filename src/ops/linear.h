// Linear layer (no bias): out[M, N] = x[M, K] · W[N, K]^T.
//
//   x:      bf16 [M, K], last stride 1 (row stride free)
//   weight: bf16 [N, K], last stride 1
//   out:    bf16 [M, N], last stride 1; must not alias x
// Products of bf16 values are exact in fp32; the sum is accumulated in fp32 and rounded once to bf16
// (round to nearest even). The summation order is implementation-defined: CPU uses 8 lane partials
// (k mod 8), each summed in ascending k, then a tree (lane l + l+4, then + l+2, then + l+1); the same for
// every M, N and thread count, so a row's result never depends on what else is in the batch. Tolerance
// against an fp64 reference: relative Frobenius error <= 2^-8 (one bf16 rounding).
//
// CUDA: the dispatcher's CUDA branch is to call kiln::ops::cuda::linear(x, weight, out), a wrapper over
// kiln::cuda::GemmEngine::run (src/ops/cuda/gemm.h) with GemmOut::bf16.
//
// The projection ops below (linear, linear_silu_mul, linear_add_rms_norm, linear_attn_prep) take a
// LinearWeight (ops/fp8_linear.h): a bf16 matrix as above, or a block-FP8 matrix with its 128 x 128 scales,
// which runs path (a), W8A8, of ops/fp8_linear.h on the CPU (each op then has that path's rounding points in
// place of linear's). On CUDA each op takes the FP8 weight too (ops/cuda/ops_cuda.h): the weight-only FP8
// GEMV and its fused forms where the tuner chose them (M <= 8), bitwise path (c), i.e. the bf16 op on
// dequantize_fp8's weight; else the weight dequantized into a scratch buffer and the bf16 GEMM (path (c)).
#pragma once

#include "kiln/tensor.h"
#include "ops/attn_prep.h"
#include "ops/fp8_linear.h"

namespace kiln::ops {

void linear(const Tensor& x, const LinearWeight& weight, const Tensor& out);

// Verify steps (speculative decoding): while one lives, the projections on `device` (linear, its fused forms
// below, lm_head) of at most 8 rows run the tactic tuned for `rows` rows (the plain decode step's: its
// sequence count). A GEMV row's result does not depend on M for a config (ops/cuda/gemv.h), so a verify
// step's rows get the plain step's bits (CUDA:
// GemmEngine::set_tactic_rows, which takes them only with KILN_VERIFY_TACTICS=1: they cost, docs/PERF.md).
// The CPU's rows never depend on M: nothing to do there. Scopes nest.
class LinearTacticRows {
 public:
  LinearTacticRows(Device device, int64_t rows);
  ~LinearTacticRows();
  LinearTacticRows(const LinearTacticRows&) = delete;
  LinearTacticRows& operator=(const LinearTacticRows&) = delete;

 private:
  Device device_;
  int64_t prev_ = 0;
};

// Linear with bias (the vision tower's layers: nn.Linear(bias=True), the patch embedding's Conv3d):
//   out[m, n] = bf16(sum_k x[m, k] w[n, k] + bias[n]): the sum as linear's, the bias added in fp32, one
//   rounding (torch's bf16 addmm and cuBLASLt's bias epilogue both round once).
//   bias: bf16 [N] contiguous; the rest as linear.
// CUDA: kiln::ops::cuda::linear_bias: the bf16 GEMM (GemmOut::bf16), then the bias added with a second
// rounding: up to 1 bf16 ulp more than the CPU's single rounding (within the GEMM tolerance).
void linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
// linear without its rounding point: out f32 [M, N] (last stride 1) holds the fp32 sums, in linear's CPU
// summation order, unrounded. A tensor-parallel rank's share of a row-parallel projection, summed over the
// ranks before the one bf16 rounding (model/tensor_parallel.h). CPU only (CUDA runs TP with bf16 partials).
// A block-FP8 weight runs path (a) of ops/fp8_linear.h with acc stored unrounded.
void linear_f32(const Tensor& x, const LinearWeight& weight, const Tensor& out);

// The SwiGLU MLP's first half in one op: out = silu_and_mul(linear(x, weight)) (ops/activation.h).
//   x:       bf16 [M, K], last stride 1
//   weight:  bf16 [2I, K], last stride 1: the concatenated gate_up weight (gate rows 0..I-1, up rows I..2I-1)
//   gate_up: bf16 [M, 2I], last stride 1: workspace for the unfused path; its contents afterwards are
//            unspecified (the fused path leaves it alone)
//   out:     bf16 [M, I], last stride 1; no aliasing among x, gate_up and out
// Rounding points: those of linear (the gate and up values rounded to bf16) then of silu_and_mul, so the
// result is that composition's. CPU: linear then silu_and_mul through gate_up. CUDA:
// kiln::ops::cuda::linear_silu_mul: the fused GEMV (ops/cuda/gemv.h, bitwise the GEMV followed by the
// silu_mul kernel) when the GEMM tuner chose the GEMV for [M, 2I, K], else the GEMM and the silu_mul kernel.
void linear_silu_mul(const Tensor& x, const LinearWeight& weight, const Tensor& gate_up, const Tensor& out);

// A projection followed by the residual add and the next RMSNorm, in one op (the O and down projections):
//   tmp = linear(x, weight);  add_rms_norm(tmp, residual, norm_weight, eps, normed)   (ops/rms_norm.h)
//   x:           bf16 [M, K], last stride 1
//   weight:      bf16 [N, K], last stride 1 (N = H, the hidden size)
//   residual:    bf16 [M, N], last stride 1; read and rewritten: residual = bf16(residual + tmp)
//   norm_weight: bf16 [N] contiguous;  eps > 0
//   tmp:         bf16 [M, N], last stride 1: the projection's output (written on every path)
//   normed:      bf16 [M, N], last stride 1: rms_norm(residual)
//   x, tmp, residual and normed must not alias one another.
// Rounding points: those of linear then of add_rms_norm, so the result is that composition's. CPU: exactly
// the composition. CUDA: kiln::ops::cuda::linear_add_rms_norm: the projection (the tuner's GEMV or GEMM) then
// the add_rms_norm kernel; with KILN_GEMV_ADD_RMS_NORM=1, the GEMV with the add + RMSNorm epilogue
// (ops/cuda/gemv.h, bitwise the same) where the tuner chose the GEMV (measured slower on the H200 so far).
void linear_add_rms_norm(const Tensor& x, const LinearWeight& weight, const Tensor& residual,
                         const Tensor& norm_weight, float eps, const Tensor& tmp, const Tensor& normed);

// The QKV projection with the attention preparation: linear(x, weight, args.qkv) then attn_prep(args)
// (ops/attn_prep.h), bitwise: x bf16 [T, K], weight bf16 [(Hq + 2 Hkv) D, K].
// On CUDA one kernel (ops/cuda/gemv_attn_prep.h: 1 <= T <= 8, bf16 activations, bf16 or fp8 cache, head_dim
// 64 or 128) where the tuner chose the GEMV for the QKV shape and the fusion is switched on (GemmEngine::
// set_gemv_attn_prep, KILN_GEMV_ATTN_PREP=1; off by default); returns cuda_gemv_fused then. Otherwise the two
// ops, returning attn_prep's path. Capturable in a CUDA graph like attn_prep.
AttnPrepPath linear_attn_prep(const Tensor& x, const LinearWeight& weight, const AttnPrepArgs& args);

// The input of a projection that follows a residual add and an RMSNorm (the QKV and gate_up projections of
// a decoder layer): x = add_rms_norm(delta, residual, weight, eps, normed) (ops/rms_norm.h), i.e. residual =
// bf16(residual + delta), normed = rms_norm(residual). The ops below taking one compute x themselves, so on
// CUDA the add and the norm may run in the projection's own prologue (ops/cuda/gemv.h: gemv_norm_in, where
// the tuner chose the GEMV and GemmEngine::gemv_norm_in is on; then normed is not written and is left
// unspecified). Either way residual is rewritten and the projection's result is bitwise that of
// add_rms_norm then the op on normed.
//   delta, residual, normed: bf16 [M, K], last stride 1, none aliasing another or the op's other tensors
//   weight: bf16 [K] contiguous;  eps > 0
struct ResidualNorm {
  Tensor delta, residual, weight;
  float eps = 0.0f;
  Tensor normed;
};
// On CUDA, where the projection takes the W8A8 GEMM (a block-FP8 weight, M > 8, that tactic tuned,
// KILN_FP8_FUSED_ACT_QUANT on), the add and the norm run in one kernel that also quantizes the normed rows
// for the GEMM (ops/cuda/fp8_act_producers.h); normed is then not written either. Bitwise the same.
void linear_silu_mul(const ResidualNorm& in, const LinearWeight& weight, const Tensor& gate_up,
                     const Tensor& out);
AttnPrepPath linear_attn_prep(const ResidualNorm& in, const LinearWeight& weight, const AttnPrepArgs& args);

// The SwiGLU MLP of a decoder layer whose input is a residual add + RMSNorm, down projection included:
//   linear_silu_mul(in, gate_up_weight, gate_up, act);  linear(act, down_weight, out)
//   gate_up bf16 [M, 2I], act bf16 [M, I]: workspaces, contents afterwards unspecified; out bf16 [M, N]
//   (N = down's rows), last stride 1; out may alias in.delta (read before out is written), nothing else.
// Bitwise that composition. On CUDA, where the down projection takes the W8A8 GEMM (as above), SiLU-and-
// multiply quantizes its rows for the GEMM in the same kernel (act is then not written); elsewhere, and on
// the CPU, the two ops.
void swiglu_mlp(const ResidualNorm& in, const LinearWeight& gate_up_weight, const LinearWeight& down_weight,
                const Tensor& gate_up, const Tensor& act, const Tensor& out);

// LM head: logits[r, :] = x[rows[r], :] · W^T, rows gathered from a hidden-state matrix.
//   x:      bf16 [T, H], last stride 1;  rows: i32 [R] contiguous, each in [0, T)
//   weight: bf16 [V, H] (the embedding table when tied), last stride 1
//   logits: f32 [R, V], last stride 1
// Accumulated in fp32 like linear, then rounded to bf16 and stored as f32: the logits a bf16 model
// produces in Hugging Face transformers, vLLM and SGLang (their LM head GEMM writes bf16), so greedy
// ties break the same way (lowest id among equal bf16 logits).
// CUDA: kiln::ops::cuda::lm_head(x, rows, weight, logits) (a row gather, the GEMM, a bf16 rounding).
void lm_head(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& logits);

}  // namespace kiln::ops
