// W8A8 block-scaled FP8 GEMM for Hopper (sm_90a): path (a) of ops/fp8_linear.h on wgmma with TMA.
//
// Contract: out bf16 [M, N] (row stride ldo) = x bf16 [M, K] (row stride ldx) against a block-FP8 weight:
//   wq e4m3 [N, K] (row stride ldw bytes), wscale f32 [ceil(N/128), ceil(K/128)] contiguous,
//   w[n, k] = f32(wq[n, k]) * wscale[n / 128, k / 128].
// Two launches (three for a split-K config), all on `stream`, no allocation and no host synchronization
// (usable inside graph capture):
//   1. quantize: x -> xq e4m3 [M, K] (row stride K) and xs f32, per row and group of 128 along K, bitwise
//      ops::quantize_act_fp8: amax = max |f32(x)| over the group (NaN ignored), a_s = f32(max(amax, 1e-10f) /
//      448), q = e4m3_rn_sat(f32(x / a_s)) (ops/fp8.h's encoding: NaN -> 0x7f). The last group of a row may
//      be shorter (K mod 128). Scale layout (what the GEMM's TMA wants, DeepGEMM's choice): MN-major, xs[kb *
//      m_pad + m] for kb < ceil(K/128), m < m_pad = M rounded up to 128, so one 512-byte bulk copy brings a
//      128-row tile's scales of one K block; rows M .. m_pad - 1 hold 0.
//   2. the GEMM: per 128 x tile_n output tile and 128-wide K block kb, P = xq_tile · wq_tile^T by wgmma
//      (e4m3 x e4m3, the tensor cores' own summation order), then acc += P * (xs[kb, m] * wscale[n / 128,
//      kb]) in fp32 (an fma; the promotion every 128 K also bounds Hopper's reduced-precision FP8
//      accumulation), out = bf16_rn(acc). K blocks in ascending order; a partial last block reads zeros (TMA
//      fill) past K.
//   Split-K (a config's split_k = S > 1, where fp8_gemm_split gives S' = min(S, ceil(K/128)) > 1, i.e. M <=
//   kFp8GemmSplitKMaxM): the K blocks are cut into S' contiguous ranges, split s taking blocks
//   [s Kb / S', (s + 1) Kb / S') (Kb = ceil(K/128), integer division), each run as above from acc = +0 in
//   ascending blocks by its own CTA, which stores its fp32 acc (no rounding) as partial tile s in the
//   workspace; then a second launch (PDL) computes out = bf16_rn(((part_0 + part_1) + part_2) + ...) in
//   ascending split order, fp32 adds. No atomics: the result is deterministic and independent of which CTA
//   ran which split. split_k = 1 (or S' = 1) is the one-launch GEMM above, unchanged.
// Numerics (docs/NUMERICS.md "Block-FP8 linear layers"): the quantizer is bitwise the CPU oracle; the output
// is within relative Frobenius error 2^-8 of the fp64 product of the same quantized operands and scales (the
// oracle's own tolerance for a GPU kernel), not bitwise the oracle (its lane order is not the tensor cores').
// For one config the result is deterministic and does not depend on M's other rows (a split config's rows
// depend on M only through fp8_gemm_split's clamp at kFp8GemmSplitKMaxM).
//
// Shapes: any M >= 1 and N >= 1 (TMA zero-fills rows past M and N; the epilogue stores only inside); K a
// multiple of 16 (TMA rows of 16 bytes; K mod 128 is handled by the scale grid and the zero fill); ldx >= K
// and a multiple of 8 (16-byte rows for the quantizer's loads); ldw >= K and a multiple of 16; ldo >= N and a
// multiple of 8; x, wq, out 16-byte aligned, the workspace 256-byte aligned; M, N < 2^30, K < 2^24.
// fp8_gemm_supported also requires an sm_90 device that runs this build's sm_90a code and the driver's
// tensor-map entry point; where it says no, the caller takes another path (dequantize + bf16 GEMM).
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// One kernel configuration: output tile 128 x tile_n (tile_n 64, 128: one weight-scale row per tile; 192:
// two, chosen per 8-column group), `stages` K blocks in flight in the TMA pipeline (as many as ~200 KB of
// shared memory holds), persistent (one block per SM walking the tiles, the next tile's loads overlapping the
// current epilogue) or one block per tile, clusters of `cluster` CTAs (2: two M tiles of one weight tile,
// each CTA loading half of the weight tile and multicasting it to both; tile_n 128 and 192), and the
// epilogue: bf16 pairs stored from registers, or staged in shared memory and written by TMA (a stage fewer).
// split_k > 1: split-K (above) for small M, where ceil(M / 128) x ceil(N / tile_n) tiles are too few CTAs to
// draw the HBM bandwidth (4B o / down at M <= 128: 20 tiles of 128 columns for 132 SMs): each tile's K
// blocks in split_k contiguous ranges, one CTA (unit) each, units numbered tile fastest, then split; the
// epilogue stores fp32 partials, and the reduce launch rounds once.
struct Fp8GemmConfig {
  int tile_n = 128;
  int stages = 6;
  bool persistent = true;
  int cluster = 1;
  bool tma_store = false;  // the epilogue through shared memory and TMA stores (else stores from registers)
  int split_k = 1;         // K ranges a tile is cut into (1: no split, the bf16 epilogue)
  bool operator==(const Fp8GemmConfig&) const = default;
};

