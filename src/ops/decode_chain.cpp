// The decode chain's dispatcher (ops/decode_chain.h): a CUDA fast path, or nothing.
#include "ops/decode_chain.h"

#include "ops/cuda/dispatch.h"

namespace kiln::ops {

bool decode_chain(const DecodeChainArgs& a) {
#ifdef KILN_HAVE_CUDA
  const Tensor* ts[] = {&a.attn,      &a.o_proj, &a.gate_up,  &a.down, &a.post_norm,
                        &a.next_norm, &a.o_out,  &a.residual, &a.act,  &a.tmp};
  for (const Tensor* t : ts)
    if (!t->data || !t->device.is_cuda() || t->device != a.attn.device || t->dtype != DType::bf16)
      return false;
  if (a.attn.ndim != 2 || a.attn.shape[0] != 1 || !a.attn.is_contiguous()) return false;
  if ((a.next_qkv == nullptr) != (a.next_prep == nullptr)) return false;
  // The chain's preparation is the fused decode kernel's: not where the unfused one is forced.
  if (a.next_prep && attn_prep_unfused_forced()) return false;
  if (!a.next_prep) return KILN_CUDA_OP(decode_chain(a, nullptr));
  const ::kiln::cuda::AttnPrepParams prep = attn_prep_params(*a.next_prep);  // validates
  return KILN_CUDA_OP(decode_chain(a, &prep));
#else
  (void)a;
  return false;
#endif
}

}  // namespace kiln::ops
