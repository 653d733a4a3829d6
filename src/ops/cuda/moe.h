// The sparse MLP's kernels (ops/moe.h is the contract): raw pointers, no engine headers. One step of
// moe_mlp on the GPU is, on one stream and with no host synchronisation (capturable in a CUDA graph):
//   1. moe_route_launch:    logits -> experts, weights (bitwise ops/moe.h) and, per 32-token chunk, each
//                           pair's rank among the chunk's pairs of the same expert and the chunk's counts;
//                           for T <= kMoeRouterMaxTokens moe_router_route_launch computes the logits too
//                           (ops/moe.h's canonical router order) and routes in the same launch, for
//                           T <= 8 also the residual add and RMSNorm before it (MoeNormIn)
//   2. moe_permute_launch:  counts per expert, offsets padded to kMoeRowTile, the tile -> expert map, the
//                           list of experts chosen by some token; then the sorted pair list (pair =
//                           t * k + slot; -1 on padding rows) and its inverse. With one chunk (T <= 32, the
//                           decode sizes) the route kernel does this itself and moe_permute_launch nothing.
//   4. the experts: moe_grouped_gemm_launch (tensor cores, large batches) or moe_gather_gemv_launch (small
//      batches) for gate_up with SiLU-and-multiply into act, then for down into y (bf16 rows, sorted order);
//      block-FP8 experts on a grouped GEMM either first dequantized, those with rows, into the scratch (then
//      the bf16 GEMM), or (W8A8, MoeShape::fp8_w8a8) their inputs quantized per row and 128-group to e4m3
//      in sorted order and the e4m3 x e4m3 grouped GEMM run on them (moe_grouped_gemm_fp8_sm90.cu)
//   5. moe_combine_launch:  out[t] = bf16(sum over t's slots in ascending expert index of y * weight)
//      (at batch 1, moe_experts_combine_launch: down and the combine in one kernel, the same bits)
// Rows of an expert are its pairs in ascending token order, so the layout is deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

constexpr int kMoeRowTile = 64;           // the grouped GEMM's row tile: each expert's rows padded to it
constexpr int kMoeChunkTokens = 32;       // tokens of one routing block (one bit each of a 32-bit mask)
constexpr int kMoeMaxExperts = 1024;      // the offsets kernel's block
constexpr int kMoeRouteMaxExperts = 512;  // the route kernel keeps E / 32 logits per lane in registers
constexpr int kMoeRouterMaxTokens = 64;   // the fused router + route kernel's batch (one counter a chunk)

// Device scratch of one moe_mlp call, carved by moe_scratch_layout from one buffer (moe_mlp.cpp).
struct MoeBuffers {
  uint16_t* logits;       // bf16 [T, E]
  int32_t* experts;       // i32 [T, k]
  uint16_t* weights;      // bf16 [T, k]
  int32_t* rank;          // i32 [T * k]: the pair's rank among its chunk's pairs of the same expert
  int32_t* chunk_counts;  // i32 [chunks, E]; rewritten by moe_permute_launch to each chunk's first row
  int32_t* counts;        // i32 [E]: 0 for an expert outside the rank's [expert_begin, expert_end)
  int32_t* offsets;       // i32 [E + 1]: padded start rows, offsets[E] = rows used
  int32_t* tile_expert;   // i32 [max_tiles]
  int32_t* num_tiles;     // i32 [1]
  int32_t* active;        // i32 [E]: experts with a pair, ascending; then num_active at active[E]
  int32_t* sorted_pair;   // i32 [max_rows]
  int32_t* inverse;       // i32 [T * k]: the pair's row in sorted order; -1: another rank's expert
  uint16_t* act;          // bf16 [max_rows, I]
  uint16_t* y;            // bf16 [max_rows, H]
  // Block-FP8 experts on a grouped GEMM (MoeShape::fp8_dequant; else nullptr): the local experts dequantized
  // (fp8_dequant.h dequantize_fp8_experts; only those with rows written), L = MoeShape::local_experts().
  // 30B-A3B: 128 x 3 x 768 x 2048 x 2 B = 1.21 GB. Carved last, so the parts above sit where they would
  // without.
  uint16_t* gate_up_bf16;  // bf16 [L, 2I, H]
  uint16_t* down_bf16;     // bf16 [L, H, I]
  // Block-FP8 experts on the W8A8 grouped GEMM (MoeShape::fp8_w8a8; else nullptr): one projection's inputs
  // quantized in sorted row order (gate_up: x at each row's token, K = H; then down: act, K = I), reused by
  // the two projections in turn. Rows K bytes apart; the scales MN-major (kb * max_rows + row, as
  // fp8_gemm.h's xs), so a 64-row tile's scales of one K block are one 256-byte bulk copy. 30B-A3B at T =
  // 1024: 16,384 x 2048 B + 16 x 16,384 x 4 B = 34.6 MB. Carved last, as the bf16 copy (never both).
  uint8_t* act_q;  // e4m3 [max_rows, max(H, I)]
  float* act_qs;   // f32 [ceil(max(H, I) / 128), max_rows]
};

