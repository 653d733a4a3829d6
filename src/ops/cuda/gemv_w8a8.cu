// gemv_w8a8.h: the guards, the kernel table and the launcher of the W8A8 GEMV (gemv_w8a8_kernel.cuh).
#include "ops/cuda/gemv_w8a8.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/gemv_launch.cuh"
#include "ops/cuda/gemv_w8a8_kernel.cuh"

namespace kiln::cuda {
namespace {

using gemv_detail::GemvParams;
using gemv_detail::NoArgs;
using namespace gemv_w8a8_detail;
using Kernel = gemv_detail::GemvKernel;

// KILN_GEMV_W8A8_PREFETCH=0: the kernels without the L2 prefetch of the W slice (gemv_w8a8_kernel.cuh), for
// A/B runs; unset or 1: with it. Read once.
bool prefetch_on() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_GEMV_W8A8_PREFETCH");
    if (!e || !*e) return true;
    KILN_CHECK(std::string(e) == "0" || std::string(e) == "1",
               "KILN_GEMV_W8A8_PREFETCH must be 0 or 1, got '", e, "'");
    return std::string(e) == "1";
  }();
  return v;
}

template <GemvEpilogue E, int NT, int U, bool N, bool P>
Kernel kernel_of_m_p(int64_t m) {
  static constexpr Kernel table[kGemvMaxM] = {
      gemv_w8a8_kernel<1, E, NT, U, N, P>, gemv_w8a8_kernel<2, E, NT, U, N, P>,
      gemv_w8a8_kernel<3, E, NT, U, N, P>, gemv_w8a8_kernel<4, E, NT, U, N, P>,
      gemv_w8a8_kernel<5, E, NT, U, N, P>, gemv_w8a8_kernel<6, E, NT, U, N, P>,
      gemv_w8a8_kernel<7, E, NT, U, N, P>, gemv_w8a8_kernel<8, E, NT, U, N, P>};
  return table[m - 1];
}

template <GemvEpilogue E, int NT, int U, bool N>
Kernel kernel_of_m(int64_t m) {
  return prefetch_on() ? kernel_of_m_p<E, NT, U, N, true>(m) : kernel_of_m_p<E, NT, U, N, false>(m);
}

// The kernel of (epilogue, tiles, K blocks in flight, prologue, M); null for a pair kGemvW8a8Configs does not
// list.
template <GemvEpilogue E, bool N>
Kernel kernel_of_cfg(int64_t m, GemvConfig cfg) {
  if (cfg.tiles == 1 && cfg.w8a8 == 1) return kernel_of_m<E, 1, 1, N>(m);
  if (cfg.tiles == 1 && cfg.w8a8 == 2) return kernel_of_m<E, 1, 2, N>(m);
  if (cfg.tiles == 1 && cfg.w8a8 == 4) return kernel_of_m<E, 1, 4, N>(m);
  if (cfg.tiles == 2 && cfg.w8a8 == 1) return kernel_of_m<E, 2, 1, N>(m);
  if (cfg.tiles == 2 && cfg.w8a8 == 2) return kernel_of_m<E, 2, 2, N>(m);
  if (cfg.tiles == 4 && cfg.w8a8 == 1) return kernel_of_m<E, 4, 1, N>(m);
  return nullptr;
}

template <bool N>
Kernel kernel_for(int64_t m, GemvEpilogue epi, GemvConfig cfg) {
  return epi == GemvEpilogue::bf16  ? kernel_of_cfg<GemvEpilogue::bf16, N>(m, cfg)
         : epi == GemvEpilogue::f32 ? kernel_of_cfg<GemvEpilogue::f32, N>(m, cfg)
                                    : kernel_of_cfg<GemvEpilogue::silu_mul, N>(m, cfg);
}

bool is_w8a8_config(GemvConfig c) {
  for (const GemvConfig& k : kGemvW8a8Configs)
    if (k == c) return true;
  return false;
}

