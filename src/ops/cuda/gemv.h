// Small-M GEMV for decode (1 <= M <= 8): out[M, N] = x[M, K] · W[N, K]^T, bf16 in, fp32 accumulate,
// bf16 or f32 out; and the fused gate_up GEMV with the SiLU-and-multiply epilogue. A candidate of the
// GEMM tuner (gemm.h: a "kiln-gemv" pseudo-tactic), dispatched by GemmEngine::run when it won.
//
// Block-FP8 weights (GemvWeight with a scale; docs/NUMERICS.md "Block-FP8 linear layers"): every kernel and
// fused form below also reads W as e4m3 [N, K] with f32 block scales [ceil(N/128), ceil(K/128)] (the
// weight-only decode path: 8 bytes a chunk of 8 elements where bf16 takes 16). Each chunk is widened in
// registers to exactly path (c)'s bf16 value, bf16(f32(q) * s) (e4m3 -> f16 -> f32 exact, one fp32
// product, RNE; gemv_weights.cuh), then enters the same arithmetic in the same order. So the FP8 GEMV with
// a config is bitwise the bf16 GEMV with that config on dequantize_fp8's output (ops/fp8_linear.h), in every
// epilogue and fused form: the CUDA weight-only path is path (c) in registers. (e4m3 NaN codes, which no
// quantizer here writes, decode to a NaN either way, not necessarily the same one.) The cvt is sm_89+;
// other targets decode in integer arithmetic (ops/fp8.h), to the same values.
//
// e4m3 x 16 (GemvConfig::e4m3x16, kGemvE4m3x16Configs; block-FP8 W with K and ldw multiples of 16, the
// data 16-byte aligned: gemv_weight_fits): a format of its own with its own contract, path (d) of
// ops/fp8_linear.h (the CPU oracle ops::linear_fp8_chunk16 is bitwise for every config). The FMA kernel
// below, with chunks of 16 elements: one 16-byte load of e4m3 and the chunk's block scale, each byte decoded
// to exactly f32(q) in integer arithmetic and one exact fp32 multiply (gemv_weights.cuh: no conversion
// instruction; the NaN codes read as +-480), per x row and W row sum = fmaf(x_k, f32(q_k), sum) over the
// chunk's 16 elements in k order from +0, then acc = fmaf(sum, s, acc) (no rounding of the weight, one
// scaled add a chunk); thread t of T takes chunks t, t + T, ...; the butterfly and the warps' order as
// below. A block owns 8 W rows at M <= 2 (fused: 4 gate + 4 up), 4 at M > 2 (gemv_block_rows). The lighter
// form (x16_rows = 4, the tuner's pick per shape) owns 4 at every M, and at M <= 2 decodes each row's chunk
// just before its products, 2 chunk steps a round (fewer registers, more resident warps); at M > 2 it is the
// first form. The order above depends only on T, so both forms give the same bits for the same warps. Every
// epilogue and fused form (silu_mul, f32, add + RMSNorm, the residual-norm prologue, the attention
// preparation) runs it: each is bitwise this GEMV then the unfused op, as for the other formats. Tolerance
// against an fp64 reference as below; it is not bitwise the bf16 GEMV on dequantize_fp8's weight (path (c)
// rounds every weight to bf16; this path keeps f32(q) * s unrounded). Why a format: the 8-element e4m3 chunk
// moves 8 bytes a load with two conversion-pipe instructions an element (cvt e4m3x2 -> f16x2, f16 -> f32,
// f32 -> bf16x2); this one moves 16 bytes a load, a bf16 chunk's width, with integer and FMA-pipe work only.
//
// Two kernels, both a candidate of the tuner (it times every GemvConfig and keeps the fastest):
//
// CUDA cores (tensor_cores false): a block of `warps` warps owns 4 rows of W (for the fused epilogue: 2
// gate rows j.. and the matching up rows I + j..). Its threads split K into 16-byte chunks (8 bf16):
// thread t (t = warp * 32 + lane) of T = 32 * warps takes chunks t, t + T, t + 2T, ... in ascending order,
// W streamed with L1-bypassing 16-byte loads, x read through the read-only cache. Summation order: per
// thread, acc = fmaf(x, w, acc) over its chunks in ascending order, the 8 elements of a chunk in order;
// then an xor butterfly 16, 8, 4, 2, 1 in each warp; then the warps' sums in ascending warp order.
//
// Tensor cores (tensor_cores true; for M up to 8 the FMAs no longer compete with the loads): a block owns
// 8 rows of W (fused: 4 gate + 4 up rows), the n = 8 side of mma.m16n8k16 (x is the m side, rows >= M
// zero). K is cut into 32-element blocks; warp w takes blocks w, w + warps, ... in ascending order; in a
// block, lane (g, t) = (lane / 4, lane % 4) loads the 16-byte chunk t of W row g and of x row g, and the
// two mma of the block take the chunk's elements {0-3} and {4-7} (a permutation of k, the same for x
// and W, so the products are those of the dot product). Each warp's block sums are accumulated by the
// mma chain (fp32, the tensor core's own order, deterministic), then the warps' sums in ascending order.
// With tiles = 2 or 4 a block owns 16 or 32 rows (fused: half gate, half up rows), as that many 8-row
// tiles: lane (g, t) loads chunk t of rows g, g + 8, ... and of x row g once for all of them, and each tile
// has its own mma chain in the same order, so a row's sums are those of the one-tile kernel's order (the
// same bits need not follow: the tile kernels are other configs). x is read once per block and K block, so
// its traffic through L1 and L2 is W's times M / (8 tiles): at M = 8 one tile reads as many x bytes as W
// bytes (measured at 43-62 % of the copy rate: H200, 2026-12-02, `2937c4b`), four tiles a quarter. The tuner
// offers them from the M = 2 bucket: at M = 1 the one-tile configs keep the fused forms (gemv_fusable).
//
// Rows beyond N are clamped onto row N - 1 and never stored. For a given config the order is fixed, so
// two runs are bitwise equal, and a row's result does not depend on M, on its place in the block or on
// the epilogue. Different configs may differ in the last bits (like two split-K tactics). Tolerance
// against an fp64 reference as for the cuBLASLt GEMM: relative Frobenius error <= 2^-8 bf16 out, <= 1e-5
// f32 out.
//
// Fused epilogue (gemv_silu_mul): g = bf16(dot(x, W[j])), u = bf16(dot(x, W[I + j])) (the values the
// plain GEMV would store), act[m, j] = bf16(float(bf16(g / (1 + expf(-g)))) * u): the formula and the
// rounding points of elementwise.h's silu_mul, so fused == gemv (same config) then silu_mul, bitwise.
//
// Add + RMSNorm epilogue (gemv_add_rms_norm, the O and down projections followed by the residual add and
// the next RMSNorm): every block stores its bf16 outputs into tmp exactly as the bf16 epilogue does, then
// counts itself done on a per-device counter (every thread: __threadfence after its stores; __syncthreads;
// thread 0: atomicAdd). The block that sees count == blocks - 1 is the last one: it resets the counter to 0
// (so the next launch, a graph replay included, starts from 0), fences, and its warps run norm_row.cuh's
// rms_norm_row (the rms_norm kernel's own row function, add = true, tmp read through L2) over the M rows
// (warp w: rows w, w + warps, ...). So tmp, residual and normed are bitwise those of gemv (same config) then
// elementwise.h's rms_norm with add.
// The counter (one __device__ word per device) is safe for any number of fused launches on one stream,
// inside a graph or not: a launch's blocks touch it only after pdl_wait (griddepcontrol.wait, a no-op
// without PDL), which returns once every earlier kernel in the stream has completed and flushed
// (transitively: each of them waited on its own predecessor before completing), and the previous fused
// launch's last block reset the counter before it completed. It is not safe for two fused launches in flight
// at once on two streams of one device (they would share the count); kiln runs a model's forward on one
// stream. PDL: as gemv; a dependent reads nothing before its own griddepcontrol.wait, which waits for this
// whole grid (the tail included) to complete and its writes (tmp, residual, normed) to be visible. The last
// block is resident when it runs the tail and waits on no other block, so an early dependent cannot starve
// it.
//
// Residual-norm prologue (gemv_norm_in, the QKV and gate_up projections that follow a residual add and an
// RMSNorm): x is not read; every block computes it into shared memory first, h = bf16(residual + delta) and
// x = rms_norm(h) * norm_w for the M rows, with norm_row.cuh's chunk arithmetic in rms_norm_row's summation
// order (each row's squares by one warp, lane l over chunks l, l + 32, ...), then runs the dot products of
// the plain kernel (same config, same order) on it: any W8A16 / bf16 config, the multi-tile tensor-core ones
// included (gemv_norm_in_fusable: at M = 4 and 8 they win the QKV and gate_up shapes, and without a prologue
// form a verify step ran the rms_norm kernel before each). So out (and act for silu_mul) is bitwise rms_norm
// with add (elementwise.h) then gemv, and residual is rewritten with the same h. Every block reads all of the
// residual; each block counts itself on a per-device counter once its reads have returned (after a
// __syncthreads), and the block that counts last, when every other block has read, writes h back and resets
// the counter to 0. The normed rows are never stored. Safe for any number of launches on one stream, in a
// graph or not (the count is touched after pdl_wait, as the add + RMSNorm epilogue's), not for two launches
// in flight at once on two streams of one device. Before the prologue (and before the PDL wait) its blocks
// issue their first round of W loads into registers, as the plain GEMV does, prefetch the rest of their
// W slice towards L2 (the first round's chunks not again) and its second row group's slice too, and stage
// the norm weight into shared memory; a block with another row group to run issues that group's first round
// before the current one's reduction and stores, and prefetches the slice two groups ahead as it starts one.
// So the W stream overlaps the norm (the first round: 0.6B 1.047 -> 1.030 ms a token, 4B unchanged; H200,
// 2026-12-02, `db1b288`; the weight and the count off the squares' path: 4B QKV 13.4 -> 12.5 µs, 2026-12-02,
// `8fe5dd7`: bench/results/h200_norm_in_prologue_2026-12-02.txt). PDL: as gemv.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

