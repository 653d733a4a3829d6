// Tensor-level CUDA entry points of ops/moe.h, called by its dispatchers (src/ops/moe.cpp) after they have
// validated shapes, dtypes and devices. On kiln::cuda::current_stream(), no host synchronisation.
#pragma once

#include <cstddef>

#include "kiln/tensor.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace kiln::ops::cuda {

// Which expert kernels moe_mlp runs (moe.h step 4). by_rows: the gather GEMV for T <= moe_gemv_max_tokens(),
// else the wgmma grouped GEMM where it applies (an sm_90 device running sm_90a code), else the mma.sync
// one; KILN_MOE_EXPERTS=gemm, wgmma or gemv overrides by_rows (read once). The threshold: on the H100 the
// GEMV beats the wgmma GEMM up to T = 32 and loses from 64 in the decode step (kMoeGemvMaxTokens below;
// docs/PERF.md E14); the mma.sync GEMM is slower than both there (E2). Block-FP8
// experts under by_rows: the gather GEMV below moe_fp8_dequant_min_tokens(), at and above it the grouped GEMM
// on their dequantized copy (the wgmma one where it applies, the mma.sync one where KILN_MOE_EXPERTS=gemm);
// an explicit grouped kernel takes the dequantized copy at any T. Where the W8A8 grouped GEMM applies
// (moe_fp8_w8a8_runs) it takes the place of both from its own threshold (kMoeFp8W8a8MinTokens). The GEMV on
// block-FP8 experts runs path (c) of ops/fp8_linear.h (bitwise the BF16 GEMV on dequantize_fp8's experts),
// or path (d) with 32 threads a row where kiln::cuda::moe_fp8_e4m3x16() (KILN_MOE_FP8_E4M3X16,
// ops/cuda/moe.h; the CPU oracle: ops::moe_mlp with MoeFp8Path::chunk16).
// grouped_gemm_fp8_w8a8: the W8A8 grouped GEMM named (block-FP8 experts only, an sm_90a device; any T).
enum class MoeExperts { by_rows, grouped_gemm, grouped_gemm_sm90, gather_gemv, grouped_gemm_fp8_w8a8 };
// 63: the wgmma GEMM from 64 tokens, where the 30B-A3B bf16 decode step at batch 64 took 29.05 ms with it
// against 31.12 with the GEMV (H100, 2026-12-07, `69cacb3`, docs/PERF.md E14), as the tuner chooses there.
constexpr int64_t kMoeGemvMaxTokens = 63;
// BF16 experts' GEMV limit under by_rows: kMoeGemvMaxTokens unless KILN_MOE_GEMV_MAX_TOKENS (read once; >= 0,
// 0: the grouped GEMM at every T) or the setter (the startup tuner, ops/cuda/moe_tune.h) gives another.
// Block-FP8 experts do not read it (moe_fp8_w8a8_min_tokens and moe_fp8_dequant_min_tokens decide theirs).
// The scratch does not depend on it.
int64_t moe_gemv_max_tokens();
// Overrides KILN_MOE_GEMV_MAX_TOKENS for this process (>= 0; -1: kMoeGemvMaxTokens again).
void moe_set_gemv_max_tokens(int64_t tokens);
// KILN_MOE_EXPERTS as read (once): by_rows where unset.
MoeExperts moe_env_experts();
// Up to this many tokens the gather GEMV's down projection and the combine run as one kernel (the same
// bits; one launch and the y round trip fewer a layer). Batch 1 until measured above it.
constexpr int64_t kMoeFusedCombineMaxTokens = 1;

// Block-FP8 experts at T >= this many tokens (under by_rows) run as BF16 experts: the experts some token
// chose (the device-side counts; the rank's local ones) dequantized into the scratch (dequantize_fp8_experts,
// dequantize_fp8's bits), then the grouped GEMM on them, so the layer is bitwise the BF16 layer on the
// dequantized experts with the same GEMM. Below it the gather GEMV widens e4m3 in registers, re-reading each
// expert's weights for every 8 rows. KILN_MOE_FP8_DEQUANT_MIN_TOKENS overrides it (read once; 0: never,
// the GEMV at every T). The default is an estimate to be measured (bench/moe_bench.cpp rows `experts fp8
// dequant + wgmma` against `experts fp8 gather_gemv`): the dequant reads L x 3 x I x H e4m3 bytes and writes
// twice that in bf16 (30B-A3B, all 128 experts: 1.81 GB, ~0.6 ms at the H100's 3 TB/s) before the wgmma
// GEMM (520 us at T = 64, 1,234 us at 4096: docs/PERF.md E2); the GEMV took 506 us at T = 64 (E4) and grows
// ~5 us a token past it (every expert already read: more rows, the same bytes re-read), ~1.5 ms at 256.
// Measured (H100, 2026-12-06, `cfaddf7`'s binaries, docs/PERF.md E8): 30B-A3B experts at T = 256 take 1,154
// us dequant + wgmma against the GEMV's 2,270 (at 1,024: 1,215 against 8,462); the dequant alone is 653 us,
// so at T = 64 (GEMV 648 us) the GEMV wins. The crossover lies between; 256 is the smallest measured win.
// On sm_90a the W8A8 grouped GEMM (moe_fp8_w8a8_runs, below) takes the dequant path's place, from its own
// lower threshold (kMoeFp8W8a8MinTokens).
constexpr int64_t kMoeFp8DequantMinTokens = 256;
int64_t moe_fp8_dequant_min_tokens();
// Overrides KILN_MOE_FP8_DEQUANT_MIN_TOKENS for this process (tests and benchmarks; 0: never). Size the
// scratch after setting it.
void moe_set_fp8_dequant_min_tokens(int64_t tokens);
// True when moe_mlp with this `experts` choice dequantizes w's experts for T tokens (and so its scratch
// holds their bf16 copy): block-FP8 experts and an explicit grouped_gemm / grouped_gemm_sm90, or by_rows at
// T >= moe_fp8_dequant_min_tokens() > 0 where moe_fp8_w8a8_runs does not.
bool moe_fp8_dequant_runs(const MoeWeights& w, int64_t T, MoeExperts experts = MoeExperts::by_rows);

