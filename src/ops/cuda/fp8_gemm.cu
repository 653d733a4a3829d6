// fp8_gemm.h: the activation quantizer kernel, the shape guards and the launcher of the sm_90a GEMM
// (fp8_gemm_sm90.cuh).
#include "ops/cuda/fp8_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <iterator>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/fp8_act_quant.cuh"
#include "ops/cuda/fp8_gemm_sm90.cuh"
#include "ops/cuda/tensor_map.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kGroup = 128;        // activation group along K (ops::kFp8Block)
constexpr int kQuantRowsPerBlock = 8;  // one warp a row

int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

// Mapping: grid (m_pad / 8, ceil(K / 256)), block 256 threads = 8 warps; warp w owns row blockIdx.x * 8 + w
// and columns blockIdx.y * 256 .. + 255, i.e. two groups of 128, one per half-warp; lane l loads the 8 bf16
// at column 256 blockIdx.y + 8 l (one 16-byte load; K % 16 == 0, so a lane's 8 columns are all in or all past
// K). A half-warp's amax, a_s and the 8 codes by fp8_act_quant.cuh's quantize_act8 (the hardware's
// cvt.rn.satfinite.e4m3x2.f32 is exactly ops/fp8.h's encoder, as tests/cuda/test_attn_prep_convert.cu checks
// on every bf16 and f16 value and 2^20 random f32), as quantize_act_group computes them. Writes 8 code bytes
// a lane and one scale a half-warp (xs[kb * m_pad + row]); rows M .. m_pad - 1 only write scale 0.
__global__ void __launch_bounds__(256)
    quantize_act_kernel(const uint16_t* __restrict__ x, int64_t ldx, int m, int k, int m_pad,
                        uint8_t* __restrict__ q, float* __restrict__ xs) {
  pdl_launch_dependents();  // the GEMM may start its prologue; it waits for this grid before reading
  const int lane = int(threadIdx.x % 32), row = int(blockIdx.x) * kQuantRowsPerBlock + int(threadIdx.x / 32);
  const int col = int(blockIdx.y) * 256 + lane * 8, kb = col / int(kGroup);
  const bool in = col < k;
  if (row >= m_pad) return;
  if (row >= m) {
    if (in && lane % 16 == 0) xs[int64_t(kb) * m_pad + row] = 0.0f;
    return;
  }
  uint4 raw = make_uint4(0, 0, 0, 0);
  if (in) raw = __ldg(reinterpret_cast<const uint4*>(x + int64_t(row) * ldx + col));
  const ActQuant8 a = quantize_act8(raw);  // the whole warp: the half-warp butterfly
  if (!in) return;
  *reinterpret_cast<uint2*>(q + int64_t(row) * k + col) = a.codes;
  if (lane % 16 == 0) xs[int64_t(kb) * m_pad + row] = a.scale;
}

// The split-K reduce (fp8_gemm.h, "Split-K"). Mapping: grid ceil(M * ldp / 4 / 256), block 256; thread i owns
// row i / (ldp / 4) and columns 4 (i % (ldp / 4)) .. + 3 (ldp = N rounded up to 4, so its first column is <
// N): one 16-byte load a split (the partial tiles are [split][M][ldp] f32), summed from split 0 up, fp32 adds
// in ascending split order (no other order, so the result is deterministic), one bf16 rounding, 8 bytes
// stored (4 bf16; ldo % 8 == 0 and 4 | column, so aligned) or the columns < N one by one at a ragged N.
// Launched with PDL after the GEMM: waits for it before reading, then lets the next kernel launch.
constexpr int kReduceThreads = 256;
__global__ void __launch_bounds__(kReduceThreads)
    split_k_reduce_kernel(const float* __restrict__ part, int64_t ldp, int m, int n, int split,
                          __nv_bfloat16* __restrict__ out, int64_t ldo) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t per_row = ldp / 4, i = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (i >= int64_t(m) * per_row) return;
  const int64_t r = i / per_row, c = (i - r * per_row) * 4;
  const int64_t plane = int64_t(m) * ldp;  // floats per split
  const float* src = part + r * ldp + c;
  float4 acc = __ldcg(reinterpret_cast<const float4*>(src));
  for (int s = 1; s < split; ++s) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src + s * plane));
    acc.x = __fadd_rn(acc.x, v.x);
    acc.y = __fadd_rn(acc.y, v.y);
    acc.z = __fadd_rn(acc.z, v.z);
    acc.w = __fadd_rn(acc.w, v.w);
  }
  __nv_bfloat16* dst = out + r * ldo + c;
  if (c + 4 <= n) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y), hi = __floats2bfloat162_rn(acc.z, acc.w);
    uint2 v;
    v.x = *reinterpret_cast<const uint32_t*>(&lo);
    v.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst) = v;
  } else {
    const float a[4] = {acc.x, acc.y, acc.z, acc.w};
    for (int j = 0; j < 4 && c + j < n; ++j) dst[j] = __float2bfloat16_rn(a[j]);
  }
}