constexpr int64_t kGemvMaxM = 8;

enum class GemvEpilogue : uint8_t { bf16, f32, silu_mul };

struct GemvConfig {
  int warps = 4;              // warps per block, one of 2, 4, 8, 16 (they split K)
  bool tensor_cores = false;  // the mma kernel (8 rows a tile) instead of the FMA one (4 rows a block)
  int tiles = 1;              // tensor cores: 8-row tiles a block owns, 1, 2 or 4 (FMA: 1); W8A8: 16-row
  // The W8A8 kernel (gemv_w8a8.h; block-FP8 W only, tensor_cores set): 128-K blocks whose W loads a warp
  // issues together, 1, 2 or 4. 0: the W8A16 / bf16 kernels above.
  int w8a8 = 0;
  // The e4m3 x 16 format ("e4m3 x 16" above; block-FP8 W only, the FMA kernel, 8 rows a block): 16-byte
  // chunks of 16 e4m3, the block scale applied to each chunk's sum. false: the kernels above.
  bool e4m3x16 = false;
  // e4m3 x 16: the W rows a block owns at M <= 2, 8 (the first form) or 4 (the lighter form: each row's
  // chunk decoded just before its products, 2 chunk steps a round; gemv_weights.cuh: Fp8x16LightWeights).
  // The same bits for the same warps. 8 for every other config.
  int x16_rows = 8;
  bool operator==(const GemvConfig&) const = default;
};

