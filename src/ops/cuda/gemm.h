// BF16 GEMM through cuBLASLt with an on-disk tactic cache (the autotuner).
//
// Contract: out[M, N] = x[M, K] · W[N, K]^T. x, W: bf16, row-major, row strides >= K. Any M, N, K >= 1
// (issue 41: a vocabulary of 151,669 as an LM head's N and output stride). Dispatch, in order:
//   - K, the input strides not multiples of 8 or an input not 16-byte aligned (no Qwen3 checkpoint): the
//     any-shape kernel (gemm_any.h), correct for every shape, not fast;
//   - the tuned GEMV (any N and output stride);
//   - cuBLASLt on the caller's output where its stride is a multiple of 8 and it is 16-byte aligned (every
//     shape of a Qwen3 model with an even vocabulary): the fast path, unchanged;
//   - else cuBLASLt into an aligned staging buffer, then a 2-D copy into the output (the odd-vocabulary LM
//     head); the any-shape kernel where cuBLASLt has no algorithm or the buffer would grow in a graph
//     capture. cuBLASLt's bf16 kernels need 16-byte-aligned leading dimensions; the copy (M x N) is small
//     beside the N x K weight read, and padding the weight at load would not align the caller's logits rows.
// Accumulation in fp32 (CUBLAS_COMPUTE_32F); the result is rounded once, to bf16 (GemmOut::bf16) or
// stored as fp32 (GemmOut::f32, used for logits). Tolerance against an fp64 reference: relative
// Frobenius error <= 2^-8 for bf16 output, <= 1e-5 for f32 output (the inputs being bf16-exact).
// Split-K tactics change the summation order, so two tactics may differ in the last bf16 bit.
//
// Tactics: for each (M bucket, N, K, out dtype) the tuner times the heuristic's candidates and their
// split-K variants, and for M buckets <= 8 also kiln's own GEMV (gemv.h, one pseudo-tactic per block
// configuration, described "kiln-gemv warps W ..." or "kiln-gemv-tc warps W ..."), and keeps the fastest;
// where that is the GEMV on a bf16 output, it also times the GEMV with the residual-norm prologue
// (gemv_norm_in) against the add_rms_norm kernel then the GEMV, and marks the tactic (" +norm-in") where the
// prologue won. kiln's kernels are timed launched with PDL, as the decode graphs launch them (each call's
// W stream then overlaps the previous call's tail, which cuBLASLt's kernels cannot do). M bucket = the next
// power of two >= M (capped at 16384). Weights are rotated over copies that together exceed the L2 while
// timing, so every candidate reads W from HBM as a decode step does. The cache file ("kiln-gemm-tactics v7")
// starts with a key line (GPU name, CUDA runtime and cuBLASLt versions); a file
// whose key differs is ignored, one of another format version too, with a message (v1 is re-tuned; v2 to
// v6 are read). A cached cuBLASLt
// tactic is re-checked with cublasLtMatmulAlgoCheck before first use and replaced by the heuristic's first
// choice when the check fails. With no tuned entry the heuristic (cuBLASLt) runs: the GEMV is only used where
// the tuner measured it faster on this GPU.
//
// Block-FP8 weights (GemmWeight::fp8, run() with a GemvWeight): the shapes are keyed by the weight format
// too; the tuner times the FP8 GEMV configs, W8A16 (gemv.h) and W8A8 (gemv_w8a8.h), and the residual-norm
// prologue (where a W8A8 config won: its own prologue and the fastest one-tile W8A16 config's, against the
// add_rms_norm kernel then the W8A8 GEMV; GemmTactic::norm_in_gemv names a W8A16 winner) at M buckets <= 8,
// and at larger buckets every W8A8 GEMM config (fp8_gemm.h; the TMA-store epilogues clip at N:
// test_cuda_fp8_gemm; the split-K ones only where the unsplit config's tiles are fewer than the SMs, M <=
// kFp8GemmSplitKMaxM and the split is not clamped by K) against dequantizing the weight into a preallocated
// scratch then the bf16 dispatch (the portable path), storing an "fp8gemm" tactic where the W8A8 GEMM won and
// none where the scratch path did. The e4m3 x 16 GEMV configs (gemv.h) are offered for FP8 weights with K a
// multiple of 16 only with default (KILN_GEMV_E4M3X16=0 leaves them out: the tuner's offer as before them);
// KILN_GEMV_W8A8=0 leaves the W8A8 ones out. A cache holding an e4m3 x 16 tactic (word 7 = 1 or 2) runs it
// whatever the switch says. The cache file is "kiln-gemm-tactics v7"; v6 (no lighter e4m3 x 16 form), v5 (no
// split-K W8A8 GEMM), v4 (no e4m3 x 16 GEMV), v3 (no W8A8 GEMV) and v2 files (bf16 weights only) are read as
// well. run() grows the W8A8 workspace to the tactic's fp8_gemm_workspace_bytes(m, n, k, cfg) (a split
// config's partials; outside graph capture: the decode graphs' eager first step grows it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cuda/fp8_gemm.h"
#include "ops/cuda/gemv.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;  // the same declaration as CUDA's driver_types.h

