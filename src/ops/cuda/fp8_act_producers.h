// Producers of a W8A8 GEMM's input that write its quantized workspace directly (issue 43): the kernel that
// makes a projection's bf16 input also quantizes it, so the GEMM (fp8_gemm.h: fp8_gemm_quantized) runs
// without fp8_gemm's own quantizer launch re-reading that input.
//
// Workspace (what fp8_quantize_act writes, fp8_gemm.h): for M rows of K, xq e4m3 [M, K] (row stride K) at
// offset 0 and xs f32 [ceil(K/128), m_pad] at fp8_act_scale_offset(M, K), m_pad = fp8_act_scale_rows(M),
// rows M .. m_pad - 1 of xs written 0; nothing else is written (the padding between them is left alone).
// Bitwise: each producer computes its bf16 row exactly as the unfused kernel (elementwise.h) stores it, then
// quantizes it with fp8_act_quant.cuh's quantize_act8 on the same 128-column groups, so the workspace is
// byte for byte what fp8_quantize_act writes when it reads the unfused kernel's output.
//
// Shapes, both: 1 <= M < 2^30; K (I for silu_mul) a multiple of 16, 16 <= K < 2^24 (the W8A8 GEMM's rule);
// row strides multiples of 8 elements; bf16 pointers 16-byte aligned; the workspace 256-byte aligned and at
// least fp8_gemm_workspace_bytes(M, K). Launched without PDL (they call launch_dependents first, so the
// GEMM launched after them with PDL starts its prologue early; it waits for them before reading). No
// allocation, no host synchronisation: capturable.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// SiLU-and-multiply (elementwise.h: silu_mul; vec.cuh's silu_mul_f32) quantized for the down projection:
//   act[t, c] = bf16(bf16(g / (1 + expf(-g))) * u), g = gate_up[t, c], u = gate_up[t, I + c]
//   workspace <- fp8_quantize_act(act)  (M = m rows, K = i)
// gate_up: bf16 [m, 2i], row stride ld. act itself is not written.
void silu_mul_quantize_act(const void* gate_up, int64_t ld, int64_t m, int64_t i, void* workspace,
                           int64_t workspace_bytes, cudaStream_t stream);

// (Residual add +) RMSNorm (elementwise.h: rms_norm, norm_row.cuh's arithmetic and summation order)
// quantized for the projection that reads the normed rows (QKV, gate_up):
//   add:    residual <- bf16(residual + x); r = residual      no add: r = x (residual unused, may be null)
//   y = bf16(bf16(r * inv_rms(r)) * w)                        (bitwise rms_norm's out)
//   workspace <- fp8_quantize_act(y)  (M = m rows, K = k)
// x, residual: bf16 [m, k] (row strides ldx, ldr); w: bf16 [k]. out: bf16 [m, k] (row stride ldo) receives y
// too where it is not null (a caller that reads the normed rows elsewhere); null: y is not stored.
void rms_norm_quantize_act(const void* x, int64_t ldx, void* residual, int64_t ldr, const void* w, void* out,
                           int64_t ldo, int64_t m, int64_t k, float eps, bool add, void* workspace,
                           int64_t workspace_bytes, cudaStream_t stream);

}  // namespace kiln::cuda
