// Block-FP8 linear layers (docs/NUMERICS.md, "Block-FP8 linear layers"): Qwen's -FP8 checkpoint format
// (DeepSeek-V3's): a weight stored as e4m3 [N, K] with one fp32 scale per 128 x 128 block,
//   w[n, k] = f32(q[n, k]) * scale[n / 128, k / 128]          (the last block row / column may be partial).
//
// LinearWeight is what every projection op of ops/linear.h takes: a bf16 matrix (implicitly from a Tensor) or
// the e4m3 matrix with its block scales. The model calls one op per projection either way.
//
// Rounding points of the three execution paths (each op below names the one it runs):
//   (a) W8A8 (Fp8LinearPath::w8a8; the CPU model's path): activations quantized per token and group of 128
//       along K by quantize_act_fp8, then per 128-K block an exact-product fp32 dot p (8 lane partials,
//       lane = k mod 8, ascending k, the tree (l0+l4)+(l2+l6) + (l1+l5)+(l3+l7)), acc = acc + p * (a_s * w_s)
//       over blocks in ascending order (no fma), out = bf16(acc).
//   (b) weight-only (Fp8LinearPath::weight_only): wf = f32(f32(q) * s) per element, then ops::linear's CPU
//       order with wf for the bf16 weight (products x * wf rounded, then added), out = bf16.
//   (c) dequantize_fp8 then the bf16 linear: w_bf16 = bf16(f32(q) * s) (bitwise on every backend).
//   (d) weight-only in 16-element chunks (linear_fp8_chunk16; the CUDA GEMV's "e4m3 x 16" configs,
//       ops/cuda/gemv.h): per 16-element chunk of K, sum = fmaf chain of f32(x) * f32(q) from +0 in k order,
//       then acc = fmaf(sum, s, acc); the chunks split over the kernel's threads, then its reductions; out =
//       bf16(acc). No rounding of the weight: f32(q) exact, the scale applied once a chunk.
// Tolerance of a GPU kernel for (a) and (b): relative Frobenius error <= 2^-8 against an fp64 reference of
// the same quantized operands; the activation quantizer and (c)'s dequantization are bitwise. CUDA runs (a)
// as the W8A8 GEMM (ops/cuda/fp8_gemm.h, M > 8) and the W8A8 GEMV (ops/cuda/gemv_w8a8.h, M <= 8), both with
// acc = fmaf(p, a_s * w_s, acc) for the promotion and the tensor cores' order inside a 128-K block.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln::ops {

inline constexpr int64_t kFp8Block = 128;  // weight_block_size [128, 128]; activation group 128
inline int64_t fp8_blocks(int64_t n) {
  return (n + kFp8Block - 1) / kFp8Block;
}

enum class Fp8LinearPath : uint8_t { w8a8, weight_only };

// One projection's weight.
//   bf16:      weight bf16 [N, K] (last stride 1); scale unset.
//   block-FP8: weight f8e4m3 [N, K] (last stride 1); scale f32 [ceil(N/128), ceil(K/128)] contiguous, on the
//              weight's device.
struct LinearWeight {
  Tensor weight;
  Tensor scale;

  LinearWeight() = default;
  LinearWeight(const Tensor& w)
      : weight(w) {}  // NOLINT(google-explicit-constructor): bf16 is the common case
  LinearWeight(const Tensor& w, const Tensor& s) : weight(w), scale(s) {}
  bool is_fp8() const { return weight.dtype == DType::f8e4m3; }
  int64_t rows() const { return weight.shape[0]; }
  int64_t cols() const { return weight.shape[1]; }
  int64_t nbytes() const { return weight.nbytes() + (scale.data ? scale.nbytes() : 0); }
};

// Validates a LinearWeight (either kind): 2-D, dtype bf16 or f8e4m3, and for f8e4m3 the scale's dtype, shape
// and device. `op` and `name` go into the error.
void check_linear_weight(const char* op, const char* name, const LinearWeight& w);

// out bf16 [M, N] = x bf16 [M, K] · W^T for a block-FP8 W, by `path` ((a) or (b) above). out must not alias
// x. An f32 out keeps acc unrounded (a tensor-parallel rank's partial: ops::linear_f32). CPU only: the CUDA
// backend runs FP8 weights through ops::linear (GemmEngine: the FP8 GEMV, the W8A8 GEMM of
// ops/cuda/fp8_gemm.h, or path (c)).
void linear_fp8(const Tensor& x, const LinearWeight& w, const Tensor& out, Fp8LinearPath path);

// Path (d) above for a kernel of `threads` threads a block (the e4m3 x 16 config's warps * 32; a multiple
// of 32): the CPU oracle of that CUDA GEMV, bitwise. Thread t of T sums chunks t, t + T, ... (ascending)
// into its acc from +0, as above; each warp's 32 partials go through the xor butterfly 16, 8, 4, 2, 1 (v =
// v + v[lane ^ off]), lane 0's value is the warp's; the warps' values are added in ascending order. The NaN
// codes (0x7f, 0xff; no quantizer here writes them) read as +-480. K must be a multiple of 16; out bf16 or
// f32 [M, N] as linear_fp8. CPU only.
void linear_fp8_chunk16(const Tensor& x, const LinearWeight& w, const Tensor& out, int threads);

// The activation quantizer of path (a), per row and group of 128 columns (the last group may be shorter):
//   amax = max |f32(x)| over the group;  a_s = f32(max(amax, 1e-10f) / 448);  q = e4m3_rn_sat(f32(x / a_s)).
//   x: bf16 [M, K] (last stride 1);  q: f8e4m3 [M, K] (last stride 1);  scale: f32 [M, ceil(K/128)]
//   contiguous. CPU only.
void quantize_act_fp8(const Tensor& x, const Tensor& q, const Tensor& scale);

// Online quantization (--quantization fp8) of one bf16 weight into the checkpoint format, per 128 x 128
// block (DeepGEMM's / vLLM's per_block_cast_to_fp8, as torch evaluates it): a = max(amax, 1e-4f),
// m = f32(f32(1 / a) * 448) (torch's `448.0 / amax` is amax.reciprocal() * 448),
// q = e4m3_rn_sat(f32(f32(w) * m)), scale = f32(a / 448). w: bf16 [N, K] contiguous; q: f8e4m3 [N, K]
// contiguous; scale: f32 [ceil(N/128), ceil(K/128)] contiguous; all on the CPU. A non-finite weight is an
// error that names `name`.
void quantize_weight_fp8(const Tensor& w, const Tensor& q, const Tensor& scale, const std::string& name);

// Path (c)'s dequantization: out bf16 [N, K] (contiguous, the weight's device) = bf16(f32(q) * s).
// CPU, and CUDA where built (one kernel, bitwise the CPU).
void dequantize_fp8(const LinearWeight& w, const Tensor& out);

}  // namespace kiln::ops