namespace kiln::cuda {

enum class GemmOut : uint8_t { bf16, f32 };

// W's format: bf16, or block-FP8 (e4m3 with f32 128 x 128 block scales; gemv.h: GemvWeight).
enum class GemmWeight : uint8_t { bf16, fp8 };

struct GemmShape {
  int64_t m_bucket = 0, n = 0, k = 0;
  GemmOut out = GemmOut::bf16;
  GemmWeight weight = GemmWeight::bf16;
  auto operator<=>(const GemmShape&) const = default;
};

enum class GemmKind : uint8_t { cublaslt, gemv, fp8gemm };

struct GemmTactic {
  GemmKind kind = GemmKind::cublaslt;
  uint64_t algo[8] = {};    // cublaslt: cublasLtMatmulAlgo_t, opaque, valid for one cuBLASLt version
  GemvConfig gemv{};        // gemv: the kernel and block size (algo unused, stored as zeros)
  Fp8GemmConfig fp8gemm{};  // fp8gemm (block-FP8 weights): the W8A8 GEMM's config (fp8_gemm.h)
  // gemv: the GEMV with the residual-norm prologue (gemv.h: gemv_norm_in) measured faster than the
  // add_rms_norm kernel then this GEMV, when this shape's input is a residual add + RMSNorm.
  bool gemv_norm_in = false;
  // gemv_norm_in with a W8A8 gemv config (gemv_w8a8.h): the one-tile W8A16 config the prologue runs with,
  // where its time beat both the W8A8 GEMV's own prologue and the add_rms_norm kernel then the W8A8 GEMV;
  // unset otherwise (the prologue runs with gemv).
  std::optional<GemvConfig> norm_in_gemv;
  float us = 0;          // measured time at the bucket's M when tuned
  std::string describe;  // "algo 21 tile 17 stages 8 splitK 1 ..." / "kiln-gemv warps 4" for --show
};

int64_t gemm_m_bucket(int64_t m);

// One tactic-cache line (without the newline): "M N K out us kind w0 .. w7 # describe", out "bf16" or
// "f32" for a bf16 weight, "bf16:e4m3" or "f32:e4m3" for a block-FP8 one (v2 files have only the former),
// kind "lt", "fp8gemm" (w0 .. w5 = tile_n, stages, persistent, cluster, tma_store, split_k with 1 written
// as 0: v5 files, before split-K, read as split_k 1; w6, w7 = 0) or "gemv" (gemv: w0 = warps, w1 = 1 for the
// tensor-core kernel, w2 = 1 where the residual-norm prologue won, w3 = the tensor-core tiles when more than
// one, else 0: older caches read as one tile; w4 = the W8A8 kernel's K blocks in flight, 0 for the W8A16 /
// bf16 kernels (v3 files: always 0); with a W8A8 config and the prologue, w5 / w6 = the warps and tensor-core
// flag of the W8A16 config the prologue runs, 0 where it runs the W8A8 config's own (w6 = 2 or 3: an e4m3 x
// 16 config, w7's value + 1); else 0; w7 = 1 for an e4m3 x 16 config (gemv.h) of 8 rows, 2 for one of the
// lighter 4-row form (GemvConfig::x16_rows; v6 files: 1), v4 files: 0). parse_tactic_line returns false for
// a damaged line (bad field, unknown kind, a GEMV config that gemv does not take, the prologue with a config
// it does not run (gemv.h: gemv_norm_in_fusable), a W8A8 config for a bf16 weight, a GEMV tactic for a shape
// or M bucket that gemv_supported (W8A8: gemv_w8a8_shape_supported) refuses).
std::string format_tactic_line(const GemmShape& s, const GemmTactic& t);
bool parse_tactic_line(const std::string& line, GemmShape& s, GemmTactic& t);

// One per device and process (the model owns it): the cuBLASLt handle, a 32 MB workspace, tactics.
class GemmEngine {
 public:
  explicit GemmEngine(int device = 0);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // out = x · W^T; raw device pointers, row strides ldx, ldw, ldo in elements (>= k, k, n). Validates the
  // shape; enqueues on stream (the dispatch at the top of this file). Uses the tuned tactic for
  // (bucket(m), n, k, out): a GEMV tactic runs gemv (gemv.h; pdl passed on), a cuBLASLt one runs when it
  // passes AlgoCheck for this exact shape; otherwise the heuristic's first cuBLASLt choice.
  void run(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
           int64_t n, int64_t k, GemmOut out_type, cudaStream_t stream, bool pdl = false);
  void run(const void* x, const void* w, void* out, int64_t m, int64_t n, int64_t k, GemmOut out_type,
           cudaStream_t stream) {
    run(x, k, w, k, out, n, m, n, k, out_type, stream);
  }
  // The same for a weight of either format (gemv.h: GemvWeight). bf16: the run above. Block-FP8, by the
  // tuned tactic of (bucket(m), n, k, out, fp8) (above M = 8 the nearest tuned bucket's below where bucket(m)
  // has none: fp8_tactic_at_or_below): the FP8 GEMV (M <= 8; bitwise the bf16 GEMV with that config
  // on the dequantized weight), or the W8A8 GEMM (fp8_gemm.h; bf16 out) where fp8_gemm_supported holds and
  // its workspace (grown outside graph capture only: reserve_fp8_gemm) is large enough; otherwise the weight
  // is dequantized (path (c), bitwise) into a scratch bf16 [n, k] buffer and the bf16 run above takes it,
  // without PDL (its W was just written). The scratch grows outside graph capture only: reserve_fp8_dequant
  // before capturing, else a call that would grow it inside a capture throws naming the size.
  void run(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
           int64_t k, GemmOut out_type, cudaStream_t stream, bool pdl = false);
  // Grows the FP8 dequantization scratch to hold `elements` bf16 (the largest FP8 weight a model runs).
  void reserve_fp8_dequant(int64_t elements);
  int64_t fp8_dequant_dispatches() const { return fp8_dequant_dispatches_; }  // FP8 runs via the scratch
  // The tactic an FP8 weight's run() takes at M: that of bucket(m), else (bucket(m) > kGemvMaxM) of the
  // nearest tuned bucket below it down to 2 kGemvMaxM, else none. Startup tuning stops at M = 512
  // (model/cuda_tune.cpp) while prefill chunks run up to the chunked-prefill size: without the bucket below,
  // every such chunk took path (c), dequantizing each weight it multiplied, whatever the tuner had chosen at
  // 512.
  const GemmTactic* fp8_tactic_at_or_below(int64_t m, int64_t n, int64_t k, GemmOut out_type) const;
  // Grows the W8A8 GEMM's workspace to hold `m` rows of `k` (fp8_gemm_workspace_bytes).
  void reserve_fp8_gemm(int64_t m, int64_t k);
  int64_t fp8_gemm_dispatches() const { return fp8_gemm_dispatches_; }  // FP8 runs by the W8A8 GEMM

