// QKV GEMV + attention preparation in one launch: the guards and the head_dim switch (the contract and the
// scheme are in gemv_attn_prep.h, the kernels in gemv_attn_prep_kernel.cuh, one build unit per head_dim).
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemv_attn_prep.h"
#include "ops/cuda/gemv_kernels.cuh"

namespace kiln::cuda {

void launch_gemv_attn_prep_d64(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                               GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl);
void launch_gemv_attn_prep_d128(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                                GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl);
void launch_gemv_attn_prep_fp8_d64(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                                   GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl);
void launch_gemv_attn_prep_fp8_d128(const gemv_detail::GemvParams& g, const AttnPrepParams& p, int64_t m,
                                    GemvConfig cfg, bool capped, cudaStream_t stream, bool pdl);

namespace {

using gemv_detail::GemvParams;

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// gemv.h: GemvWeight's alignment.
bool weight_aligned(const GemvWeight& w) {
  return w.is_fp8()
             ? reinterpret_cast<uintptr_t>(w.data) % 8 == 0 && reinterpret_cast<uintptr_t>(w.scale) % 4 == 0
             : aligned16(w.data);
}

}  // namespace

bool gemv_attn_prep_supported(int64_t m, int64_t k, const void* x, int64_t ldx, const GemvWeight& w,
                              const AttnPrepParams& p) {
  const int64_t heads = int64_t(p.Hq) + 2 * int64_t(p.Hkv), n = heads * p.D;
  return m >= 1 && m <= kGemvMaxM && p.T == m && p.act == ActKind::bf16 &&
         (p.cache == CacheKind::bf16 || p.cache == CacheKind::fp8) && (p.D == 64 || p.D == 128) &&
         heads <= kGemvAttnPrepMaxHeads && attn_prep_fused_supported(p) && aligned16(x) &&
         weight_aligned(w) && gemv_supported(m, n, k, ldx, w.ld, p.qkv_row, GemvEpilogue::bf16);
}

void gemv_attn_prep(const void* x, int64_t ldx, const GemvWeight& w, int64_t m, int64_t k,
                    const AttnPrepParams& p, GemvConfig cfg, cudaStream_t stream, bool pdl,
                    int tc_min_blocks) {
  if (m == 0) return;
  KILN_CHECK(tc_min_blocks == -1 || tc_min_blocks == 0 || tc_min_blocks == 3,
             "gemv_attn_prep: tc_min_blocks must be -1, 0 or 3, got ", tc_min_blocks);
  KILN_CHECK(gemv_attn_prep_supported(m, k, x, ldx, w, p), "gemv_attn_prep: unsupported call: M ", m, " K ",
             k, " T ", p.T, " D ", p.D, " heads ", p.Hq, "/", p.Hkv, " (gemv_attn_prep.h lists the guards)");
  KILN_CHECK(gemv_known_config(cfg) && gemv_fusable(cfg),
             "gemv_attn_prep: not a one-tile GEMV config: warps ", cfg.warps, " tiles ", cfg.tiles);
  KILN_CHECK(gemv_weight_fits(cfg, w, k), "gemv_attn_prep: an e4m3 x 16 config needs a block-FP8 W with K (",
             k, ") and ldw (", w.ld, ") multiples of 16 and 16-byte aligned data");
  const int64_t n = (int64_t(p.Hq) + 2 * int64_t(p.Hkv)) * p.D;
  GemvParams g{.x = static_cast<const uint4*>(x),
               .w = w.data,
               .out = const_cast<void*>(p.qkv),
               .ldx8 = ldx / 8,
               .ldw8 = w.ld / 8,
               .ldo = p.qkv_row,
               .n = n,
               .k8 = k / 8};
  g.w_scale = w.scale;
  g.w_kb = w.is_fp8() ? (k + 127) / 128 : 0;
  const bool capped = (tc_min_blocks < 0 ? gemv_tail_min_blocks() : tc_min_blocks) == 3;
  const auto run = p.D == 64 ? (w.is_fp8() ? launch_gemv_attn_prep_fp8_d64 : launch_gemv_attn_prep_d64)
                             : (w.is_fp8() ? launch_gemv_attn_prep_fp8_d128 : launch_gemv_attn_prep_d128);
  run(g, p, m, cfg, capped, stream, pdl);
}

}  // namespace kiln::cuda