struct MoeShape {
  int64_t T = 0, E = 0, k = 0, H = 0, I = 0;
  // Expert parallelism (ops/moe.h): the experts' weights hold router experts [expert_begin, expert_begin +
  // local) (their index 0 is expert_begin); local 0: all E. The routing is over all E; pairs of other
  // experts get no sorted row (inverse -1), no count, no tile, and the combine skips them.
  int64_t expert_begin = 0, local = 0;
  // Block-FP8 experts run on a grouped GEMM: the scratch holds their bf16 copy (MoeBuffers::gate_up_bf16).
  bool fp8_dequant = false;
  // Block-FP8 experts run on the W8A8 grouped GEMM: the scratch holds the quantized inputs
  // (MoeBuffers::act_q). Exclusive with fp8_dequant.
  bool fp8_w8a8 = false;
  int64_t expert_end() const { return local > 0 ? expert_begin + local : E; }
  int64_t local_experts() const { return expert_end() - expert_begin; }
  int64_t chunks() const { return (T + kMoeChunkTokens - 1) / kMoeChunkTokens; }
  // Sum over experts of ceil(count / tile) <= ceil(T k / tile) + min(E, T k).
  int64_t max_tiles() const {
    const int64_t pairs = T * k;
    return (pairs + kMoeRowTile - 1) / kMoeRowTile + (E < pairs ? E : pairs);
  }
  int64_t max_rows() const { return max_tiles() * kMoeRowTile; }
};

// Bytes of scratch for shape s (every part 256-byte aligned) and the carving of `base` into MoeBuffers.
size_t moe_scratch_bytes(const MoeShape& s);
MoeBuffers moe_scratch_layout(const MoeShape& s, void* base);

// 1. logits bf16 [T, E] (row stride ls) -> b.experts, b.weights, b.rank, b.chunk_counts.
void moe_route_launch(const uint16_t* logits, int64_t ls, const MoeShape& s, bool norm_topk_prob,
                      const MoeBuffers& b, cudaStream_t stream);
// The residual add and RMSNorm before the sparse MLP (elementwise.h's add_rms_norm): residual <- h =
// bf16(residual + delta), normed = rms_norm(h) * weight. bf16 [T, H] with row strides ds, rs, ns
// (multiples of 8), weight bf16 [H]; 16-byte aligned; none overlapping another.
struct MoeNormIn {
  const uint16_t* delta = nullptr;
  int64_t ds = 0;
  uint16_t* residual = nullptr;
  int64_t rs = 0;
  const uint16_t* weight = nullptr;
  uint16_t* normed = nullptr;
  int64_t ns = 0;
  float eps = 0.0f;
};
constexpr int64_t kMoeRouterNormInMaxTokens = 8;  // the norm prologue: one block row of tokens
// The fused router's H: up to 8 + 1 rows of H in shared memory.
constexpr int64_t kMoeRouterMaxHidden = 8192;