  // Pre-quantized inputs (issue 43): a producer of the projection's input (fp8_act_producers.h) writes the
  // W8A8 GEMM's workspace itself, then run_prequantized runs the GEMM alone (fp8_gemm_quantized). For an FP8
  // weight at M > kGemvMaxM only (decode sizes take the GEMV). fp8_gemm_takes: whether run() would take the
  // W8A8 GEMM for this call (the tactic of fp8_tactic_at_or_below is fp8gemm, fp8_gemm_supported holds for
  // the workspace's row stride K, W and out 16-byte aligned) and the fused producers are on; it allocates
  // nothing. fp8_gemm_input: where it takes, the workspace to fill for M rows of K (fp8_gemm.h's layout),
  // grown outside graph capture only; empty (data null) where fp8_gemm_takes says no or the workspace is
  // short inside a capture: the caller then runs the unfused producer and run(). The workspace is the one
  // run()'s own W8A8 GEMM uses, so nothing may run a projection between the fill and run_prequantized.
  struct Fp8Input {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  bool fp8_gemm_takes(const GemvWeight& w, const void* out, int64_t ldo, int64_t m, int64_t n,
                      int64_t k) const;
  Fp8Input fp8_gemm_input(const GemvWeight& w, const void* out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                          cudaStream_t stream);
  // out bf16 [m, n] (row stride ldo) = the W8A8 GEMM, with run()'s config for the call, on the workspace
  // fp8_gemm_input returned and a producer filled for the same m and k: bitwise run() on the producer's bf16
  // rows (the same quantized operands, the same kernel). Throws where fp8_gemm_takes says no or the
  // workspace is smaller than the call needs.
  void run_prequantized(const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                        cudaStream_t stream);
  int64_t fp8_prequantized_dispatches() const { return fp8_prequantized_dispatches_; }  // run_prequantized
  // The producers quantize for the W8A8 GEMM from M = fp8_fused_act_quant_min_m rows (fp8_gemm_takes says no
  // below it: the producer's bf16 output, then fp8_gemm's own quantizer). Default kFp8FusedActQuantMinM:
  // in the 4B FP8 prompt the fused producers took 126.2-126.4 → 122.0-122.3 ms at 8192 tokens and
  // 13.16-13.40 → 13.02-13.08 at 1024 (H100, 2026-12-07, `8d1bc01`, docs/PERF.md S12), but the decode step at
  // batch 32 from 5.28 to 5.62 ms (S10). KILN_FP8_FUSED_ACT_QUANT=0: never; 1: from M = kGemvMaxM + 1.
  void set_fp8_fused_act_quant(bool on) { fp8_fused_act_quant_min_m_ = on ? kGemvMaxM + 1 : kNever; }
  void set_fp8_fused_act_quant_min_m(int64_t m) { fp8_fused_act_quant_min_m_ = m; }
  bool fp8_fused_act_quant() const { return fp8_fused_act_quant_min_m_ < kNever; }
  int64_t fp8_fused_act_quant_min_m() const { return fp8_fused_act_quant_min_m_; }
  static constexpr int64_t kFp8FusedActQuantMinM = 1024;