// The kernels run where the driver picked code of sm_89 or later for them (once per device).
bool device_runs_kernel() {
  static PerDeviceFlag flag;
  return flag.get([] {
    return kernel_binary_version(
               reinterpret_cast<const void*>(kernel_of_m<GemvEpilogue::bf16, 1, 2, false>(1))) >= 89;
  });
}

// The largest shared memory any W8A8 config takes for (m, k), without or with the residual-norm prologue.
int64_t worst_smem_bytes(int64_t m, int64_t k, bool norm_in = false) {
  int64_t worst = 0;
  for (const GemvConfig& c : kGemvW8a8Configs)
    worst = std::max(worst, norm_in ? norm_in_smem_bytes(m, k, gemv_rows(c), c.warps)
                                    : smem_bytes(m, k, gemv_rows(c), c.warps));
  return worst;
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

int64_t gemv_w8a8_smem_bytes(int64_t m, int64_t k, GemvConfig cfg) {
  return smem_bytes(m, k, gemv_rows(cfg), cfg.warps);
}

bool gemv_w8a8_shape_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo,
                               GemvEpilogue epi) {
  const bool silu = epi == GemvEpilogue::silu_mul;
  return m >= 1 && m <= kGemvMaxM && n >= 1 && n < (int64_t(1) << 31) && k >= 16 && k % 16 == 0 && ldx >= k &&
         ldx % 8 == 0 && ldw >= k && ldw % 16 == 0 && (!silu || n % 2 == 0) && ldo >= (silu ? n / 2 : n) &&
         worst_smem_bytes(m, k) <= kGemvW8a8MaxSmem;
}

bool gemv_w8a8_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo,
                         GemvEpilogue epi) {
  return gemv_w8a8_shape_supported(m, n, k, ldx, ldw, ldo, epi) && device_runs_kernel();
}

void gemv_w8a8(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
               int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl) {
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv_w8a8: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(is_w8a8_config(cfg), "gemv_w8a8: not a W8A8 config: warps ", cfg.warps, " tiles ", cfg.tiles,
             " K blocks in flight ", cfg.w8a8);
  KILN_CHECK(w.is_fp8(), "gemv_w8a8: the weight must be block-FP8 (e4m3 with scales)");
  KILN_CHECK(aligned(x, 16) && aligned(w.data, 16) && aligned(w.scale, 4) && aligned(out, 16),
             "gemv_w8a8: x, W and out must be 16-byte aligned, the scales 4");
  KILN_CHECK(gemv_w8a8_supported(m == 0 ? 1 : m, n, k, ldx, w.ld, ldo, epi),
             "gemv_w8a8: unsupported call: N ", n, " K ", k, " (a multiple of 16) ldx ", ldx,
             " (a multiple of 8) ldw ", w.ld, " (a multiple of 16) ldo ", ldo, ", shared memory ",
             worst_smem_bytes(m == 0 ? 1 : m, k), " bytes (at most ", kGemvW8a8MaxSmem,
             "), or a device without sm_89+ code for the kernel");
  if (m == 0) return;
  const GemvParams p{.x = static_cast<const uint4*>(x),
                     .w = w.data,
                     .out = out,
                     .ldx8 = ldx / 8,
                     .ldw8 = w.ld / 8,
                     .ldo = ldo,
                     .n = n,
                     .k8 = k / 8,
                     .w_scale = w.scale,
                     .w_kb = (k + 127) / 128};
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? n / 2 : n;
  const int64_t rows = gemv_rows(cfg), per_block = epi == GemvEpilogue::silu_mul ? rows / 2 : rows;
  launch({.grid = dim3(unsigned((out_cols + per_block - 1) / per_block)),
          .block = dim3(unsigned(cfg.warps * 32)),
          .smem = size_t(gemv_w8a8_smem_bytes(m, k, cfg)),
          .stream = stream,
          .pdl = pdl},
         kernel_for<false>(m, epi, cfg), p, NoArgs{});
}

