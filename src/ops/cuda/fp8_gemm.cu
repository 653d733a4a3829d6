// fp8_gemm.h: the activation quantizer kernel, the shape guards and the launcher of the sm_90a GEMM
// (fp8_gemm_sm90.cuh).
#include "ops/cuda/fp8_gemm.h"

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
  KILN_CHECK(known, "fp8_gemm: config tile_n ", cfg.tile_n, " stages ", cfg.stages,
             " is not in kFp8GemmConfigs");
  KILN_CHECK(workspace && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
             "fp8_gemm: the workspace must be 256-byte aligned");
  KILN_CHECK(workspace_bytes >= fp8_gemm_workspace_bytes(m, k), "fp8_gemm: workspace of ", workspace_bytes,
             " bytes, ", fp8_gemm_workspace_bytes(m, k), " needed for M = ", m, ", K = ", k);
}

// The kernel's parameters: both tensor maps (host encoding, no device work), the tile grid.
fp8_gemm_sm90::Params gemm_params(const void* wq, int64_t ldw, const float* wscale, void* out, int64_t ldo,
                                  int64_t m, int64_t n, int64_t k, const void* workspace,
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
  const int64_t units = int64_t(p.tiles_m / c) * p.tiles_n;
  KILN_CHECK(units * c < (int64_t(1) << 31), "fp8_gemm: ", units, " tiles");
  p.units = int(units);
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
}

}  // namespace

void fp8_gemm_quantized(const void* wq, int64_t ldw, const float* wscale, void* out, int64_t ldo, int64_t m,
                        int64_t n, int64_t k, const void* workspace, int64_t workspace_bytes,
                        Fp8GemmConfig cfg, cudaStream_t stream) {
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