// One compiled kernel (a config less its persistence): its launch, preparation and cluster residency.
struct Kernel {
  int tile_n, stages, cluster;
  bool tma_store;
  void (*launch)(const fp8_gemm_sm90::Params&, int, cudaStream_t);
  bool (*prepare)();
  int (*resident_clusters)();
};
template <int BN, int S, int C, bool T>
constexpr Kernel kernel_of() {
  namespace g = fp8_gemm_sm90;
  return {BN, S, C, T, &g::launch<BN, S, C, T>, &g::prepare<BN, S, C, T>, &g::resident_clusters<BN, S, C, T>};
}
constexpr Kernel kKernels[] = {
    kernel_of<64, 8, 1, false>(),  kernel_of<128, 6, 1, false>(), kernel_of<128, 6, 2, false>(),
    kernel_of<128, 5, 1, true>(),  kernel_of<128, 5, 2, true>(),  kernel_of<192, 5, 1, false>(),
    kernel_of<192, 5, 2, false>(), kernel_of<192, 4, 2, true>(),
};

// The kernel of a config of kFp8GemmConfigs (null for any other).
const Kernel* kernel_for(const Fp8GemmConfig& cfg) {
  bool listed = false;
  for (const Fp8GemmConfig& c : kFp8GemmConfigs) listed = listed || c == cfg;
  if (!listed) return nullptr;
  for (const Kernel& k : kKernels)
    if (k.tile_n == cfg.tile_n && k.stages == cfg.stages && k.cluster == cfg.cluster &&
        k.tma_store == cfg.tma_store)
      return &k;
  return nullptr;
}

// sm_90 with this build's sm_90a code for every kernel, and the tensor-map entry point (once per device).
bool device_supported() {
  static PerDeviceFlag flag;
  return flag.get([] {
    if (!current_device_is_sm90() || !tensor_maps_available()) return false;
    for (const Kernel& k : kKernels)
      if (!k.prepare()) return false;
    return true;
  });
}

bool shape_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo) {
  return m >= 1 && n >= 1 && k >= 16 && m < (int64_t(1) << 30) && n < (int64_t(1) << 30) &&
         k < (int64_t(1) << 24) && k % 16 == 0 && ldx >= k && ldx % 8 == 0 && ldw >= k && ldw % 16 == 0 &&
         ldo >= n && ldo % 8 == 0;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool fp8_gemm_supported(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldo) {
  return shape_supported(m, n, k, ldx, ldw, ldo) && device_supported();
}

int64_t fp8_act_scale_rows(int64_t m) {
  return round_up(m, 2 * fp8_gemm_sm90::kBM);  // whole tile pairs for the clusters of two
}

int64_t fp8_act_scale_offset(int64_t m, int64_t k) {
  return round_up(m * k, 256);
}

int64_t fp8_gemm_workspace_bytes(int64_t m, int64_t k) {
  return fp8_act_scale_offset(m, k) + (k + kGroup - 1) / kGroup * fp8_act_scale_rows(m) * 4;
}

int fp8_gemm_split(const Fp8GemmConfig& cfg, int64_t m, int64_t k) {
  if (cfg.split_k <= 1 || m > kFp8GemmSplitKMaxM) return 1;
  return int(std::min<int64_t>(cfg.split_k, (k + kGroup - 1) / kGroup));
}

namespace {
// Where the split-K partials start in the workspace, and their row stride (16-byte rows).
int64_t partial_offset(int64_t m, int64_t k) {
  return round_up(fp8_gemm_workspace_bytes(m, k), 256);
}
int64_t partial_ld(int64_t n) {
  return round_up(n, 4);
}
}  // namespace

int64_t fp8_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, const Fp8GemmConfig& cfg) {
  const int split = fp8_gemm_split(cfg, m, k);
  if (split == 1) return fp8_gemm_workspace_bytes(m, k);
  return partial_offset(m, k) + int64_t(split) * m * partial_ld(n) * 4;
}

