// Qwen3-MoE's sparse MLP (transformers' Qwen3MoeSparseMoeBlock: router, softmax, top-k, experts, weighted
// sum), the contract every backend implements. docs/NUMERICS.md "Mixture of experts" says why each rounding
// point sits where it does and how it differs from transformers' own bf16 path.
//
// moe_route(logits, top_k, norm_topk_prob, experts, weights), per token row t, E = logits.shape[1]:
//   l_i    = logits[t, i] (bf16, widened exactly to fp32);  m = max_i l_i
//   chosen = the top_k experts by l_i, equal logits broken by the lower expert index; written to
//            experts[t, 0 .. k) in ASCENDING expert index. (Softmax is monotone, so these are the top-k of
//            the probabilities; choosing on the bf16 logits keeps the choice independent of exp's last bit.)
//   e_i    = fp32(exp(fp64(l_i - m)))  the subtraction in fp32 (IEEE, round to nearest), exp in fp64, rounded
//            once to fp32: correctly rounded but for fp64 double-rounding hard cases (< 2^-28 of arguments),
//            so CUDA's fp64 exp gives the same bits as libm's
//   S      = sum_i e_i over all E experts in the canonical order: 32 lane partials, lane l sums experts
//            l, l + 32, l + 64, ... in ascending index (fp32 adds from +0), then an xor butterfly over
//            offsets 16, 8, 4, 2, 1 (p_l = p_l + p_(l ^ o)); S = p_0
//   p_j    = e_j / S                   fp32, correctly rounded (CUDA: __fdiv_rn), for the chosen j
//   w_j    = p_j / s_k if norm_topk_prob, s_k = sum of the chosen p_j in ascending expert index (fp32, from
//            +0), the division correctly rounded; else w_j = p_j
//   weights[t, slot of j] = bf16(w_j)  rounding point (HF: routing_weights.to(hidden dtype))
//   logits: bf16 [T, E], last stride 1;  experts: i32 [T, k] contiguous;  weights: bf16 [T, k] contiguous
//   1 <= k <= E. CPU or CUDA tensors (CUDA: E <= 512).
//
// moe_mlp(x, w, out): out = the sparse MLP of x.
//   logits[t, e] = bf16(x[t] . w.router[e])            bf16 [T, E], one rounding, the fp32 sum in the
//             canonical router order (ops::cpu::moe_router_logits): lane l of 32 takes the 8-element
//             chunks l, l + 32, l + 64, ... of the row (a ragged last chunk shorter), acc = fmaf(x_h, w_h,
//             acc) from +0 over its chunks and their elements in ascending h, then an xor butterfly over
//             offsets 16, 8, 4, 2, 1 (p_l = p_l + p_(l ^ o)); the logit is bf16(p_0)
//   experts, weights = moe_route(logits, w.top_k, w.norm_topk_prob)
//   y_(t,e) = linear(silu_and_mul(linear(x_t, w.gate_up[e])), w.down[e])
//             each chosen expert's SwiGLU with the dense MLP's rounding points (ops/linear.h
//             linear_silu_mul, then linear): gate/up rounded to bf16, silu rounded, the product rounded,
//             the down projection rounded to bf16
//   out[t] = bf16(sum over t's chosen e in ascending expert index of y_(t,e) * weights[t, e])
//             fp32 sum from +0, one rounding at the end. Each product is of two bf16 values, exact in fp32,
//             so a kernel that contracts it into an fma gets the same bits.
//   x: bf16 [T, H], last stride 1;  out: bf16 [T, H], last stride 1, not aliasing x
//   w.router: bf16 [E, H];  w.gate_up: bf16 [L, 2I, H] contiguous (expert expert_begin + e's I gate rows,
//   then its I up rows);  w.down: bf16 [L, H, I] contiguous; L = E and expert_begin = 0 but on an
//   expert-parallel rank
// A tensor-parallel rank's share (model/tensor_parallel.h; dist/shard_plan.h) is the same op on its slice:
//   expert parallelism: gate_up / down hold experts [expert_begin, expert_begin + L) of the router's E; the
//             routing is the whole model's, and the sum runs over the token's chosen experts that the rank
//             holds (ascending index), each y rounded as above;
//   split intermediate (split_intermediate): every expert, its gate/up rows and down columns a slice of I; y
//             is a partial sum.
//   out f32 (the CPU's fp32 all-reduce): the sum stored unrounded (one rounding after the all-reduce), and
//   with split_intermediate y kept in fp32 (ops::linear_f32) instead of rounded, so the only difference from
//   the whole layer is the order of fp32 additions and y's bf16 rounding skipped. out bf16 (CUDA's bf16
//   all-reduce): as above, the partial rounded.
// Block-FP8 experts (is_fp8): each expert's two projections are block-FP8 linears (ops/fp8_linear.h) with
//   the BF16 experts' rounding points otherwise. CPU: path (a) (linear_fp8 w8a8, the dense CPU model's FP8
//   path). CUDA: path (c), the e4m3 widened in registers to bf16(f32(q) * s) by the gather GEMV, or at and
//   above KILN_MOE_FP8_DEQUANT_MIN_TOKENS (ops/cuda/moe_ops.h; default 256) the chosen experts dequantized
//   (dequantize_fp8's bits) into the scratch for the grouped GEMM, so it equals the BF16 CUDA op on
//   dequantize_fp8's experts with the same expert kernel bitwise. The scratch then holds that copy: L x 3 x I
//   x H x 2 bytes (30B-A3B: 1.21 GB). Needs I and H multiples of 128 (each expert's gate, up and down rows
//   fill whole 128-row blocks).
// Path (d) for the gather GEMV (e4m3 x 16): CPU with MoeFp8Path::chunk16; CUDA's gather GEMV (and fused down
//   + combine) by default, KILN_MOE_FP8_E4M3X16=0 for path (c) (ops/cuda/moe.h). Each expert projection is
//   linear_fp8_chunk16(.., 32): per 16-element chunk of K, sum = the products f32(x) * f32(q) by fmaf from +0
//   in k order, acc = fmaf(sum, s, acc) with the chunk's block scale (the e4m3 never rounded to bf16),
//   thread t of 32 taking chunks t, t + 32, ... in ascending order, then the xor butterfly 16, 8, 4, 2, 1
//   (one warp a gate, up or down row on CUDA). Then the rounding points above: gate and up rounded to bf16,
//   silu_and_mul's (silu rounded, the product rounded), down rounded to bf16 (an f32 split-intermediate out:
//   kept in fp32, the CPU's), the final sum unchanged. CUDA equals the CPU bitwise but for silu's exp (libm's
//   expf against CUDA's: where they differ a silu value may move by one bf16 ulp, docs/NUMERICS.md); given
//   the same act rows, y and out bitwise.
// Summation orders inside the expert GEMMs are linear's (tolerance for other backends, ops/linear.h); the
// router logits from x, the routing (experts, weights) from given logits and the final sum from given expert
// outputs are bitwise contracts.
// CUDA (src/ops/cuda/moe.h, moe_ops.h): moe_route bitwise the CPU's (E <= 512); moe_mlp with a device
// scratch of moe_scratch_bytes (no allocation, no host synchronisation: capturable in a CUDA graph): for
// T <= 64 the router logits and the routing in one kernel, bitwise the CPU's from x (above: linear's
// tensor-core sum, its tolerance, then the routing bitwise from those logits), the (token, expert)
// permutation on the device, the experts by a gather
// GEMV (T <= 64) or a grouped tensor-core GEMM, each with the rounding points above (their sums in their own
// order: linear's tolerance), then the final sum bitwise as above from the experts' bf16 outputs. Needs H
// and I multiples of 8 and 16-byte aligned rows. Both parallel shares run on CUDA with out bf16 (f32 out is
// the CPU's): split_intermediate (the kernels see a smaller I) and expert parallelism (the routing over all
// E; the other ranks' pairs dropped on the device, so only the rank's are laid out, computed and summed:
// every (token, expert) row the rank computes is bitwise the whole layer's, and its out the combine of those
// rows over the rank's slots, src/ops/cuda/README.md). Block-FP8 experts either way (a split needs the rank's
// I a multiple of 128: whole blocks, model/tensor_parallel.h).
#pragma once