// Every configuration the kernel takes; the tuner times them all (the split-K ones where the unsplit tiles
// leave SMs idle: gemm_tune.cpp). New configs go at the end (tests name earlier ones by index).
inline constexpr Fp8GemmConfig kFp8GemmConfigs[] = {
    {128, 6, true, 1, false},    {128, 6, false, 1, false},   {64, 8, true, 1, false},
    {64, 8, false, 1, false},    {192, 5, true, 1, false},    {128, 5, true, 1, true},
    {128, 6, true, 2, false},    {192, 5, true, 2, false},    {128, 5, true, 2, true},
    {192, 4, true, 2, true},     {128, 6, true, 1, false, 2}, {128, 6, true, 1, false, 3},
    {128, 6, true, 1, false, 4}, {128, 6, true, 1, false, 6}, {128, 6, true, 1, false, 8},
    {64, 8, true, 1, false, 2},  {64, 8, true, 1, false, 3},  {64, 8, true, 1, false, 4},
    {64, 8, true, 1, false, 8},
};

// Split-K applies up to this many rows (the startup tuner's largest M bucket); a split config runs unsplit
// above it (its partials would grow as M x N: a prefill chunk borrowing a small bucket's tactic).
inline constexpr int64_t kFp8GemmSplitKMaxM = 512;
// Whether the startup tuner offers the split configs (KILN_FP8_GEMM_SPLIT_K=0 turns them off). On since
// test_cuda_fp8_gemm passed whole on an H100 (2026-12-07, `b2888dd`) and the 4B FP8 decode step at batch 32
// took 5.28 ms with them against 5.73 without (graph + PDL; batch 1 unchanged: 3.064 / 3.062 ms; docs/PERF.md
// S10). At M = 32, split 3 / 6 were the fastest O / down (K9).
inline constexpr bool kFp8GemmSplitKTunedByDefault = true;

// The K ranges cfg runs for M rows of K: min(cfg.split_k, ceil(K / 128)), 1 where M > kFp8GemmSplitKMaxM.
int fp8_gemm_split(const Fp8GemmConfig& cfg, int64_t m, int64_t k);

// Whether fp8_gemm takes this shape on the current device (see the shape rules above).
bool fp8_gemm_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo);

// Bytes of the quantized input for M rows of K: xq (M x K bytes, at offset 0), then xs (256-aligned). What
// the quantizer and the producers fill, and all the workspace an unsplit config needs.
int64_t fp8_gemm_workspace_bytes(int64_t m, int64_t k);
// Bytes of workspace fp8_gemm / fp8_gemm_quantized need with `cfg`: the quantized input above, then, where
// fp8_gemm_split(cfg, m, k) = S > 1, the fp32 partials [S][M][round_up(N, 4)] at offset
// fp8_gemm_workspace_bytes(m, k) (256-aligned). Equal to the (m, k) form for an unsplit run.
int64_t fp8_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, const Fp8GemmConfig& cfg);

// The quantizer alone (launch 1 above), into a workspace laid out as fp8_gemm's. For tests, benchmarks and
// producers that quantize their own output.
void fp8_quantize_act(const void* x, int64_t ldx, int64_t m, int64_t k, void* workspace,
                      int64_t workspace_bytes, cudaStream_t stream);
// Where launch 1 leaves xs inside the workspace, and its row count m_pad.
int64_t fp8_act_scale_offset(int64_t m, int64_t k);
int64_t fp8_act_scale_rows(int64_t m);

// out = W8A8(x, wq, wscale) as above: quantize x into the workspace, then the GEMM with `cfg` (a split
// config: then the reduce launch). Throws (and enqueues nothing) where fp8_gemm_supported says no, a pointer
// is misaligned, the workspace is smaller than fp8_gemm_workspace_bytes(m, n, k, cfg) or cfg is not one of
// kFp8GemmConfigs.
void fp8_gemm(const void* x, int64_t ldx, const void* wq, int64_t ldw, const float* wscale, void* out,
              int64_t ldo, int64_t m, int64_t n, int64_t k, void* workspace, int64_t workspace_bytes,
              Fp8GemmConfig cfg, cudaStream_t stream);

// The GEMM alone (launch 2 above; a split config: with its reduce launch) on a workspace that
// fp8_quantize_act (or a producer writing its layout) filled for the same M and K, of at least
// fp8_gemm_workspace_bytes(m, n, k, cfg) bytes (not const: a split config writes its partials past the
// quantized input); launched with PDL, it waits for the previous kernel before reading it.
void fp8_gemm_quantized(const void* wq, int64_t ldw, const float* wscale, void* out, int64_t ldo, int64_t m,
                        int64_t n, int64_t k, void* workspace, int64_t workspace_bytes, Fp8GemmConfig cfg,
                        cudaStream_t stream);

}  // namespace kiln::cuda