void fp8_quantize_act(const void* x, int64_t ldx, int64_t m, int64_t k, void* workspace,
                      int64_t workspace_bytes, cudaStream_t stream) {
  KILN_CHECK(m >= 1 && k >= 16 && k % 16 == 0 && m < (int64_t(1) << 30) && k < (int64_t(1) << 24),
             "fp8_quantize_act: M = ", m, ", K = ", k,
             " (1 <= M < 2^30; K a multiple of 16, 16 <= K < 2^24)");
  KILN_CHECK(ldx >= k && ldx % 8 == 0, "fp8_quantize_act: ldx = ", ldx, " (>= K = ", k, ", a multiple of 8)");
  KILN_CHECK(aligned16(x) && workspace && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
             "fp8_quantize_act: x must be 16-byte and the workspace 256-byte aligned");
  KILN_CHECK(workspace_bytes >= fp8_gemm_workspace_bytes(m, k), "fp8_quantize_act: workspace of ",
             workspace_bytes, " bytes, ", fp8_gemm_workspace_bytes(m, k), " needed for M = ", m, ", K = ", k);
  const int64_t m_pad = fp8_act_scale_rows(m);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const LaunchCfg cfg{.grid = dim3(unsigned(m_pad / kQuantRowsPerBlock), unsigned((k + 255) / 256)),
                      .block = dim3(256),
                      .stream = stream};
  launch(cfg, quantize_act_kernel, static_cast<const uint16_t*>(x), ldx, int(m), int(k), int(m_pad), ws,
         reinterpret_cast<float*>(ws + fp8_act_scale_offset(m, k)));
}

namespace {

// fp8_gemm's checks of everything but x (its own are fp8_quantize_act's), before anything is enqueued.
void check_gemm_args(const void* wq, int64_t ldw, const float* wscale, const void* out, int64_t ldo,
                     int64_t m, int64_t n, int64_t k, int64_t ldx, const void* workspace,
                     int64_t workspace_bytes, const Fp8GemmConfig& cfg) {
  KILN_CHECK(shape_supported(m, n, k, ldx, ldw, ldo), "fp8_gemm: unsupported shape M = ", m, ", N = ", n,
             ", K = ", k, ", ldx = ", ldx, ", ldw = ", ldw, ", ldo = ", ldo,
             " (M, N < 2^30; K a multiple of 16 below 2^24; ldx, ldo multiples of 8, ldw of 16)");
  KILN_CHECK(device_supported(), "fp8_gemm: needs an sm_90 GPU running this build's sm_90a code");
  KILN_CHECK(aligned16(wq) && aligned16(out) && wscale && reinterpret_cast<uintptr_t>(wscale) % 4 == 0,
             "fp8_gemm: wq and out must be 16-byte aligned, wscale 4-byte aligned");
  bool known = false;
  for (const Fp8GemmConfig& c : kFp8GemmConfigs) known = known || c == cfg;
  KILN_CHECK(known, "fp8_gemm: config tile_n ", cfg.tile_n, " stages ", cfg.stages, " split_k ", cfg.split_k,
             " is not in kFp8GemmConfigs");
  KILN_CHECK(workspace && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
             "fp8_gemm: the workspace must be 256-byte aligned");
  const int64_t need = fp8_gemm_workspace_bytes(m, n, k, cfg);
  KILN_CHECK(workspace_bytes >= need, "fp8_gemm: workspace of ", workspace_bytes, " bytes, ", need,
             " needed for M = ", m, ", N = ", n, ", K = ", k, ", split ", fp8_gemm_split(cfg, m, k));
}

// The kernel's parameters: both tensor maps (host encoding, no device work), the tile grid.
fp8_gemm_sm90::Params gemm_params(const void* wq, int64_t ldw, const float* wscale, void* out, int64_t ldo,
                                  int64_t m, int64_t n, int64_t k, void* workspace,
                                  const Fp8GemmConfig& cfg) {
  const int bn = cfg.tile_n, c = cfg.cluster;
  fp8_gemm_sm90::Params p{};
  {
    const uint64_t dims[2] = {uint64_t(k), uint64_t(m)}, strides[1] = {uint64_t(k)};
    const uint32_t box[2] = {uint32_t(fp8_gemm_sm90::kBK), uint32_t(fp8_gemm_sm90::kBM)};
    KILN_CHECK(
        try_encode_tiled_map(&p.tmap_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, workspace, dims, strides, box),
        "fp8_gemm: the driver refused the activations' tensor map (M = ", m, ", K = ", k, ")");
  }
  {
    // A cluster of two loads half of the weight tile each (multicast to both).
    const uint64_t dims[2] = {uint64_t(k), uint64_t(n)}, strides[1] = {uint64_t(ldw)};
    const uint32_t box[2] = {uint32_t(fp8_gemm_sm90::kBK), uint32_t(bn / c)};
    KILN_CHECK(try_encode_tiled_map(&p.tmap_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, wq, dims, strides, box),
               "fp8_gemm: the driver refused the weight's tensor map (N = ", n, ", K = ", k, ", ldw = ", ldw,
               ")");
  }
  if (cfg.tma_store) {
    // The output in boxes of 64 columns x 64 rows (one consumer's rows, one 128-byte swizzled column block).
    const uint64_t dims[2] = {uint64_t(n), uint64_t(m)}, strides[1] = {uint64_t(ldo) * 2};
    const uint32_t box[2] = {64, 64};
    KILN_CHECK(
        try_encode_tiled_map(&p.tmap_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, out, dims, strides, box),
        "fp8_gemm: the driver refused the output's tensor map (M = ", m, ", N = ", n, ", ldo = ", ldo, ")");
  }
  const int64_t m_pad = fp8_act_scale_rows(m);
  p.a_scale =
      reinterpret_cast<const float*>(static_cast<const uint8_t*>(workspace) + fp8_act_scale_offset(m, k));
  p.w_scale = wscale;
  p.out = out;
  p.ldo = ldo;
  p.m = int(m);
  p.n = int(n);
  p.kblocks = int((k + kGroup - 1) / kGroup);
  p.m_pad = int(m_pad);
  // Clusters of two take tile pairs along M: an even count (xs has the rows: m_pad is a multiple of 256).
  p.tiles_m = int(c == 1 ? (m + fp8_gemm_sm90::kBM - 1) / fp8_gemm_sm90::kBM : m_pad / fp8_gemm_sm90::kBM);
  p.n_scale_rows = int((n + kGroup - 1) / kGroup);
  p.tiles_n = int((n + bn - 1) / bn);
  const int64_t tile_units = int64_t(p.tiles_m / c) * p.tiles_n;
  p.split = fp8_gemm_split(cfg, m, k);
  const int64_t units = tile_units * p.split;
  KILN_CHECK(units * c < (int64_t(1) << 31), "fp8_gemm: ", units, " tiles");
  p.tile_units = int(tile_units);
  p.units = int(units);
  if (p.split > 1) {
    p.ldp = partial_ld(n);
    p.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + partial_offset(m, k));
  }
  return p;
}