  // The GEMV configuration run() uses for this call (the tuned tactic of its bucket is a GEMV and the
  // GEMV is enabled), else nothing (cuBLASLt). The fused gate_up + SiLU op asks this for [M, 2I, K].
  // weight: the tactic of the shape with that weight format.
  std::optional<GemvConfig> gemv_choice(int64_t m, int64_t n, int64_t k, GemmOut out_type,
                                        GemmWeight weight = GemmWeight::bf16) const;
  // Off: GEMV tactics are ignored (cuBLASLt heuristic instead), e.g. to time cuBLASLt alone. Default on;
  // the environment variable KILN_GEMV=0 starts it off.
  void set_gemv_enabled(bool on) { gemv_enabled_ = on; }
  bool gemv_enabled() const { return gemv_enabled_; }
  int64_t gemv_dispatches() const { return gemv_dispatches_; }  // run() calls that ran the GEMV
  // On: ops::linear_add_rms_norm runs the GEMV with the add + RMSNorm epilogue where the GEMV is chosen.
  // Default off (measured slower on the H200 than the GEMV then the add_rms_norm kernel, docs/PERF.md);
  // KILN_GEMV_ADD_RMS_NORM=1 starts it on.
  void set_gemv_add_rms_norm(bool on) { gemv_add_rms_norm_ = on; }
  bool gemv_add_rms_norm() const { return gemv_add_rms_norm_; }
  // On: ops::linear_attn_prep runs the QKV GEMV fused with the attention preparation (gemv_attn_prep.h)
  // where the GEMV is chosen for the QKV shape and the fused guards hold. Default off until it has been
  // measured on the GPU (docs/PERF.md); KILN_GEMV_ATTN_PREP=1 starts it on.
  void set_gemv_attn_prep(bool on) { gemv_attn_prep_ = on; }
  bool gemv_attn_prep() const { return gemv_attn_prep_; }
  // The GEMV configuration for a projection whose input is a residual add + RMSNorm (ops/linear.h:
  // ResidualNorm) when the tuned tactic is that GEMV with the residual-norm prologue (gemv.h: gemv_norm_in;
  // the tuner keeps it where it measured faster than the add_rms_norm kernel then the GEMV) and the switch is
  // on, else nothing (the add_rms_norm kernel, then the projection). Where the tactic is a W8A8 GEMV, that
  // config (gemv_norm_in runs gemv_w8a8_norm_in) or the W8A16 one it keeps (GemmTactic::norm_in_gemv).
  std::optional<GemvConfig> gemv_norm_in_choice(int64_t m, int64_t n, int64_t k,
                                                GemmWeight weight = GemmWeight::bf16) const;
  // Off: ignore the tuned residual-norm prologue. Default on; KILN_GEMV_NORM_IN=0 starts it off; =2 (for
  // A/B runs) takes it wherever the GEMV is the tactic, measured faster or not.
  void set_gemv_norm_in(int mode) { gemv_norm_in_ = mode; }
  int gemv_norm_in() const { return gemv_norm_in_; }
  // The residual-norm prologue left out at M bucket m_bucket where the tuner kept it (mode 1): set from a
  // whole decode step timed both ways (model/cuda_step_choice.h), since the tuner times the pair in isolation
  // and the step can disagree (30B-A3B BF16 at batch 1: 4.5 % faster without it, H100, 2026-12-07, `b918d91`,
  // docs/PERF.md E18). off = false: the tuner's choice again.
  void set_gemv_norm_in_off_at(int64_t m_bucket, bool off);
  bool gemv_norm_in_off_at(int64_t m_bucket) const;
  // Whether some tuned GEMV tactic of M = m's bucket carries the prologue (what the whole-step choice
  // decides).
  bool gemv_norm_in_tuned_at(int64_t m) const;
  // Off: the residual-norm prologue runs one-tile configs only (as before multi-tile ones had it): the tuner
  // times no prologue for a multi-tile winner and gemv_norm_in_choice ignores a cached one. Default on;
  // KILN_GEMV_NORM_IN_TILES=0 starts it off.
  void set_gemv_norm_in_tiles(bool on) { gemv_norm_in_tiles_ = on; }
  bool gemv_norm_in_tiles() const { return gemv_norm_in_tiles_; }
  // Verify steps (speculative decoding): rows > 0 makes calls with M <= 8 (run(), gemv_choice,
  // gemv_norm_in_choice) take what the plain decode step of M = rows (its sequences) takes: the tuned tactic
  // of bucket(rows): a GEMV config, whose rows do not depend on M (gemv.h), so the verify step's rows are
  // then the plain step's bit for bit, or a cuBLASLt algorithm (re-checked for the call's shape; its rows are
  // M-independent where its tiles are, not promised); where that bucket has no tactic (the LM head above
  // M = 1), the algorithm cuBLASLt's heuristic gives M = rows. 0 (default): each call's own bucket. Set by
  // ops::LinearTacticRows around a verify step; ignored while verify tactics are off: the default, since the
  // plain step's configs at the verify step's M cost (4B shape, batch 1, ctx 1024, H100, 2026-12-06: 4 rows
  // 4.223 -> 4.803 ms, 8 rows 4.607 -> 6.545; docs/PERF.md "Speculative decoding"); set_verify_tactics or
  // KILN_VERIFY_TACTICS=1 turn them on (bitwise verify logits).
  void set_tactic_rows(int64_t rows) { tactic_rows_ = rows; }
  int64_t tactic_rows() const { return tactic_rows_; }
  void set_verify_tactics(bool on) { verify_tactics_ = on; }
  bool verify_tactics() const { return verify_tactics_; }