// A GEMV's weight W [N, K]: bf16 (scale null; data 16-byte aligned) or block-FP8: e4m3 (data 8-byte
// aligned) with f32 block scales [ceil(N/128), ceil(K/128)] contiguous (4-byte aligned). Row stride ld
// (elements): a multiple of 8, >= K.
struct GemvWeight {
  const void* data = nullptr;
  int64_t ld = 0;
  const float* scale = nullptr;
  constexpr bool is_fp8() const { return scale != nullptr; }
};

// Every configuration (the tuner times them all; the tests and the benchmark cover them all).
inline constexpr GemvConfig kGemvConfigs[] = {{2, false},   {4, false},   {8, false},   {16, false},
                                              {2, true},    {4, true},    {8, true},    {16, true},
                                              {2, true, 2}, {4, true, 2}, {8, true, 2}, {16, true, 2},
                                              {2, true, 4}, {4, true, 4}, {8, true, 4}, {16, true, 4}};

// The W8A8 kernel's configurations (gemv_w8a8.h), offered for block-FP8 weights only: warps x (16-row
// tiles, 128-K blocks in flight per warp) with tiles x blocks <= 4 (the registers of a round; one tile and
// one block: the fewest registers, the most resident warps); 4 or 8 warps where two tiles or more hold 64
// registers of W (16 warps would cap them at 128 registers and spill).
inline constexpr GemvConfig kGemvW8a8Configs[] = {
    {4, true, 1, 2}, {8, true, 1, 2}, {16, true, 1, 2}, {4, true, 1, 4}, {8, true, 1, 4}, {16, true, 1, 4},
    {4, true, 2, 1}, {8, true, 2, 1}, {16, true, 2, 1}, {4, true, 2, 2}, {8, true, 2, 2}, {4, true, 4, 1},
    {8, true, 4, 1}, {4, true, 1, 1}, {8, true, 1, 1},  {16, true, 1, 1}};