// Clusters of two of kernel `k` resident at once on the current device (cached per device and kernel).
int resident_pairs(const Kernel& k) {
  constexpr int kMaxKernels = int(std::size(kKernels));
  static std::atomic<int> cache[64][kMaxKernels] = {};
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  std::atomic<int>& c = cache[dev % 64][&k - kKernels];
  int v = c.load(std::memory_order_relaxed);
  if (v <= 0) {
    v = k.resident_clusters();
    KILN_CHECK(v > 0, "fp8_gemm: no cluster of two CTAs fits on this GPU (tile_n ", k.tile_n, ")");
    c.store(v, std::memory_order_relaxed);
  }
  return v;
}

void launch_gemm(const fp8_gemm_sm90::Params& p, const Fp8GemmConfig& cfg, cudaStream_t stream) {
  const Kernel& k = *kernel_for(cfg);  // check_gemm_args found it
  int groups = p.units;                // blocks (cluster 1) or clusters of two
  if (cfg.persistent) {
    int dev = 0, sms = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    groups = std::min(groups, cfg.cluster == 1 ? sms : resident_pairs(k));
  }
  k.launch(p, groups * cfg.cluster, stream);
  if (p.split > 1) {
    const int64_t threads = int64_t(p.m) * (p.ldp / 4);
    const LaunchCfg rc{.grid = dim3(unsigned((threads + kReduceThreads - 1) / kReduceThreads)),
                       .block = dim3(kReduceThreads),
                       .stream = stream,
                       .pdl = true};
    launch(rc, split_k_reduce_kernel, static_cast<const float*>(p.partial), p.ldp, p.m, p.n, p.split,
           static_cast<__nv_bfloat16*>(p.out), p.ldo);
  }
}

}  // namespace

void fp8_gemm_quantized(const void* wq, int64_t ldw, const float* wscale, void* out, int64_t ldo, int64_t m,
                        int64_t n, int64_t k, void* workspace, int64_t workspace_bytes, Fp8GemmConfig cfg,
                        cudaStream_t stream) {
  check_gemm_args(wq, ldw, wscale, out, ldo, m, n, k, k, workspace, workspace_bytes, cfg);
  launch_gemm(gemm_params(wq, ldw, wscale, out, ldo, m, n, k, workspace, cfg), cfg, stream);
}

void fp8_gemm(const void* x, int64_t ldx, const void* wq, int64_t ldw, const float* wscale, void* out,
              int64_t ldo, int64_t m, int64_t n, int64_t k, void* workspace, int64_t workspace_bytes,
              Fp8GemmConfig cfg, cudaStream_t stream) {
  check_gemm_args(wq, ldw, wscale, out, ldo, m, n, k, ldx, workspace, workspace_bytes, cfg);
  KILN_CHECK(aligned16(x), "fp8_gemm: x must be 16-byte aligned");
  const fp8_gemm_sm90::Params p = gemm_params(wq, ldw, wscale, out, ldo, m, n, k, workspace, cfg);
  fp8_quantize_act(x, ldx, m, k, workspace, workspace_bytes, stream);
  launch_gemm(p, cfg, stream);
}

}  // namespace kiln::cuda
