// Fused attention preparation: the guards (what the fused kernels cover) and the head_dim switch.
#include <cstdint>

#include "ops/cuda/attn_prep_params.h"
#include "ops/cuda/common.cuh"

namespace kiln::cuda {

void launch_attn_prep_fused_d64(const AttnPrepParams& p, FusedKernel k, cudaStream_t stream);
void launch_attn_prep_fused_d128(const AttnPrepParams& p, FusedKernel k, cudaStream_t stream);
void launch_attn_prep_fused_d256(const AttnPrepParams& p, FusedKernel k, cudaStream_t stream);

namespace {
bool aligned16(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}
}  // namespace

bool attn_prep_fused_supported(const AttnPrepParams& p) {
  if (p.D != 64 && p.D != 128 && p.D != 256) return false;  // one group of D / 8 lanes per head
  if (p.rotary_dim % 16 != 0) return false;                 // NeoX halves must be whole 8-element chunks
  // 16-byte vectors: act rows / heads in multiples of 8 elements, cache rows likewise (8 bytes for fp8 is
  // then implied), and 16-byte aligned bases. The rope table rows are R * 4 bytes, R % 16 == 0.
  if (p.qkv_row % 8 || p.q_row % 8 || p.q_head % 8 || p.c_page % 8 || p.c_row % 8 || p.c_head % 8)
    return false;
  for (const void* ptr :
       {p.qkv, static_cast<const void*>(p.q_dst), p.q_norm, p.k_norm, static_cast<const void*>(p.rope),
        static_cast<const void*>(p.k_cache), static_cast<const void*>(p.v_cache)}) {
    if (!aligned16(ptr)) return false;
  }
  return p.num_slots <= INT32_MAX;  // 32-bit slot -> page division
}

bool attn_prep_streaming_supported(const AttnPrepParams& p) {
  // 256 threads = 256 / (D / 8) groups, each staging at most 4 heads of a token.
  return attn_prep_fused_supported(p) && p.Hq + 2 * p.Hkv <= 4 * (256 / (p.D / 8));
}

void launch_attn_prep_fused(const AttnPrepParams& p, FusedKernel k, void* stream) {
  KILN_CHECK(attn_prep_fused_supported(p), "fused attn_prep called outside its guards");
  KILN_CHECK(k != FusedKernel::decode || p.T <= 65535, "the decode kernel takes at most 65535 tokens, got ",
             p.T);
  KILN_CHECK(k != FusedKernel::streaming || attn_prep_streaming_supported(p),
             "the streaming kernel takes at most 4 heads per group: ", p.Hq + 2 * p.Hkv,
             " heads at head_dim ", p.D);
  if (p.T == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.D) {
    case 64:
      return launch_attn_prep_fused_d64(p, k, s);
    case 128:
      return launch_attn_prep_fused_d128(p, k, s);
    case 256:
      return launch_attn_prep_fused_d256(p, k, s);
    default:
      KILN_FAIL("fused attn_prep: unsupported head_dim ", p.D);
  }
}

}  // namespace kiln::cuda
