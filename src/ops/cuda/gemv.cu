// Small-M GEMV and its fused forms: the guards of every call (gemv.h), and the bf16-weight kernels (the
// block-FP8 ones are built in gemv_fp8.cu; both through gemv_launch.cuh).
#include <cstdlib>
#include <string>

#include "ops/cuda/gemv_launch.cuh"
#include "ops/cuda/gemv_w8a8.h"

namespace kiln::cuda {
namespace {

using namespace gemv_detail;

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
bool aligned16(const void* p) {
  return aligned(p, 16);
}

// W's pointers: bf16 chunks are 16 bytes, e4m3 chunks 8, scales 4 (gemv.h: GemvWeight).
bool weight_aligned(const GemvWeight& w) {
  return w.is_fp8() ? aligned(w.data, 8) && aligned(w.scale, 4) : aligned16(w.data);
}

// The GemvParams fields of an FP8 W's scales (the data and stride are set with the rest).
void set_scales(GemvParams& p, const GemvWeight& w, int64_t k) {
  p.w_scale = w.scale;
  p.w_kb = w.is_fp8() ? (k + 127) / 128 : 0;
}

}  // namespace

bool gemv_weight_fits(GemvConfig c, const GemvWeight& w, int64_t k) {
  return !c.e4m3x16 ||
         (w.is_fp8() && k % 16 == 0 && w.ld % 16 == 0 && aligned16(w.data) && aligned(w.scale, 4));
}

bool gemv_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo,
                    GemvEpilogue epi) {
  const bool silu = epi == GemvEpilogue::silu_mul;
  return m >= 1 && m <= kGemvMaxM && n >= 1 && k >= 8 && k % 8 == 0 && ldx >= k && ldw >= k && ldx % 8 == 0 &&
         ldw % 8 == 0 && (!silu || n % 2 == 0) && ldo >= (silu ? n / 2 : n);
}

void gemv(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
          int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl) {
  if (cfg.w8a8 != 0) return gemv_w8a8(x, ldx, w, out, ldo, m, n, k, epi, cfg, stream, pdl);  // its own guards
  const int64_t ldw = w.ld;
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(n >= 1 && k >= 8 && k % 8 == 0, "gemv: N must be >= 1 and K a positive multiple of 8: N ", n,
             " K ", k);
  KILN_CHECK(epi != GemvEpilogue::silu_mul || n % 2 == 0,
             "gemv: the silu_mul epilogue needs an even N (2I), got ", n);
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? n / 2 : n;
  KILN_CHECK(ldx >= k && ldw >= k && ldx % 8 == 0 && ldw % 8 == 0 && ldo >= out_cols,
             "gemv: row strides must be >= the row length (x, W: multiples of 8): ldx ", ldx, " ldw ", ldw,
             " ldo ", ldo);
  KILN_CHECK(aligned16(x) && weight_aligned(w) && aligned16(out),
             "gemv: x and out must be 16-byte aligned, W 16 (bf16) or 8 (e4m3) and its scales 4");
  KILN_CHECK(gemv_known_config(cfg), "gemv: unknown config: warps ", cfg.warps, " (2, 4, 8 or 16), tiles ",
             cfg.tiles, " (tensor cores: 1, 2 or 4; FMA: 1)");
  KILN_CHECK(gemv_weight_fits(cfg, w, k), "gemv: an e4m3 x 16 config needs a block-FP8 W with K (", k,
             ") and ldw (", w.ld, ") multiples of 16 and 16-byte aligned data");
  if (m == 0) return;
  GemvParams p{.x = static_cast<const uint4*>(x),
               .w = w.data,
               .out = out,
               .ldx8 = ldx / 8,
               .ldw8 = ldw / 8,
               .ldo = ldo,
               .n = n,
               .k8 = k / 8};
  set_scales(p, w, k);
  if (w.is_fp8()) {
    launch_gemv_fp8(p, m, epi, cfg, stream, pdl);
  } else {
    launch_gemv<Bf16Weights>(p, m, epi, cfg, stream, pdl);
  }
}

bool gemv_takes(GemvConfig cfg, const void* x, int64_t ldx, const GemvWeight& w, const void* out, int64_t ldo,
                int64_t m, int64_t n, int64_t k, GemvEpilogue epi) {
  if (!aligned16(x) || !aligned16(out) || !gemv_known_config(cfg)) return false;
  if (cfg.w8a8 != 0)
    return w.is_fp8() && aligned16(w.data) && aligned(w.scale, 4) &&
           gemv_w8a8_supported(m, n, k, ldx, w.ld, ldo, epi);
  return weight_aligned(w) && gemv_weight_fits(cfg, w, k) && gemv_supported(m, n, k, ldx, w.ld, ldo, epi);
}