// 1 with the router: x bf16 [T, H] (row stride xs, a multiple of 8; H % 8 == 0), router bf16 [E, H]
// contiguous -> b.logits (bf16 [T, E], ops/moe.h's canonical order: bitwise ops::cpu::moe_router_logits),
// then what moe_route_launch writes, bitwise. T <= kMoeRouterMaxTokens, H <= kMoeRouterMaxHidden.
// Not for two launches in flight at once on two streams of one device (a per-device counter a chunk, as
// gemv.h's fused tails).
// norm (T <= kMoeRouterNormInMaxTokens, H <= kMoeRouterMaxHidden): x is norm->normed, computed by the
// same launch (MoeNormIn), bitwise add_rms_norm then this launch on its output.
// Two forms of the same bits (moe_router.cu): the cluster form (T <= 8, E <= 128, an sm_90 device,
// KILN_MOE_ROUTER_CLUSTER not 0; the logits gathered in one block's shared memory) and the counter form
// (otherwise; the last block on a per-chunk global counter routes). counter_only: the counter form wherever
// (tests and bench compare them).
void moe_router_route_launch(const uint16_t* x, int64_t xs, const uint16_t* router, const MoeShape& s,
                             bool norm_topk_prob, const MoeBuffers& b, cudaStream_t stream,
                             const MoeNormIn* norm = nullptr, bool counter_only = false);
// 2.
void moe_permute_launch(const MoeShape& s, const MoeBuffers& b, cudaStream_t stream);

// Switches of the paths new since `2f94697` (the path that passed on the H100 there stays one switch away),
// read once from the environment, "0" or "1"; unset: the default below.
//   KILN_MOE_ROUTER_CLUSTER (default kMoeRouterClusterDefault, on): the fused router's cluster form at
//     T <= 8; 0: the counter form at every T (moe_router_route_launch). On the H100 (2026-12-07, `87cd461`)
//     7.70 / 14.12 us at T = 1 / 8 against the counter form's 8.14 / 15.28 in the same run (docs/PERF.md
//     E16).
//   KILN_MOE_FP8_WIDE_LOADS (default kMoeFp8WideLoadsDefault, off): block-FP8 experts read 16 bytes a lane
//     in the gather GEMV and the fused down + combine; 0: 8 bytes and a scale load a chunk, the kernels of
//     `2f94697`. The same bits either way (tested on the H100); off until timed faster: its T = 1 decode
//     path measured 27.79 us at `c32d2e9` against the 8-byte form's 25.55 in an earlier run (E4).
//   KILN_MOE_FP8_E4M3X16 (default kMoeFp8E4m3x16Default, on): block-FP8 experts in the gather GEMV and the
//     fused down + combine run path (d) of ops/fp8_linear.h ("e4m3 x 16", the dense GEMV's format) instead
//     of path (c): per lane the 16-element chunks l, l + 32, ... of a row, a 16-byte e4m3 load and the
//     block's scale each, the e4m3 decoded exactly in integer arithmetic (no conversion instructions), the
//     chunk's 16 products summed by fmaf from +0, then acc = fmaf(sum, s, acc); the xor butterfly 16 .. 1;
//     one warp a row: ops::linear_fp8_chunk16 with 32 threads, bitwise, for gate, up and down, then the
//     rounding points of moe_experts_launch (below). Other bits than path (c)'s (the weight is never rounded
//     to bf16), so KILN_MOE_FP8_WIDE_LOADS does not apply where it runs; 0: path (c). On the H100
//     (2026-12-07, kiln of `36e733e`, docs/PERF.md E17) the gather GEMV at T = 4 / 8 took 78.85 / 141.64 us
//     against path (c)'s 86.76 / 153.54, and the 30B-A3B FP8 decode step at batch 1 3.307-3.325 ms against
//     3.732-3.744 (alternating in one run; batch 8, where the W8A8 grouped GEMM runs, unchanged).
constexpr bool kMoeRouterClusterDefault = true;
constexpr bool kMoeFp8WideLoadsDefault = false;
constexpr bool kMoeFp8E4m3x16Default = true;
bool moe_router_cluster_enabled();
bool moe_fp8_wide_loads();
// Overrides KILN_MOE_FP8_WIDE_LOADS for this process (tests and benchmarks compare both forms).
void moe_set_fp8_wide_loads(bool on);
bool moe_fp8_e4m3x16();
// Overrides KILN_MOE_FP8_E4M3X16 for this process (tests and benchmarks compare the forms).
void moe_set_fp8_e4m3x16(bool on);

