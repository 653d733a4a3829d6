// The decode chain (ops/cuda/decode_chain.h: the contract, scheme and numerics): for a step of one token,
// everything of a decoder layer after its attention, and the next layer's QKV projection and attention
// preparation, in one launch:
//   o_out = linear(attn, o_proj)
//   act = linear_silu_mul(ResidualNorm{o_out, residual, post_norm, eps}, gate_up)
//   tmp = linear(act, down)
//   next_qkv set:  linear_attn_prep(ResidualNorm{tmp, residual, next_norm, eps}, *next_qkv, *next_prep)
//   else:          add_rms_norm(tmp, residual, next_norm, eps, normed)   (the final norm)
// leaving residual, act, tmp, o_out, the next layer's qkv rows (Q in place) and its cache slot (or normed) as
// those ops do; bitwise equal to them when each projection's tuned tactic is the FMA GEMV (gemv.h), within
// the GEMM tolerance otherwise. A fast path only: decode_chain returns false, launching nothing, wherever it
// does not apply (a CPU tensor, M != 1, the engine's switch off, a shape or layout the kernel does not take);
// the caller then runs the ops above.
#pragma once

#include "kiln/tensor.h"
#include "ops/attn_prep.h"

namespace kiln::ops {

struct DecodeChainArgs {
  Tensor attn;                   // bf16 [1, Hq * D] contiguous: the layer's attention output
  Tensor o_proj, gate_up, down;  // bf16 weights [H, Hq D], [2I, H], [H, I], last stride 1
  Tensor post_norm, next_norm;   // bf16 [H]
  float eps = 0.0f;
  Tensor o_out, residual, act, tmp;  // bf16 [1, H], [1, H], [1, I], [1, H]; distinct
  const Tensor* next_qkv = nullptr;  // the next layer's QKV weight [(Hq + 2 Hkv) D, H], or null: last layer
  const AttnPrepArgs* next_prep = nullptr;  // with next_qkv: the next layer's preparation (qkv [1, ...])
  Tensor normed;                            // without next_qkv: bf16 [1, H], the final norm's output
};

// True when the chain ran (see above); false: nothing was launched.
bool decode_chain(const DecodeChainArgs& a);

}  // namespace kiln::ops
