// The decode chain: one decoder layer's work after its attention, for a single token (M = 1), in one
// persistent launch (issue 11 item 4: at batch 1 a small model's step is its launches, each paying its ramp
// and tail, more than its weight bytes). A block per SM; the phases run over all blocks, a grid-wide barrier
// between two of them:
//   1. O        o_out = bf16(attn . Wo^T)
//   2. gate_up  h1 = bf16(residual + o_out); act = silu_mul(rms_norm(h1) * post_norm . Wgu^T)
//   3. down     tmp = bf16(act . Wd^T); residual <- h1
//   has_next (the next layer's QKV and attention preparation):
//   4. QKV      h2 = bf16(residual + tmp); qkv = bf16(rms_norm(h2) * next_norm . Wqkv^T)
//   5. prep     attn_prep of every head (Q in place in qkv, K and V into the cache slot); residual <- h2
//   !has_next (the last layer):
//   4. final    residual <- bf16(residual + tmp); normed = rms_norm(residual) * next_norm (the final norm)
//
// Numerics: every phase is the unfused op's arithmetic on the same bytes. The GEMVs are gemv.h's FMA kernel
// with `warps` warps a row group (thread t of 32 * warps takes the 16-byte chunks t, t + 32 warps, ...;
// butterfly; warps in ascending order), the prologues gemv_norm_in's (norm_row.cuh), the silu_mul epilogue
// gemv's, the preparation attn::prep_head (attn_prep_decode_kernel's bytes), the final norm rms_norm_row. So
// the chain is bitwise gemv -> gemv_norm_in (silu) -> gemv -> gemv_norm_in -> attn_prep (or -> rms_norm with
// add) with the FMA config {warps, false} of each projection, which is what the model runs when the tuner's
// tactic for each of them is that config; another tactic (tensor-core GEMV, cuBLASLt) differs from the chain
// as two tactics differ from each other (gemv.h: within the GEMM tolerance).
//
// Scheme. Rows are split into gemv.h's row groups (4 W rows; silu_mul: 2 gate + 2 up rows); a block's 16
// warps form 16 / warps subgroups, subgroup g of block b takes groups b * (16 / warps) + g, + the grid's
// subgroups, ... and syncs on its own named barrier, so subgroups drift apart and one's loads overlap
// another's reduction. x is staged in shared memory per phase (read through L2: earlier phases of the launch
// wrote it). W is never written: each thread issues its first round of the next phase's W (or of its own
// next group) as soon as its current dot products have consumed the registers, before the barrier, so the
// weight stream runs across the phase boundaries. The residual is rewritten one phase late (after every
// block has read it) by block 0 from the h it kept in shared memory.
//
// The grid barrier counts arrivals on a per-device word (release add, acquire poll); the last block to
// leave resets it, so launches on one stream (graph replays included) start from zero; not for two chain
// launches in flight at once on two streams of one device (kiln runs a model's forward on one stream). Every
// block must be resident at once: the grid is the SM count times the blocks an SM holds (1), and dependents
// launched by PDL start only after the whole chain has completed (it never triggers them early).
#pragma once

#include <cstdint>

#include "ops/cuda/attn_prep_params.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// One projection of the chain: W bf16 [n, k], row stride ldw (elements), on the FMA GEMV with `warps`
// warps a row group (2, 4, 8 or 16).
struct DecodeChainGemv {
  const void* w = nullptr;
  int64_t ldw = 0, n = 0, k = 0;
  int warps = 4;
};

struct DecodeChainParams {
  DecodeChainGemv o, gate_up, down, qkv;  // gate_up: n = 2 I; qkv unused when !has_next
  const void* attn = nullptr;             // bf16 [o.k]: O's input (the attention output row)
  void* o_out = nullptr;                  // bf16 [H]
  void* residual = nullptr;               // bf16 [H], read and rewritten
  void* act = nullptr;                    // bf16 [I]
  void* tmp = nullptr;                    // bf16 [H]: down's output
  const void* post_norm = nullptr;        // bf16 [H]
  const void* next_norm = nullptr;        // bf16 [H]: the next layer's input norm, or the final norm
  void* normed = nullptr;                 // bf16 [H]: the final norm's output (!has_next)
  float eps = 0.0f;
  bool has_next = false;
  AttnPrepParams prep;  // has_next: the next layer's preparation (qkv = qkv's output, its cache)
};

// True when decode_chain can run p: H = o.n = down.n = gate_up.k = qkv.k, o.k and I = down.k = gate_up.n / 2
// multiples of 8, every row stride a multiple of 8 and >= its k, warps in {2, 4, 8, 16}, all pointers 16-byte
// aligned, the buffers distinct; has_next: qkv.n = (Hq + 2 Hkv) D, prep for T = 1, bf16 activations, a bf16
// or fp8 cache, D 64 or 128, qkv's output prep.qkv (row stride >= qkv.n) and attn_prep_fused_supported(prep).
bool decode_chain_supported(const DecodeChainParams& p);

// Runs the chain (contract above) on stream; throws kiln::Error before launching anything when
// decode_chain_supported is false. pdl: the launch may start before the previous kernel ends (its blocks
// issue their first W loads, then wait for it with griddepcontrol.wait).
void decode_chain(const DecodeChainParams& p, cudaStream_t stream, bool pdl);

// Chain launches so far in this process (tests: that a model step took the chain).
uint64_t decode_chain_launches();

}  // namespace kiln::cuda