int gemv_tail_min_blocks() {
  static const int v = [] {
    const char* e = std::getenv("KILN_GEMV_TAIL_MIN_BLOCKS");
    if (!e || !*e) return 3;
    KILN_CHECK(std::string(e) == "0" || std::string(e) == "3",
               "KILN_GEMV_TAIL_MIN_BLOCKS must be 0 or 3, got '", e, "'");
    return std::atoi(e);
  }();
  return v;
}

bool gemv_add_rms_norm_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldt,
                                 int64_t ldr, int64_t ldn) {
  return gemv_supported(m, n, k, ldx, ldw, ldt, GemvEpilogue::bf16) && n % 8 == 0 && ldt % 8 == 0 &&
         ldr % 8 == 0 && ldn % 8 == 0 && ldr >= n && ldn >= n;
}

void gemv_add_rms_norm(const void* x, int64_t ldx, const GemvWeight& w, void* tmp, int64_t ldt,
                       void* residual, int64_t ldr, const void* norm_w, void* normed, int64_t ldn, int64_t m,
                       int64_t n, int64_t k, float eps, GemvConfig cfg, cudaStream_t stream, bool pdl) {
  const int64_t ldw = w.ld;
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv_add_rms_norm: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(gemv_add_rms_norm_supported(m == 0 ? 1 : m, n, k, ldx, ldw, ldt, ldr, ldn),
             "gemv_add_rms_norm: unsupported call: N ", n, " (a multiple of 8) K ", k,
             " (a multiple of 8) ldx ", ldx, " ldw ", ldw, " ldt ", ldt, " ldr ", ldr, " ldn ", ldn,
             " (multiples of 8, >= the row length)");
  KILN_CHECK(
      aligned16(x) && weight_aligned(w) && aligned16(tmp) && aligned16(residual) && aligned16(norm_w) &&
          aligned16(normed),
      "gemv_add_rms_norm: x, tmp, residual, norm weight and normed must be 16-byte aligned, W 16 (bf16) "
      "or 8 (e4m3) and its scales 4");
  KILN_CHECK(gemv_known_config(cfg) && gemv_fusable(cfg),
             "gemv_add_rms_norm: warps must be 2, 4, 8 or 16 and tiles 1, got warps ", cfg.warps, " tiles ",
             cfg.tiles);
  KILN_CHECK(gemv_weight_fits(cfg, w, k),
             "gemv_add_rms_norm: an e4m3 x 16 config needs a block-FP8 W with K (", k, ") and ldw (", w.ld,
             ") multiples of 16 and 16-byte aligned data");
  KILN_CHECK(eps >= 0.0f, "gemv_add_rms_norm: eps must be >= 0");
  if (m == 0) return;
  GemvParams p{.x = static_cast<const uint4*>(x),
               .w = w.data,
               .out = tmp,
               .ldx8 = ldx / 8,
               .ldw8 = ldw / 8,
               .ldo = ldt,
               .n = n,
               .k8 = k / 8,
               .residual = static_cast<uint16_t*>(residual),
               .norm_w = static_cast<const uint4*>(norm_w),
               .normed = static_cast<uint16_t*>(normed),
               .ldr = ldr,
               .ldn = ldn,
               .eps = eps};
  set_scales(p, w, k);
  if (w.is_fp8()) {
    launch_gemv_add_rms_norm_fp8(p, m, cfg, gemv_tail_min_blocks(), stream, pdl);
  } else {
    launch_gemv_add_rms_norm<Bf16Weights>(p, m, cfg, gemv_tail_min_blocks(), stream, pdl);
  }
}

// KILN_GEMV_NORM_IN_GROUPS=g (g >= 1): the default block sizing of gemv_norm_in, g row groups a block instead
// of one wave (for A/B runs); unset or 0: one wave.
static int norm_in_groups_env() {
  static const int v = [] {
    const char* e = std::getenv("KILN_GEMV_NORM_IN_GROUPS");
    if (!e || !*e) return 0;
    const int g = std::atoi(e);
    KILN_CHECK(g >= 0 && g <= 1024, "KILN_GEMV_NORM_IN_GROUPS must be in [0, 1024], got '", e, "'");
    return g;
  }();
  return v;
}