// The e4m3 x 16 configurations, for block-FP8 weights only: the FMA kernel with 2 to 16 warps, 8 rows a block
// at M <= 2, then the lighter form's (4 rows). The tuner offers them unless KILN_GEMV_E4M3X16=0 (gemm.h).
// Registers a thread at M = 1, 8 rows / 4 rows (ptxas -v, nvcc 13.0, sm_90a): plain GEMV 126 / 73 (f32 126 /
// 73, silu_mul 122 / 73), add + RMSNorm tail 122 / 100, residual-norm prologue 128 / 78-85, attention
// preparation 122 / 112. At M = 2 the 8-row form compiles to 64 registers and a 928-byte stack (1.7-2.1 KB of
// spill stores a thread), the 4-row one to 96 (plain) to 119 without spills.
inline constexpr GemvConfig kGemvE4m3x16Configs[] = {{.warps = 2, .e4m3x16 = true},
                                                     {.warps = 4, .e4m3x16 = true},
                                                     {.warps = 8, .e4m3x16 = true},
                                                     {.warps = 16, .e4m3x16 = true},
                                                     {.warps = 2, .e4m3x16 = true, .x16_rows = 4},
                                                     {.warps = 4, .e4m3x16 = true, .x16_rows = 4},
                                                     {.warps = 8, .e4m3x16 = true, .x16_rows = 4},
                                                     {.warps = 16, .e4m3x16 = true, .x16_rows = 4}};

// W rows a block owns (an e4m3 x 16 config: at M <= 2; gemv_block_rows for any M).
constexpr int gemv_rows(GemvConfig c) {
  return c.w8a8 ? 16 * c.tiles : c.tensor_cores ? 8 * c.tiles : c.e4m3x16 ? c.x16_rows : 4;
}
// W rows a block owns at M = m: gemv_rows, except 4 for an e4m3 x 16 config at M > 2.
constexpr int gemv_block_rows(GemvConfig c, int64_t m) {
  return c.e4m3x16 && m > 2 ? 4 : gemv_rows(c);
}

// True for the configurations the fused tails run (gemv_add_rms_norm, gemv_attn_prep.h): one tile of the
// W8A16 / bf16 kernels (the e4m3 x 16 configs included). The tuner times the fused forms only for those; a
// fused op given another (a multi-tile or a W8A8 config) falls back to its unfused form (ops_cuda.cpp).
constexpr bool gemv_fusable(GemvConfig c) {
  return c.tiles == 1 && c.w8a8 == 0;
}

// True for the configurations the residual-norm prologue runs (gemv_norm_in): every W8A16 / bf16 config, the
// multi-tile tensor-core ones included (a verify step's M = 4 and 8 tactics; the W8A8 configs have their own
// prologue, gemv_w8a8_norm_in).
constexpr bool gemv_norm_in_fusable(GemvConfig c) {
  return c.w8a8 == 0;
}

