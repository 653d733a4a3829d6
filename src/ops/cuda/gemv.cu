// Small-M GEMV and the fused gate_up + SiLU-and-multiply GEMV; contracts in gemv.h.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "ops/cuda/gemv_kernels.cuh"
#include "ops/cuda/norm_row.cuh"

namespace kiln::cuda {
namespace {

using namespace gemv_detail;

// Blocks of the current gemv_add_rms_norm launch that have stored their outputs; the last one resets it to
// 0 (gemv.h: why one word per device is enough). Module globals are per device.
__device__ unsigned int g_norm_blocks_done = 0;

// Add + RMSNorm (gemv.h): counts the block done; the last block runs the add + RMSNorm over the M rows of
// tmp.
template <int kMinBlocks>
struct NormTail {
  using Args = NoArgs;
  static constexpr int kTcMinBlocks = kMinBlocks;  // gemv.h: gemv_tail_min_blocks
  template <int M, int R>
  static __device__ __forceinline__ void finish(const GemvParams& p, const Args&, int64_t, int warps,
                                                int tid) {
    __shared__ bool last;
    __threadfence();  // release: this thread's tmp stores are visible device-wide before the block counts
    __syncthreads();  // ... and every thread of the block has fenced its stores
    if (tid == 0) {
      last = atomicAdd(&g_norm_blocks_done, 1u) == gridDim.x - 1;
      if (last) atomicExch(&g_norm_blocks_done, 0u);  // every block has counted: ready for the next launch
      __threadfence();  // acquire: the other blocks' tmp stores before this block's reads of tmp
    }
    __syncthreads();
    if (!last) return;
    const int lane = tid % 32;
    for (int m = tid / 32; m < M; m += warps) {
      rms_norm_row<true, 0>(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.out) + m * p.ldo),
                            reinterpret_cast<uint4*>(p.residual + m * p.ldr), p.norm_w,
                            reinterpret_cast<uint4*>(p.normed + m * p.ldn), p.n / 8, p.eps, true, lane);
    }
  }
};

using GemvKernel = void (*)(GemvParams, NoArgs);

// The kernel of config cfg for M = m (1..8): FMA, or tensor cores with cfg.tiles tiles (more than one only
// for the plain kernel: gemv_fusable).
template <GemvEpilogue E, class Tail = PlainTail, bool N = false>
GemvKernel kernel_for(int64_t m, GemvConfig cfg) {
  static constexpr GemvKernel fma[kGemvMaxM] = {gemv_kernel<1, E, Tail, N>, gemv_kernel<2, E, Tail, N>,
                                                gemv_kernel<3, E, Tail, N>, gemv_kernel<4, E, Tail, N>,
                                                gemv_kernel<5, E, Tail, N>, gemv_kernel<6, E, Tail, N>,
                                                gemv_kernel<7, E, Tail, N>, gemv_kernel<8, E, Tail, N>};
  static constexpr GemvKernel mma[kGemvMaxM] = {gemv_tc_kernel<1, E, Tail, N>, gemv_tc_kernel<2, E, Tail, N>,
                                                gemv_tc_kernel<3, E, Tail, N>, gemv_tc_kernel<4, E, Tail, N>,
                                                gemv_tc_kernel<5, E, Tail, N>, gemv_tc_kernel<6, E, Tail, N>,
                                                gemv_tc_kernel<7, E, Tail, N>, gemv_tc_kernel<8, E, Tail, N>};
  if constexpr (std::is_same_v<Tail, PlainTail> && !N) {
    static constexpr GemvKernel mma2[kGemvMaxM] = {
        gemv_tc_kernel<1, E, Tail, N, 2>, gemv_tc_kernel<2, E, Tail, N, 2>, gemv_tc_kernel<3, E, Tail, N, 2>,
        gemv_tc_kernel<4, E, Tail, N, 2>, gemv_tc_kernel<5, E, Tail, N, 2>, gemv_tc_kernel<6, E, Tail, N, 2>,
        gemv_tc_kernel<7, E, Tail, N, 2>, gemv_tc_kernel<8, E, Tail, N, 2>};
    static constexpr GemvKernel mma4[kGemvMaxM] = {
        gemv_tc_kernel<1, E, Tail, N, 4>, gemv_tc_kernel<2, E, Tail, N, 4>, gemv_tc_kernel<3, E, Tail, N, 4>,
        gemv_tc_kernel<4, E, Tail, N, 4>, gemv_tc_kernel<5, E, Tail, N, 4>, gemv_tc_kernel<6, E, Tail, N, 4>,
        gemv_tc_kernel<7, E, Tail, N, 4>, gemv_tc_kernel<8, E, Tail, N, 4>};
    if (cfg.tensor_cores && cfg.tiles == 2) return mma2[m - 1];
    if (cfg.tensor_cores && cfg.tiles == 4) return mma4[m - 1];
  }
  KILN_CHECK(gemv_fusable(cfg), "gemv: the fused forms run one-tile configs only, got ", cfg.tiles, " tiles");
  return (cfg.tensor_cores ? mma : fma)[m - 1];
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool gemv_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo,
                    GemvEpilogue epi) {
  const bool silu = epi == GemvEpilogue::silu_mul;
  return m >= 1 && m <= kGemvMaxM && n >= 1 && k >= 8 && k % 8 == 0 && ldx >= k && ldw >= k && ldx % 8 == 0 &&
         ldw % 8 == 0 && (!silu || n % 2 == 0) && ldo >= (silu ? n / 2 : n);
}

