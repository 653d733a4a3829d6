// Attention preparation for Qwen3-family attention layers, one op:
//   per-head RMSNorm of Q and K -> RoPE / M-RoPE of Q and K -> Q out (contiguous or in place)
//   -> K (normed, rotated) and V (unchanged) written into the paged KV cache.
//
// Shapes (T tokens, Hq query heads, Hkv kv heads, D head_dim; "act" = bf16 | f16):
//   qkv          act [T, (Hq + 2*Hkv) * D]; row stride free, last stride 1. Columns: Q heads, K heads, V
//   heads. q_out        act [T, Hq, D] (row and head strides free, last stride 1), or a Tensor with data ==
//   nullptr:
//                Q written back in place
//                into qkv's Q columns. The K and V columns of qkv are never written; with q_out given, qkv
//                is not written at all.
//   q_norm       act [D], k_norm act [D]: the RMSNorm weights; both empty (data == nullptr): no per-head norm
//                (step 1 is y_i = x_i: a Llama-style attention, the EAGLE-3 draft's midlayer). CUDA runs that
//                on the unfused path.
//   positions    i32 | i64 [T] (plain RoPE), or [3, T] rows (t, h, w) for M-RoPE; any strides (a view of a
//                larger graph buffer). Every position must be in [0, rope.cos_sin.shape[0]).
//   rope         RopeTable (rope_table.h), rotary_dim even, <= D.
//   slot_mapping i64 [T] (stride free): cache slot of token t; slot < 0: token t is not written to the cache.
//                Slots must be < cache.num_slots(). Two tokens must not share a slot (the result is then
//                unspecified).
//   head_dim     D in [8, 256], a multiple of 8 (the canonical reduction below has 32 lanes of 8).
//   cache        KvCacheView (kv_cache.h): bf16 | f16 | f8e4m3 (+ UE8M0 scales), NHD or HND, any page size.
//   Device: every tensor on the same device (CPU: the reference; CUDA: the kernels, on `stream`).
//
// Numerics (the contract every implementation meets bit for bit; docs/NUMERICS.md says why):
//  1. RMSNorm of one head x[0..D) (act values widened to f32), Hugging Face Qwen3RMSNorm rounding:
//     ss: 32 lane partials, lane l owns x[8l .. 8l+8) (lanes with 8l >= D hold +0):
//         p_l = 0; for i in 8l .. 8l+7: p_l = fma(x_i, x_i, p_l)   (f32 fma, in that order)
//     then an xor butterfly: for o in 16, 8, 4, 2, 1: p_l = p_l + p_(l^o)   (all lanes end equal); ss = p_0.
//     r = 1 / sqrt(ss / D + eps)   each of /, +, sqrt, / correctly rounded in f32 (no rsqrt, no fma).
//     n_i = act(x_i * r);  y_i = act(n_i * w_i)   (the f32 product of two act values is exact: one rounding)
//  2. RoPE, NeoX half split over rotary_dim R (h = R / 2), for i in [0, h), angle index i:
//     c = cos_sin[p][i], s = cos_sin[p][h + i]   (p: the token's position; with M-RoPE the position row
//     picked for frequency i by the axis map below)
//     o_i     = fma(y_i,     c, -(y_(i+h) * s))
//     o_(i+h) = fma(y_(i+h), c,  (y_i     * s))     (each product rounded to f32 once, then the fma)
//     o_i = y_i for i in [R, D). One rounding at the end: out_i = act(o_i).
//     act() rounds to nearest even; a NaN result is stored as the canonical NaN 0x7fff (bf16 and f16: what
//     the GPU's cvt produces), because CPU and GPU arithmetic produce NaNs of different signs and payloads.
//     M-RoPE axis of frequency i (section = {s0, s1, s2}, s0 + s1 + s2 == h):
//       sectioned (Qwen2-VL / Qwen2.5-VL): axis 0 if i < s0, 1 if i < s0 + s1, else 2.
//       interleaved (Qwen3-VL): axis 1 if i % 3 == 1 and i < 3*s1; axis 2 if i % 3 == 2 and i < 3*s2;
//       else axis 0. With three equal position rows both equal plain RoPE.
//  3. Q: out written to q_out (or in place). K: out (act), then converted to the cache dtype:
//     same dtype: the bits; bf16 <-> f16: widened to f32 and rounded to nearest even once (NaN -> 0x7fff);
//     f8e4m3: block quantisation of 64 contiguous elements as in fp8.h (UE8M0 scale, RNE, saturating).
//     V: the qkv values, converted to the cache dtype the same way.
//
// Errors: every shape, dtype, stride and device mismatch is a kiln::Error before any launch. The CPU
// reference also raises on a position outside the table or a slot >= num_slots. The CUDA kernels cannot
// raise from the device: they clamp such a position into the table and skip such a slot (no memory
// outside the given tensors is ever touched). T == 0 is valid: nothing is launched.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/tensor.h"
#include "ops/cuda/attn_prep_params.h"
#include "ops/kv_cache.h"
#include "ops/rope_table.h"