// True when cfg is one of kGemvConfigs, kGemvW8a8Configs or kGemvE4m3x16Configs.
constexpr bool gemv_known_config(GemvConfig c) {
  for (const GemvConfig& k : kGemvConfigs)
    if (k == c) return true;
  for (const GemvConfig& k : kGemvW8a8Configs)
    if (k == c) return true;
  for (const GemvConfig& k : kGemvE4m3x16Configs)
    if (k == c) return true;
  return false;
}

// True when an e4m3 x 16 config can read this W: block-FP8, K and the row stride multiples of 16, the data
// 16-byte aligned (16-byte chunks), the scales 4. The other configs: true.
bool gemv_weight_fits(GemvConfig c, const GemvWeight& w, int64_t k);

// True when gemv can run this call: 1 <= m <= 8, k % 8 == 0, n >= 1, row strides multiples of 8, and
// (for silu_mul) n even. Alignment of the pointers is checked by gemv itself.
bool gemv_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo, GemvEpilogue epi);

// True when gemv takes this call with config cfg, pointer alignment included: gemv_supported and W's
// alignment (GemvWeight) for the W8A16 / bf16 configs; for a W8A8 config (w8a8 > 0), a block-FP8 W,
// gemv_w8a8_supported (gemv_w8a8.h: K a multiple of 16, W 16-byte aligned with ldw a multiple of 16, the
// shared memory, an sm_89+ device). x and out 16-byte aligned either way. Where it says no, the caller takes
// another path (GemmEngine::run, ops_cuda.cpp).
bool gemv_takes(GemvConfig cfg, const void* x, int64_t ldx, const GemvWeight& w, const void* out, int64_t ldo,
                int64_t m, int64_t n, int64_t k, GemvEpilogue epi);

// bf16 / f32 epilogue: out[m, n] (row stride ldo, elements of the output type) = x[m, :] · W[n, :].
// silu_mul: W is the concatenated gate_up weight [n = 2I, K]; out is act [M, I] bf16 (row stride ldo).
// A W8A8 config (w8a8 > 0) runs gemv_w8a8 (gemv_w8a8.h: its contract, rounding points and guards).
// x, W: bf16 row-major with row strides ldx, ldw (elements); W may be block-FP8 (GemvWeight). x, W, out
// 16-byte aligned (e4m3 W: 8, its scales 4); strides multiples
// of 8; ldx >= k, ldw >= k, ldo >= n (silu_mul: >= n / 2). out must not alias x or W. m == 0 is a no-op;
// m > 8 or any other violation throws kiln::Error before anything is launched. pdl: programmatic
// dependent launch: every block issues its first round of W loads, waits for its predecessor's writes
// (griddepcontrol.wait) before reading x, then at once lets the next kernel launch
// (griddepcontrol.launch_dependents), whose blocks take free SM slots, issue their own W loads and wait in
// turn for this whole grid to complete: the W streams of consecutive GEMVs overlap the launch gap and each
// other's tails. So W must not be written by an earlier kernel on the stream (model weights are not). An L2
// prefetch of the first W chunks before the wait measured slower (H200, 2026-12-02, `af20cce`;
// bench/results/h200_pdl_decode_step_2026-12-02.txt).
void gemv(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
          int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl = false);
inline void gemv(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
                 int64_t n, int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream,
                 bool pdl = false) {
  gemv(x, ldx, GemvWeight{w, ldw, nullptr}, out, ldo, m, n, k, epi, cfg, stream, pdl);
}

// True when gemv_add_rms_norm can run this call: gemv_supported for the bf16 epilogue, n % 8 == 0 (the norm's
// 16-byte chunks), and the tmp, residual and normed row strides multiples of 8, >= n.
bool gemv_add_rms_norm_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldt,
                                 int64_t ldr, int64_t ldn);