// KILN_GEMV_NORM_IN_AHEAD=1: the prologue GEMV's deeper look-ahead (GemvParams::ni_ahead; not yet timed on a
// GPU); unset or 0: that of `2f94697`.
static bool norm_in_ahead_env() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_GEMV_NORM_IN_AHEAD");
    if (!e || !*e) return false;
    KILN_CHECK(std::string(e) == "0" || std::string(e) == "1",
               "KILN_GEMV_NORM_IN_AHEAD must be 0 or 1, got '", e, "'");
    return std::string(e) == "1";
  }();
  return v;
}

bool gemv_norm_in_supported(int64_t m, int64_t n, int64_t k, int64_t ldd, int64_t ldr, int64_t ldw,
                            int64_t ldo, GemvEpilogue epi) {
  return gemv_supported(m, n, k, k, ldw, ldo, epi) && ldd >= k && ldr >= k && ldd % 8 == 0 && ldr % 8 == 0 &&
         norm_in_smem_bytes(m, k / 8) <= kGemvNormInMaxSmem;
}

void gemv_norm_in(const void* delta, int64_t ldd, void* residual, int64_t ldr, const void* norm_w, float eps,
                  const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                  GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl, int groups_per_block) {
  if (cfg.w8a8 != 0)  // its own guards; one wave of blocks whatever groups_per_block says
    return gemv_w8a8_norm_in(delta, ldd, residual, ldr, norm_w, eps, w, out, ldo, m, n, k, epi, cfg, stream,
                             pdl);
  const int64_t ldw = w.ld;
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv_norm_in: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(groups_per_block >= 0, "gemv_norm_in: groups_per_block must be >= 0, got ", groups_per_block);
  KILN_CHECK(gemv_norm_in_supported(m == 0 ? 1 : m, n, k, ldd, ldr, ldw, ldo, epi),
             "gemv_norm_in: unsupported call: N ", n, " K ", k, " (a multiple of 8) ldd ", ldd, " ldr ", ldr,
             " ldw ", ldw, " (multiples of 8, >= K) ldo ", ldo, ", prologue rows of ",
             norm_in_smem_bytes(m, k / 8), " bytes (at most ", kGemvNormInMaxSmem, ")");
  KILN_CHECK(
      aligned16(delta) && aligned16(residual) && aligned16(norm_w) && weight_aligned(w) && aligned16(out),
      "gemv_norm_in: delta, residual, norm weight and out must be 16-byte aligned, W 16 (bf16) or 8 "
      "(e4m3) and its scales 4");
  KILN_CHECK(gemv_known_config(cfg) && gemv_norm_in_fusable(cfg), "gemv_norm_in: unknown config: warps ",
             cfg.warps, " (2, 4, 8 or 16), tiles ", cfg.tiles, " (tensor cores: 1, 2 or 4; FMA: 1)");
  KILN_CHECK(gemv_weight_fits(cfg, w, k), "gemv_norm_in: an e4m3 x 16 config needs a block-FP8 W with K (", k,
             ") and ldw (", w.ld, ") multiples of 16 and 16-byte aligned data");
  KILN_CHECK(eps >= 0.0f, "gemv_norm_in: eps must be >= 0");
  if (m == 0) return;
  GemvParams p{.x = nullptr,
               .w = w.data,
               .out = out,
               .ldx8 = 0,
               .ldw8 = ldw / 8,
               .ldo = ldo,
               .n = n,
               .k8 = k / 8,
               .eps = eps};
  set_scales(p, w, k);
  p.ni_delta = static_cast<const uint4*>(delta);
  p.ni_residual = static_cast<uint4*>(residual);
  p.ni_w = static_cast<const uint4*>(norm_w);
  p.ni_ldd8 = ldd / 8;
  p.ni_ldr8 = ldr / 8;
  p.ni_ahead = norm_in_ahead_env();
  if (groups_per_block == 0) groups_per_block = norm_in_groups_env();
  if (w.is_fp8()) {
    launch_gemv_norm_in_fp8(p, m, epi, cfg, groups_per_block, stream, pdl);
  } else {
    launch_gemv_norm_in<Bf16Weights>(p, m, epi, cfg, groups_per_block, stream, pdl);
  }
}

}  // namespace kiln::cuda