// Block-FP8 experts at and above moe_fp8_w8a8_min_tokens() (by_rows) run the W8A8 grouped GEMM (path (a) of
// ops/fp8_linear.h, the CPU oracle's and the checkpoint's semantics: kiln::cuda::
// moe_grouped_gemm_fp8_sm90_launch) instead of the gather GEMV below the dequant threshold and of dequantize
// + BF16 grouped GEMM (path (c)) above it, where it applies: an sm_90 device running the build's sm_90a code,
// KILN_MOE_EXPERTS not `gemm`, KILN_MOE_FP8_W8A8 not 0 (read once; default kMoeFp8W8a8Default) and the
// dequant threshold not 0 (0: the GEMV at every T). Its scratch holds the quantized inputs of one projection
// (max_rows x max(H, I) e4m3 + scales: 34.6 MB for 30B-A3B at T = 1024) instead of the bf16 expert copy (1.21
// GB). test_cuda_moe_fp8_w8a8 passed on an H100 (2026-12-07, `06d3ef4`: the layer 2.8e-3 to 8.6e-3 from the
// CPU oracle, path (c) 3.6e-2 to 4.1e-2; docs/NUMERICS.md's bound 2^-6 and a quarter of path (c)'s
// distance); kernel rows 305 / 356 / 758 us for T = 256 / 1,024 / 4,096 against the dequant path's 1,179 /
// 1,241 / 1,784, and 211 / 308 against the FP8 GEMV's 262 / 657 at T = 16 / 64 (docs/PERF.md E11).
constexpr bool kMoeFp8W8a8Default = true;
bool moe_fp8_w8a8_enabled();
// Overrides KILN_MOE_FP8_W8A8 for this process (tests and benchmarks). Size the scratch after setting it.
void moe_set_fp8_w8a8(bool on);
// The W8A8 grouped GEMM's threshold: 8 tokens. The 30B-A3B FP8 decode step (H100, 2026-12-07, `b2888dd`,
// graph + PDL, docs/PERF.md E12) at batch 8 / 16 / 32 / 64 took 9.41 / 13.54 / 17.61 / 21.01 ms with it
// against the gather GEMV's 9.86 / 16.00 / 24.87 / 38.87, and at batch 4 6.80 ms with the GEMV against 7.11.
constexpr int64_t kMoeFp8W8a8MinTokens = 8;
// kMoeFp8W8a8MinTokens unless KILN_MOE_FP8_W8A8_MIN_TOKENS (read once) or the setter (the startup tuner,
// ops/cuda/moe_tune.h) gives another.
int64_t moe_fp8_w8a8_min_tokens();
// Overrides KILN_MOE_FP8_W8A8_MIN_TOKENS for this process (>= 1; -1: the default again). Size the scratch
// after setting it.
void moe_set_fp8_w8a8_min_tokens(int64_t tokens);
// True when moe_mlp with this `experts` choice runs w's experts on the W8A8 grouped GEMM for T tokens (and
// so its scratch holds the quantized-input workspace): block-FP8 experts and grouped_gemm_fp8_w8a8 named, or
// by_rows where the paragraphs above say so.
bool moe_fp8_w8a8_runs(const MoeWeights& w, int64_t T, MoeExperts experts = MoeExperts::by_rows);

// Device bytes of moe_mlp's scratch for T tokens of w's shape with this `experts` choice; with block-FP8
// experts where moe_fp8_dequant_runs, it includes their bf16 copy: L x 3 x I x H x 2 bytes (30B-A3B: 128 x
// 3 x 768 x 2048 x 2 B = 1.21 GB); where moe_fp8_w8a8_runs, the W8A8 workspace instead (max_rows x max(H,
// I) bytes + ceil(max(H, I) / 128) x max_rows x 4).
size_t moe_scratch_bytes(const MoeWeights& w, int64_t hidden, int64_t T,
                         MoeExperts experts = MoeExperts::by_rows);

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights);
// scratch: a device buffer of at least moe_scratch_bytes(w, H, T) bytes.
void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, void* scratch, size_t scratch_bytes,
             MoeExperts experts = MoeExperts::by_rows);
// True when moe_mlp_norm_in takes a ResidualNorm for T tokens of hidden size H (the router's prologue).
bool moe_norm_in_applies(int64_t T, int64_t H);
// moe_mlp after add_rms_norm(in->delta, in->residual, in->weight, in->eps, in->normed), the add and the norm
// in the router's launch (moe.h MoeNormIn), bitwise the two ops; x must be in->normed (written here, then
// read by the experts). in nullptr: moe_mlp. The tensors validated by ops/moe.cpp: 16-byte aligned, row
// strides multiples of 8, moe_norm_in_applies.
void moe_mlp_norm_in(const ResidualNorm* in, const Tensor& x, const MoeWeights& w, const Tensor& out,
                     void* scratch, size_t scratch_bytes, MoeExperts experts = MoeExperts::by_rows);

}  // namespace kiln::ops::cuda