// Which expert kernel (4): the mma.sync grouped GEMM (any sm_80+), the wgmma one (sm_90a), the gather GEMV,
// the W8A8 e4m3 wgmma one (sm_90a; block-FP8 experts only, MoeShape::fp8_w8a8).
enum class MoeExpertKernel { grouped_gemm, grouped_gemm_sm90, gather_gemv, grouped_gemm_fp8_sm90 };
bool moe_grouped_gemm_sm90_applies();
// The W8A8 grouped GEMM: an sm_90 device running the build's sm_90a code, with the driver's tensor maps.
bool moe_grouped_gemm_fp8_sm90_applies();

// Block-FP8 experts' scales (ops/moe.h): gate_up f32 [E, 2I/128, ceil(H/128)], down f32 [E, H/128,
// ceil(I/128)], contiguous; both nullptr for bf16 experts.
struct MoeFp8Scales {
  const float* gate_up = nullptr;
  const float* down = nullptr;
  bool fp8() const { return gate_up != nullptr; }
};

// 4, gate_up: act[row] = silu_and_mul(x[token of row] . gate_up[e]^T) for every sorted row of expert e.
//   x bf16 [T, H] row stride xs; gate_up bf16 (or with scales e4m3) [E, 2I, H] contiguous.
// 4, down: y[row] = bf16(act[row] . down[e]^T); down bf16 (or e4m3) [E, H, I] contiguous.
// Block-FP8 experts (scales set): on the gather GEMV each e4m3 weight widened to bf16(f32(q) * s) in
// registers before its product; on a grouped GEMM (s.fp8_dequant needed, else an error) the experts with rows
// dequantized first into b.gate_up_bf16 / b.down_bf16 (dequantize_fp8_experts, reading b.counts on the
// device), then the bf16 GEMM on them. Either way the result is the same kernel's on the bf16 values
// dequantize_fp8 gives, bitwise (path (c)). With moe_fp8_e4m3x16() the gather GEMV runs path (d) instead:
// gate, up and each down row ops::linear_fp8_chunk16 with 32 threads, bitwise, then gate and up rounded to
// bf16, SiLU-and-multiply (silu_mul_f32), act bf16, y bf16. grouped_gemm_fp8_sm90 (block-FP8 experts and
// s.fp8_w8a8 only): path (a) of ops/fp8_linear.h instead, W8A8 (moe_grouped_gemm_fp8_sm90.cu): each
// projection's inputs quantized per row and 128-group to e4m3 (bitwise ops::quantize_act_fp8), e4m3 x e4m3
// products promoted every 128 K with a_s * w_s, the dense rounding points after (gate and up bf16,
// SiLU-and-multiply, act bf16; y bf16).
void moe_experts_launch(MoeExpertKernel kernel, const uint16_t* x, int64_t xs, const void* gate_up,
                        const void* down, const MoeShape& s, const MoeBuffers& b, cudaStream_t stream,
                        MoeFp8Scales scales = {});
// 4 and 5 for decode batches: the gate_up gather GEMV, then down and the combine in one kernel (each block
// sums a token's k experts for its columns): out bf16 [T, H] row stride os, bitwise the gather GEMV then
// moe_combine_launch (y left in the scratch as they leave it).
void moe_experts_combine_launch(const uint16_t* x, int64_t xs, const void* gate_up, const void* down,
                                const MoeShape& s, const MoeBuffers& b, uint16_t* out, int64_t os,
                                cudaStream_t stream, MoeFp8Scales scales = {});
// 5. out bf16 [T, H] row stride os.
void moe_combine_launch(const MoeShape& s, const MoeBuffers& b, uint16_t* out, int64_t os,
                        cudaStream_t stream);

}  // namespace kiln::cuda