void gemv(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
          int64_t n, int64_t k, GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl) {
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(n >= 1 && k >= 8 && k % 8 == 0, "gemv: N must be >= 1 and K a positive multiple of 8: N ", n,
             " K ", k);
  KILN_CHECK(epi != GemvEpilogue::silu_mul || n % 2 == 0,
             "gemv: the silu_mul epilogue needs an even N (2I), got ", n);
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? n / 2 : n;
  KILN_CHECK(ldx >= k && ldw >= k && ldx % 8 == 0 && ldw % 8 == 0 && ldo >= out_cols,
             "gemv: row strides must be >= the row length (x, W: multiples of 8): ldx ", ldx, " ldw ", ldw,
             " ldo ", ldo);
  KILN_CHECK(aligned16(x) && aligned16(w) && aligned16(out), "gemv: x, W and out must be 16-byte aligned");
  KILN_CHECK(gemv_known_config(cfg), "gemv: unknown config: warps ", cfg.warps, " (2, 4, 8 or 16), tiles ",
             cfg.tiles, " (tensor cores: 1, 2 or 4; FMA: 1)");
  if (m == 0) return;
  const GemvParams p{.x = static_cast<const uint4*>(x),
                     .w = static_cast<const uint4*>(w),
                     .out = out,
                     .ldx8 = ldx / 8,
                     .ldw8 = ldw / 8,
                     .ldo = ldo,
                     .n = n,
                     .k8 = k / 8};
  const int64_t rows = gemv_rows(cfg), per_block = epi == GemvEpilogue::silu_mul ? rows / 2 : rows;
  const int64_t blocks = (out_cols + per_block - 1) / per_block;
  KILN_CHECK(blocks <= 0x7fffffff, "gemv: N too large");
  GemvKernel kern = epi == GemvEpilogue::bf16  ? kernel_for<GemvEpilogue::bf16>(m, cfg)
                    : epi == GemvEpilogue::f32 ? kernel_for<GemvEpilogue::f32>(m, cfg)
                                               : kernel_for<GemvEpilogue::silu_mul>(m, cfg);
  launch(
      {.grid = dim3(unsigned(blocks)), .block = dim3(unsigned(cfg.warps * 32)), .stream = stream, .pdl = pdl},
      kern, p, NoArgs{});
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

void gemv_add_rms_norm(const void* x, int64_t ldx, const void* w, int64_t ldw, void* tmp, int64_t ldt,
                       void* residual, int64_t ldr, const void* norm_w, void* normed, int64_t ldn, int64_t m,
                       int64_t n, int64_t k, float eps, GemvConfig cfg, cudaStream_t stream, bool pdl) {
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv_add_rms_norm: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(gemv_add_rms_norm_supported(m == 0 ? 1 : m, n, k, ldx, ldw, ldt, ldr, ldn),
             "gemv_add_rms_norm: unsupported call: N ", n, " (a multiple of 8) K ", k,
             " (a multiple of 8) ldx ", ldx, " ldw ", ldw, " ldt ", ldt, " ldr ", ldr, " ldn ", ldn,
             " (multiples of 8, >= the row length)");
  KILN_CHECK(aligned16(x) && aligned16(w) && aligned16(tmp) && aligned16(residual) && aligned16(norm_w) &&
                 aligned16(normed),
             "gemv_add_rms_norm: x, W, tmp, residual, norm weight and normed must be 16-byte aligned");
  KILN_CHECK(gemv_known_config(cfg) && gemv_fusable(cfg),
             "gemv_add_rms_norm: warps must be 2, 4, 8 or 16 and tiles 1, got warps ", cfg.warps, " tiles ",
             cfg.tiles);
  KILN_CHECK(eps >= 0.0f, "gemv_add_rms_norm: eps must be >= 0");
  if (m == 0) return;
  const GemvParams p{.x = static_cast<const uint4*>(x),
                     .w = static_cast<const uint4*>(w),
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
  const int64_t rows = gemv_rows(cfg), blocks = (n + rows - 1) / rows;
  KILN_CHECK(blocks <= 0x7fffffff, "gemv_add_rms_norm: N too large");
  launch(
      {.grid = dim3(unsigned(blocks)), .block = dim3(unsigned(cfg.warps * 32)), .stream = stream, .pdl = pdl},
      cfg.tensor_cores && gemv_tail_min_blocks() == 3 ? kernel_for<GemvEpilogue::bf16, NormTail<3>>(m, cfg)
                                                      : kernel_for<GemvEpilogue::bf16, NormTail<0>>(m, cfg),
      p, NoArgs{});
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

// Resident blocks of `kern` on the whole current device (SMs x blocks per SM) for this block size and
// shared memory, asked of the driver once per (device, kernel, block, smem): the launch is on decode's hot
// path.
static int64_t norm_in_wave(GemvKernel kern, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, GemvKernel, int, size_t>, int64_t> waves;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, kern, threads, smem);
  if (const auto it = waves.find(key); it != waves.end()) return it->second;
  int sms = 0, per_sm = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
  return waves[key] = int64_t(sms) * std::max(per_sm, 1);
}

bool gemv_norm_in_supported(int64_t m, int64_t n, int64_t k, int64_t ldd, int64_t ldr, int64_t ldw,
                            int64_t ldo, GemvEpilogue epi) {
  return gemv_supported(m, n, k, k, ldw, ldo, epi) && ldd >= k && ldr >= k && ldd % 8 == 0 && ldr % 8 == 0 &&
         norm_in_smem_bytes(m, k / 8) <= kGemvNormInMaxSmem;
}

void gemv_norm_in(const void* delta, int64_t ldd, void* residual, int64_t ldr, const void* norm_w, float eps,
                  const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                  GemvEpilogue epi, GemvConfig cfg, cudaStream_t stream, bool pdl, int groups_per_block) {
  KILN_CHECK(m >= 0 && m <= kGemvMaxM, "gemv_norm_in: M must be in [0, ", kGemvMaxM, "], got ", m);
  KILN_CHECK(groups_per_block >= 0, "gemv_norm_in: groups_per_block must be >= 0, got ", groups_per_block);
  KILN_CHECK(gemv_norm_in_supported(m == 0 ? 1 : m, n, k, ldd, ldr, ldw, ldo, epi),
             "gemv_norm_in: unsupported call: N ", n, " K ", k, " (a multiple of 8) ldd ", ldd, " ldr ", ldr,
             " ldw ", ldw, " (multiples of 8, >= K) ldo ", ldo, ", prologue rows of ",
             norm_in_smem_bytes(m, k / 8), " bytes (at most ", kGemvNormInMaxSmem, ")");
  KILN_CHECK(aligned16(delta) && aligned16(residual) && aligned16(norm_w) && aligned16(w) && aligned16(out),
             "gemv_norm_in: delta, residual, norm weight, W and out must be 16-byte aligned");
  KILN_CHECK(gemv_known_config(cfg) && gemv_fusable(cfg),
             "gemv_norm_in: warps must be 2, 4, 8 or 16 and tiles 1, got warps ", cfg.warps, " tiles ",
             cfg.tiles);
  KILN_CHECK(eps >= 0.0f, "gemv_norm_in: eps must be >= 0");
  if (m == 0) return;
  GemvParams p{.x = nullptr,
               .w = static_cast<const uint4*>(w),
               .out = out,
               .ldx8 = 0,
               .ldw8 = ldw / 8,
               .ldo = ldo,
               .n = n,
               .k8 = k / 8,
               .eps = eps};
  p.ni_delta = static_cast<const uint4*>(delta);
  p.ni_residual = static_cast<uint4*>(residual);
  p.ni_w = static_cast<const uint4*>(norm_w);
  p.ni_ldd8 = ldd / 8;
  p.ni_ldr8 = ldr / 8;
  const int64_t out_cols = epi == GemvEpilogue::silu_mul ? n / 2 : n;
  const int64_t rows = gemv_rows(cfg), per_block = epi == GemvEpilogue::silu_mul ? rows / 2 : rows;
  const int64_t groups = (out_cols + per_block - 1) / per_block;
  GemvKernel kern = epi == GemvEpilogue::bf16  ? kernel_for<GemvEpilogue::bf16, PlainTail, true>(m, cfg)
                    : epi == GemvEpilogue::f32 ? kernel_for<GemvEpilogue::f32, PlainTail, true>(m, cfg)
                                               : kernel_for<GemvEpilogue::silu_mul, PlainTail, true>(m, cfg);
  // Blocks take row groups blockIdx.x, + gridDim.x, ... after their one prologue (gemv_kernels.cuh): one
  // wave of resident blocks by default, else groups_per_block groups each.
  // The kernels' static shared memory (the warps' sums, at most 4 KB, and the prologue's scalars) counts
  // against the 48 KB a launch gets without raising the limit.
  const size_t smem = size_t(norm_in_smem_bytes(m, k / 8));
  if (smem > 40 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (groups_per_block == 0) groups_per_block = norm_in_groups_env();
  int64_t blocks = groups;
  if (groups_per_block > 0) {
    blocks = (groups + groups_per_block - 1) / groups_per_block;
  } else {
    blocks = std::min<int64_t>(groups, norm_in_wave(kern, cfg.warps * 32, smem));
  }
  KILN_CHECK(blocks <= 0x7fffffff, "gemv_norm_in: N too large");
  launch({.grid = dim3(unsigned(blocks)),
          .block = dim3(unsigned(cfg.warps * 32)),
          .smem = smem,
          .stream = stream,
          .pdl = pdl,
          .smem_attr_set = true},
         kern, p, NoArgs{});
}

}  // namespace kiln::cuda