namespace kiln::ops {

enum class MRopeAxisMap : uint8_t { sectioned, interleaved };

struct MRope {
  std::array<int, 3> section{};  // frequencies per axis (t, h, w), sum == rotary_dim / 2, e.g. {24, 20, 20}
  bool enabled = false;          // positions are then [3, T]
  bool interleaved = false;      // true: Qwen3-VL interleaved axis map; false: sectioned (Qwen2.5-VL)
};

struct AttnPrepArgs {
  Tensor qkv;     // act [T, (Hq + 2*Hkv) * D], row-strided
  Tensor q_out;   // act [T, Hq, D], or empty: Q in place in qkv
  Tensor q_norm;  // act [D]
  Tensor k_norm;  // act [D]
  float eps = 1e-6f;
  Tensor positions;  // i32 | i64 [T], or [3, T] with mrope.enabled
  RopeTable rope;
  MRope mrope;
  Tensor slot_mapping;  // i64 [T]
  KvCacheView cache;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors (nullptr: the legacy default stream)
  // CUDA fused path: launch with programmatic dependent launch. The kernel then starts while the previous
  // kernel on the stream drains and waits for it (griddepcontrol.wait) before reading any input, so it is
  // always safe; it saves the launch gap inside graphs.
  bool pdl = false;
};

// Which implementation attn_prep chose (for tests, benchmarks and logs).
enum class AttnPrepPath : uint8_t {
  cpu_reference,
  cuda_fused_decode,     // small-batch kernel (latency)
  cuda_fused_prefill,    // token-loop kernel, register loads
  cuda_fused_streaming,  // token-loop kernel, cp.async pipeline (heads <= 4 per group of each block)
  cuda_unfused,
  cuda_gemv_fused,  // ops::linear_attn_prep (linear.h) only: the QKV GEMV and the preparation in one kernel
};
// The fused kernels, for forcing one (tests, benchmarks).
enum class AttnPrepKernel : uint8_t { decode, prefill, prefill_streaming };
const char* attn_prep_path_name(AttnPrepPath p);

// Validates, then runs: the CPU reference for CPU tensors; on CUDA a fused kernel when the fused guards hold
// (head_dim 64 | 128 | 256, rotary_dim % 16 == 0, 16-byte aligned QKV rows / Q rows and heads / cache rows,
// num_slots < 2^31): T <= 128 the decode kernel, T <= 1024 the streaming kernel (when Hq + 2*Hkv <= 4 * 256 /
// (D / 8)), else the prefill kernel; otherwise the unfused path. Returns the path taken. Capturable in a CUDA
// graph (no allocation, no sync on the fused path; the unfused path allocates stream-ordered). The first
// launch of each prefill/streaming instantiation makes one-time occupancy queries (and raises the streaming
// kernel's shared-memory limit): make one eager call before capturing prefill-sized graphs.
AttnPrepPath attn_prep(const AttnPrepArgs& args);
// The guard alone: the path attn_prep would take for these args (they must validate).
AttnPrepPath attn_prep_select(const AttnPrepArgs& args);
// KILN_ATTN_PREP=unfused (read once; "fused", the default, or "unfused", else an error): every CUDA call of
// attn_prep and linear_attn_prep takes the unfused path, for A/B runs of the whole engine (the seed's check:
// identical greedy tokens through the server either way).
bool attn_prep_unfused_forced();

// CPU reference (CPU tensors only): the oracle, a direct transcription of the contract above.
void attn_prep_reference(const AttnPrepArgs& args);

// CUDA, one kernel per step (4 launches): (1) Q RMSNorm into the Q destination, (2) K RMSNorm into a
// scratch buffer (cudaMallocAsync on `stream`, freed stream-ordered), (3) RoPE of Q and of the K scratch in
// place, (4) K and V written into the cache. Any head_dim the contract allows, any alignment. The fallback.
void attn_prep_unfused(const AttnPrepArgs& args);
// CUDA fused, forced kernel (tests, benchmarks); raises if that kernel's guards do not hold.
void attn_prep_fused(const AttnPrepArgs& args, AttnPrepKernel kernel);

// Validation shared by every path (raises kiln::Error on any mismatch).
void attn_prep_validate(const AttnPrepArgs& args);

// The raw kernel parameters the CUDA paths build from these (validated) args, for tests and benchmarks that
// call a kernel directly (e.g. ops/cuda/gemv_attn_prep.h).
::kiln::cuda::AttnPrepParams attn_prep_params(const AttnPrepArgs& args);

}  // namespace kiln::ops