bool gemv_w8a8_norm_in_supported(int64_t m, int64_t n, int64_t k, int64_t ldd, int64_t ldr, int64_t ldw,
                                 int64_t ldo, GemvEpilogue epi) {
  return gemv_w8a8_shape_supported(m, n, k, k, ldw, ldo, epi) && ldd >= k && ldr >= k && ldd % 8 == 0 &&
         ldr % 8 == 0 && worst_smem_bytes(m, k, true) <= kGemvW8a8MaxSmem && device_runs_kernel();
}

void gemv_w8a8_norm_in(const void* delta, int64_t ldd, void* residual, int64_t ldr, const void* norm_w,
                       float eps, const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
                       int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl) {
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv_w8a8_norm_in: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(is_w8a8_config(cfg), "gemv_w8a8_norm_in: not a W8A8 config: warps ", cfg.warps, " tiles ",
             cfg.tiles, " K blocks in flight ", cfg.w8a8);
  KILN_CHECK(w.is_fp8(), "gemv_w8a8_norm_in: the weight must be block-FP8 (e4m3 with scales)");
  KILN_CHECK(
      aligned(delta, 16) && aligned(residual, 16) && aligned(norm_w, 16) && aligned(w.data, 16) &&
          aligned(w.scale, 4) && aligned(out, 16),
      "gemv_w8a8_norm_in: delta, residual, norm weight, W and out must be 16-byte aligned, the scales 4");
  KILN_CHECK(gemv_w8a8_norm_in_supported(m == 0 ? 1 : m, n, k, ldd, ldr, w.ld, ldo, epi),
             "gemv_w8a8_norm_in: unsupported call: N ", n, " K ", k, " (a multiple of 16) ldd ", ldd, " ldr ",
             ldr, " (multiples of 8, >= K) ldw ", w.ld, " (a multiple of 16) ldo ", ldo, ", shared memory ",
             worst_smem_bytes(m == 0 ? 1 : m, k, true), " bytes (at most ", kGemvW8a8MaxSmem,
             "), or a device without sm_89+ code for the kernel");
  KILN_CHECK(eps >= 0.0f, "gemv_w8a8_norm_in: eps must be >= 0");
  if (m == 0) return;
  GemvParams p{.x = nullptr,
               .w = w.data,
               .out = out,
               .ldx8 = 0,
               .ldw8 = w.ld / 8,
               .ldo = ldo,
               .n = n,
               .k8 = k / 8,
               .eps = eps,
               .w_scale = w.scale,
               .w_kb = (k + 127) / 128};
  p.ni_delta = static_cast<const uint4*>(delta);
  p.ni_residual = static_cast<uint4*>(residual);
  p.ni_w = static_cast<const uint4*>(norm_w);
  p.ni_ldd8 = ldd / 8;
  p.ni_ldr8 = ldr / 8;
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? n / 2 : n;
  const int64_t rows = gemv_rows(cfg), per_block = epi == GemvEpilogue::silu_mul ? rows / 2 : rows;
  const int64_t groups = (out_cols + per_block - 1) / per_block;
  const Kernel kern = kernel_for<true>(m, epi, cfg);
  const size_t smem = size_t(norm_in_smem_bytes(m, k, gemv_rows(cfg), cfg.warps));
  // The limit first: the occupancy query below counts this shared memory.
  if (smem > 48 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // One wave of resident blocks, each taking row groups b, b + gridDim.x, ... after one prologue.
  const int64_t blocks = std::min(groups, gemv_detail::norm_in_wave(kern, cfg.warps * 32, smem));
  launch({.grid = dim3(unsigned(blocks)),
          .block = dim3(unsigned(cfg.warps * 32)),
          .smem = smem,
          .stream = stream,
          .pdl = pdl,
          .smem_attr_set = true},
         kern, p, NoArgs{});
}

}  // namespace kiln::cuda