  // Times candidates for each shape (synchronous; allocates scratch) and stores the winners.
  void tune(const std::vector<GemmShape>& shapes, bool verbose = false);
  bool load(const std::string& path);  // false when absent or keyed for another GPU/version
  void save(const std::string& path) const;
  std::string key() const;  // "NVIDIA H200|cudart 13000|cublasLt 130000"
  const std::map<GemmShape, GemmTactic>& tactics() const { return tactics_; }
  int64_t fallbacks() const { return fallbacks_; }  // dispatches that used the heuristic
  int64_t any_shape_dispatches() const { return any_shape_dispatches_; }  // run() calls sent to gemm_any
  int64_t staged_dispatches() const { return staged_dispatches_; }        // cuBLASLt via the staging rows

 private:
  // run()'s W8A8 GEMM choice for an FP8 weight: the tactic fp8_tactic_at_or_below gives where it is the W8A8
  // GEMM's and the call fits it (bf16 out, fp8_gemm_supported, W and out 16-byte aligned), else null. run()
  // also needs x aligned; the pre-quantized path's input is the workspace.
  const GemmTactic* w8a8_tactic(const GemvWeight& w, int64_t ldx, const void* out, int64_t ldo, int64_t m,
                                int64_t n, int64_t k, GemmOut out_type) const;
  // cuBLASLt on 16-byte-aligned operands and strides (the tuned tactic, else the heuristic's); false, having
  // enqueued nothing, where cuBLASLt has no algorithm for the shape.
  bool run_cublaslt(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
                    int64_t n, int64_t k, GemmOut out_type, cudaStream_t stream);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::map<GemmShape, GemmTactic> tactics_;
  int64_t fallbacks_ = 0;
  int64_t gemv_dispatches_ = 0;
  int64_t any_shape_dispatches_ = 0;
  int64_t staged_dispatches_ = 0;
  int64_t fp8_dequant_dispatches_ = 0;
  int64_t fp8_gemm_dispatches_ = 0;
  int64_t fp8_prequantized_dispatches_ = 0;
  static constexpr int64_t kNever = INT64_MAX;
  int64_t fp8_fused_act_quant_min_m_ = kFp8FusedActQuantMinM;
  bool gemv_enabled_ = true;
  bool gemv_add_rms_norm_ = false;
  bool gemv_attn_prep_ = false;
  int gemv_norm_in_ = 1;
  std::vector<int64_t> norm_in_off_buckets_;  // set_gemv_norm_in_off_at
  bool gemv_norm_in_tiles_ = true;
  int64_t tactic_rows_ = 0;
  bool verify_tactics_ = false;
  // The M bucket whose tactic a call of m rows takes (set_tactic_rows).
  int64_t tactic_bucket(int64_t m) const;
};

// The GEMM shapes a Qwen3-shaped model uses (QKV, O, gate_up, down; LM head with f32 output for
// M buckets up to max_logit_rows, none when it is 0: an embedding model), each for every M bucket from 1 to
// max_tokens. fp8_weights: the four projections also with block-FP8 weights, every M bucket (the FP8 GEMV's
// up to 8, the W8A8 GEMM's against the dequantize-then-bf16 path above).
std::vector<GemmShape> qwen3_gemm_shapes(int64_t hidden, int64_t q_size, int64_t kv_size, int64_t inter,
                                         int64_t vocab, int64_t max_tokens, int64_t max_logit_rows,
                                         bool fp8_weights = false);

// $KILN_TUNE_CACHE, else $XDG_CACHE_HOME/kiln/gemm_tactics.txt, else ~/.cache/kiln/gemm_tactics.txt.
std::string default_tactic_cache_path();

}  // namespace kiln::cuda