#include <cstdint>

#include "kiln/tensor.h"
#include "ops/linear.h"

namespace kiln::ops {

// One sparse MLP's weights (views; the model owns the storage). router empty: the layer is dense.
struct MoeWeights {
  Tensor router;   // bf16 [E, H]      mlp.gate.weight
  Tensor gate_up;  // bf16 [E, 2I, H]  mlp.experts.e.{gate,up}_proj.weight stacked
  Tensor down;     // bf16 [E, H, I]   mlp.experts.e.down_proj.weight stacked
  // Block-FP8 experts (ops/fp8_linear.h's format per expert): gate_up and down f8e4m3 with these f32 block
  // scales; empty for bf16 experts. The router stays bf16.
  Tensor gate_up_scale;  // f32 [E, 2I/128, ceil(H/128)] contiguous (I % 128 == 0: gate, up whole blocks)
  Tensor down_scale;     // f32 [E, H/128, ceil(I/128)] contiguous (H % 128 == 0)
  int64_t top_k = 0;
  bool norm_topk_prob = false;
  int64_t expert_begin = 0;         // expert parallelism: the router index of gate_up[0] / down[0]
  bool split_intermediate = false;  // tensor parallelism: gate_up / down hold a slice of each expert's I
  bool present() const { return router.data != nullptr; }
  bool is_fp8() const { return gate_up.dtype == DType::f8e4m3; }
  int64_t num_experts() const { return router.shape[0]; }  // the router's (the whole model's) E
  int64_t local_experts() const { return gate_up.shape[0]; }
  int64_t intermediate() const { return down.shape[2]; }
};

// How the CPU backend runs block-FP8 experts' projections (ops/fp8_linear.h's paths; above): w8a8, path (a),
// the CPU model's; chunk16, path (d) with 32 threads, the CUDA gather GEMV's e4m3 x 16 form.
enum class MoeFp8Path : uint8_t { w8a8, chunk16 };

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights);
// The CPU backend (a CUDA tensor is refused: it needs the scratch below). fp8: the block-FP8 experts' path
// (ignored for bf16 experts).
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, MoeFp8Path fp8 = MoeFp8Path::w8a8);
// Either backend. scratch: u8, contiguous, on x's device, at least moe_scratch_bytes(w, H, T, device)
// bytes (ignored on the CPU).
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, const Tensor& scratch);
// moe_mlp after the residual add and RMSNorm (the post-attention norm): add_rms_norm(in.delta, in.residual,
// in.weight, in.eps, in.normed) (ops/rms_norm.h) then moe_mlp(in.normed, w, out, scratch), bitwise. out may
// alias in.delta (read in full first), not residual or normed. CUDA, T <= 8 (and aligned, strides multiples
// of 8): the add and the norm run in the router's launch (src/ops/cuda/moe.h MoeNormIn), normed written.
void moe_mlp(const ResidualNorm& in, const MoeWeights& w, const Tensor& out, const Tensor& scratch);
// Device scratch bytes of moe_mlp for `tokens` rows of hidden size `hidden`: 0 on the CPU or when w is
// empty.
int64_t moe_scratch_bytes(const MoeWeights& w, int64_t hidden, int64_t tokens, Device device);

}  // namespace kiln::ops
