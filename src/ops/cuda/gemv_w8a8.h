// W8A8 small-M GEMV for decode on FP8 tensor cores (1 <= M <= 8; sm_89+: mma.sync m16n8k32 e4m3): path (a)
// of ops/fp8_linear.h for a block-FP8 weight, a candidate of the GEMM tuner beside the W8A16 GEMV (gemv.h;
// a GemvConfig with w8a8 > 0, kGemvW8a8Configs), dispatched through gemv() and GemmEngine::run.
//
// out[m, n] = sum over 128-K blocks kb of P[m, n, kb] * (a_s[m, kb] * w_s[n / 128, kb]), where
//   x is quantized inside the kernel, every block for itself into shared memory, by fp8_act_quant.cuh's
//   quantize_act8: per row and 128-column group, amax, a_s = f32(max(amax, 1e-10) / 448), xq =
//   e4m3_rn_sat(x / a_s) -- bitwise ops::quantize_act_fp8 and fp8_gemm.h's quantizer (one helper);
//   P[m, n, kb] = sum over the block's k of xq[m, k] * wq[n, k]: four mma.m16n8k32 e4m3 x e4m3 -> f32 (the
//   tensor core's own order and its reduced-precision accumulation, bounded by the promotion every 128 K);
//   acc = fmaf(P, a_s * w_s, acc) over a warp's K blocks in ascending order (a_s * w_s rounded to f32), the
//   promotion of the W8A8 GEMM (fp8_gemm.h); then the warps' acc summed in ascending warp order;
//   bf16 out: bf16_rn(acc); f32 out: acc; silu_mul: g = bf16(acc of gate row j), u = bf16(acc of up row
//   I + j), act = bf16(float(bf16(g / (1 + expf(-g)))) * u) (gemv.h's silu_mul epilogue, same formula).
// Tolerance: relative Frobenius error <= 2^-8 against the fp64 product of the same quantized operands and
// scales (the W8A8 GEMM's); not bitwise the CPU oracle (its lane order is not the tensor core's). For a given
// config two runs are bitwise equal, and a row's result does not depend on M, on the other rows of x or on
// the row's place in its block (each output is one x row's and one W row's arithmetic). Different configs
// may differ in the last bits.
//
// Kernel: a block of `warps` warps owns 16 * tiles W rows (silu_mul: half gate, half the matching up rows),
// as `tiles` mma tiles whose m16 side is 16 W rows (row g and g + 8 for lane (g, t) = (lane / 4, lane % 4))
// and whose n8 side is the 8 x rows (rows >= M zero). K is cut into 128-element blocks; warp w takes blocks
// w, w + warps, ... In a block, lane t streams bytes [32 t, 32 t + 32) of its two W rows (two 16-byte
// L1-bypassing loads a row) and reads the same 32 bytes of x row g from shared memory: its 8 words are k
// = 32 t + 4 j .. + 3, word j = 2 s + h feeding mma step s (0..3) in the a0/a1 (h = 0) or a2/a3 (h = 1) slot,
// x alike in b0 / b1 -- a permutation of k inside the block, the same for x and W, so each step's products
// are products of the dot product. A warp issues the W loads (and the two rows' block scales) of `w8a8` K
// blocks per tile before their first mma; the first round goes out before the PDL wait and before x is
// quantized (W is never written by an earlier kernel: gemv.h), and with it an L2 prefetch of the rest of the
// warp's W slice (KILN_GEMV_W8A8_PREFETCH=0 leaves it out), since the later rounds are issued only once x is
// quantized and the first round consumed.
//
// Shapes: 1 <= M <= 8; N >= 1 (silu_mul: even); K >= 16 and a multiple of 16 (16-byte chunks all in or all
// past K; a partial last 128-K block reads zeros past K); x bf16 16-byte aligned, ldx >= K a multiple of 8;
// W e4m3 16-byte aligned, ldw >= K a multiple of 16; scales 4-byte aligned; out 16-byte aligned, ldo >= the
// output columns; the block's shared memory (the M quantized rows, their scales and the warps' sums) within
// kGemvW8a8MaxSmem; and a device that runs the kernel (sm_89+ code in this build). gemv_w8a8_supported says
// whether a call is taken; where it is not, the caller runs the W8A16 GEMV or GemmEngine's other paths.
// Fused forms: the residual-norm prologue (gemv_w8a8_norm_in below, through gemv_norm_in with a W8A8
// config). The add + RMSNorm epilogue and the attention preparation are not offered: gemv_fusable is false
// for W8A8 configs, so ops_cuda.cpp runs them unfused (this GEMV, then add_rms_norm; this GEMV, then the
// attention preparation).
#pragma once

#include <cstdint>

#include "ops/cuda/gemv.h"

namespace kiln::cuda {

// The most dynamic shared memory one block takes (the H100's opt-in limit is 227 KB).
constexpr int64_t kGemvW8a8MaxSmem = 200 * 1024;

// Bytes of dynamic shared memory the W8A8 kernel takes for this call.
int64_t gemv_w8a8_smem_bytes(int64_t m, int64_t k, GemvConfig cfg);

// The shape rules above alone (no device query: the tactic cache's parser uses it).
bool gemv_w8a8_shape_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo,
                               GemvEpilogue epi);

// True when gemv_w8a8 takes this call with every W8A8 config on the current device (the shape rules and a
// device that runs the kernel; alignment is checked by gemv_w8a8 itself, and by gemv_takes).
bool gemv_w8a8_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo,
                         GemvEpilogue epi);

// The GEMV above with config cfg (one of kGemvW8a8Configs), W block-FP8. Throws kiln::Error before anything
// is launched where the call is not supported; m == 0 is a no-op. pdl: as gemv (gemv.h).
void gemv_w8a8(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
               int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl = false);

// True when gemv_w8a8_norm_in takes this call with every W8A8 config on the current device:
// gemv_w8a8_supported (x's stride taken as K), delta and residual row strides multiples of 8 and >= K, and
// the prologue's rows within kGemvW8a8MaxSmem.
bool gemv_w8a8_norm_in_supported(int64_t m, int64_t n, int64_t k, int64_t ldd, int64_t ldr, int64_t ldw,
                                 int64_t ldo, GemvEpilogue epi);

// The residual-norm prologue (gemv.h: gemv_norm_in) on the W8A8 GEMV: residual[m, :] <- h = bf16(residual +
// delta); x = rms_norm(h) * norm_w computed into shared memory by gemv_kernels.cuh's norm_in_prologue
// (bitwise the rms_norm kernel with add), quantized from there as gemv_w8a8 quantizes x, then the same dot
// products and epilogue: out (and residual) bitwise rms_norm(delta, residual, ..., add = true) then gemv_w8a8
// with the same config on the normed rows, which are never stored. One wave of resident blocks, each taking
// row groups blockIdx.x, + gridDim.x, ... after its one prologue (x quantized once per block). Arguments and
// the per-device counter's rules as gemv_norm_in (not for two launches in flight at once on two streams of
// one device); W, cfg, ldo, epi, pdl as gemv_w8a8.
void gemv_w8a8_norm_in(const void* delta, int64_t ldd, void* residual, int64_t ldr, const void* norm_w,
                       float eps, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
                       int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl = false);

}  // namespace kiln::cuda