// tmp[m, :] = bf16(x[m, :] · W^T) (gemv's bf16 epilogue, same config: bitwise the same), then
// rms_norm(tmp, residual, norm_w, normed, eps, add = true) over the m rows (elementwise.h: residual <- bf16(
// residual + tmp), normed = the RMSNorm of the new residual), bitwise the rms_norm kernel's result. x, W: as
// gemv; tmp, residual, normed: bf16 [m, n] with row strides ldt, ldr, ldn (multiples of 8, >= n); norm_w:
// bf16 [n]. All pointers 16-byte aligned; no two of x, W, tmp, residual, normed, norm_w overlap. eps >= 0. m
// == 0 is a no-op; any violation throws kiln::Error before anything is launched. pdl: as gemv (see above for
// the ordering of the epilogue). Not for concurrent use on two streams of one device (see above).
void gemv_add_rms_norm(const void* x, int64_t ldx, const GemvWeight& w, void* tmp, int64_t ldt,
                       void* residual, int64_t ldr, const void* norm_w, void* normed, int64_t ldn, int64_t m,
                       int64_t n, int64_t k, float eps, GemvConfig cfg, cudaStream_t stream,
                       bool pdl = false);
inline void gemv_add_rms_norm(const void* x, int64_t ldx, const void* w, int64_t ldw, void* tmp, int64_t ldt,
                              void* residual, int64_t ldr, const void* norm_w, void* normed, int64_t ldn,
                              int64_t m, int64_t n, int64_t k, float eps, GemvConfig cfg, cudaStream_t stream,
                              bool pdl = false) {
  gemv_add_rms_norm(x, ldx, GemvWeight{w, ldw, nullptr}, tmp, ldt, residual, ldr, norm_w, normed, ldn, m, n,
                    k, eps, cfg, stream, pdl);
}

// Shared memory the residual-norm prologue may use (M rows of K bf16, each padded by 64 bytes, and the norm
// weight).
constexpr int64_t kGemvNormInMaxSmem = 160 * 1024;

// True when gemv_norm_in can run this call: gemv_supported (x's stride taken as K), delta and residual row
// strides multiples of 8 and >= K, and the prologue's rows within kGemvNormInMaxSmem.
bool gemv_norm_in_supported(int64_t m, int64_t n, int64_t k, int64_t ldd, int64_t ldr, int64_t ldw,
                            int64_t ldo, GemvEpilogue epi);

// residual[m, :] <- h = bf16(residual[m, :] + delta[m, :]); out = gemv(rms_norm(h) * norm_w, W) with the
// epilogue epi: bitwise rms_norm(delta, residual, norm_w, normed, eps, add = true) (elementwise.h) then gemv
// (same config) on normed, without storing normed. delta, residual: bf16 [m, K] (row strides ldd, ldr);
// norm_w: bf16 [K]; W, out, ldo, epi: as gemv. All pointers 16-byte aligned; residual overlaps none of the
// others, out overlaps none. eps >= 0. m == 0 is a no-op; any violation throws kiln::Error before anything is
// launched. Not for concurrent use on two streams of one device (see above). groups_per_block: the row groups
// (of gemv_rows(cfg) W rows) each block takes after its prologue, 0: as many as one wave of resident blocks
// needs. The same bits for any value. A W8A8 config runs gemv_w8a8_norm_in (gemv_w8a8.h: its guards; one
// wave of blocks, groups_per_block ignored).
void gemv_norm_in(const void* delta, int64_t ldd, void* residual, int64_t ldr, const void* norm_w, float eps,
                  const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                  GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl = false,
                  int groups_per_block = 0);
inline void gemv_norm_in(const void* delta, int64_t ldd, void* residual, int64_t ldr, const void* norm_w,
                         float eps, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m, int64_t n,
                         int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl = false,
                         int groups_per_block = 0) {
  gemv_norm_in(delta, ldd, residual, ldr, norm_w, eps, GemvWeight{w, ldw, nullptr}, out, ldo, m, n, k, epi,
               cfg, stream, pdl, groups_per_block);
}

// Register cap of the tensor-core kernel when it carries a tail (the add + RMSNorm here, the attention
// preparation in gemv_attn_prep.h). The plain tensor-core GEMV compiles to 38 registers; the tails' locals
// raise the whole kernel to 100-113 (a third of the resident 512-thread blocks). 3: __launch_bounds__(512,
// 3), 40 registers, the plain kernel's occupancy, the tail's locals spilled to local memory (0.4-0.5 KB per
// thread, in the finishing block only). 0: no cap. Read once from KILN_GEMV_TAIL_MIN_BLOCKS (0 or 3), default
// 3. The arithmetic is the same either way, so are the bits.
int gemv_tail_min_blocks();

}  // namespace kiln::cuda
