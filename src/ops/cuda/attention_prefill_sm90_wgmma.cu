// Hopper wgmma prefill (PrefillKernel::v4, the default on sm_90) launcher: where it applies, the TMA tensor
// maps of a bf16 cache, the launch (the kernel is attention_prefill_sm90_wgmma_kernel.cuh).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "ops/cuda/attention_prefill_sm90_wgmma.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/tensor_map.h"

namespace kiln::cuda {
namespace {

// One bf16 cache (K or V) as the 4-D tensor the kernel's TMA boxes address
// (attention_prefill_sm90_wgmma.cuh): (d, row-or-head, head-or-row, page) with byte strides (s_row or s_head,
// the other, s_page) * 2; box 64 d x page_size rows; 128-byte swizzle (the layout the wgmma descriptors
// expect). False when the driver refuses it (the kernel then gathers every tile with its producer threads).
bool encode_kv_map(CUtensorMap* map, const void* base, const PagedAttnParams& p, bool rows_dim1) {
  const uint64_t row_dim = uint64_t(p.page_size), head_dim = uint64_t(p.Hkv);
  const uint64_t row_stride = uint64_t(p.s_row) * 2, head_stride = uint64_t(p.s_head) * 2;
  const uint64_t dims[4] = {uint64_t(p.D), rows_dim1 ? row_dim : head_dim, rows_dim1 ? head_dim : row_dim,
                            uint64_t(p.num_pages)};
  const uint64_t strides[3] = {rows_dim1 ? row_stride : head_stride, rows_dim1 ? head_stride : row_stride,
                               uint64_t(p.s_page) * 2};
  const uint32_t box[4] = {64, rows_dim1 ? uint32_t(p.page_size) : 1u, rows_dim1 ? 1u : uint32_t(p.page_size),
                           1};
  return try_encode_tiled_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box);
}

// Whether the current device is sm_90 and runs the sm_90a code of every v4 instantiation (a build
// without sm_90a, or another GPU, falls back). Checked once per device.
bool device_runs_prefill_sm90() {
  static PerDeviceFlag flag;
  return flag.get([] {
    return current_device_is_sm90() && prefill_sm90_binary_version<128, KvDtype::bf16>() == 90 &&
           prefill_sm90_binary_version<128, KvDtype::f8e4m3>() == 90 &&
           prefill_sm90_binary_version<64, KvDtype::bf16>() == 90 &&
           prefill_sm90_binary_version<64, KvDtype::f8e4m3>() == 90;
  });
}

// Whether the environment variable is set to something other than "" or "0".
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// Debugging aids, read once (same arithmetic, same bits; to tell a fault's place on the GPU):
// KILN_ATTN_PREFILL_SERIAL=1: the consumers run each tile's two products in turn instead of overlapping the
// softmax with the previous P V; KILN_ATTN_PREFILL_NO_TMA=1: every tile is gathered by the producer threads;
// KILN_ATTN_PREFILL_NO_PINGPONG=1: the two consumers issue their products without taking turns.
bool prefill_sm90_overlap() {
  static const bool overlap = !env_flag("KILN_ATTN_PREFILL_SERIAL");
  return overlap;
}
bool prefill_sm90_tma_allowed() {
  static const bool allowed = !env_flag("KILN_ATTN_PREFILL_NO_TMA");
  return allowed;
}

template <int D>
void launch_d(const LaunchCfg& cfg, const PrefillSm90Params& prm) {
  if (prm.p.kv_dtype == KvDtype::bf16)
    launch_prefill_sm90_kernel<D, KvDtype::bf16>(cfg, prm, prefill_sm90_overlap());
  else
    launch_prefill_sm90_kernel<D, KvDtype::f8e4m3>(cfg, prm, prefill_sm90_overlap());
}

}  // namespace

bool prefill_sm90_applies(const PagedAttnParams& p) {
  return (p.D == 64 || p.D == 128) && device_runs_prefill_sm90();
}

bool prefill_sm90_uses_tma(const PagedAttnParams& p) {
  return p.kv_dtype == KvDtype::bf16 && p.page_size % 16 == 0 && prefill_sm90::kBN % p.page_size == 0 &&
         prefill_sm90_tma_allowed() && tensor_maps_available();
}

bool launch_prefill_sm90(const PagedAttnParams& p, bool skip_single_rows, cudaStream_t stream, bool pdl) {
  if (!prefill_sm90_applies(p)) return false;
  PrefillSm90Params prm{};
  prm.p = p;
  prm.skip_single = skip_single_rows ? 1 : 0;
  prm.G = p.Hq / p.Hkv;
  static const bool pingpong = !env_flag("KILN_ATTN_PREFILL_NO_PINGPONG");
  prm.pingpong = pingpong ? 1 : 0;
  if (prefill_sm90_uses_tma(p)) {
    prm.rows_dim1 = p.s_row <= p.s_head ? 1 : 0;
    prm.use_tma = encode_kv_map(&prm.tmap_k, p.k, p, prm.rows_dim1 != 0) &&
                          encode_kv_map(&prm.tmap_v, p.v, p, prm.rows_dim1 != 0)
                      ? 1
                      : 0;
  }
  // Q by TMA where a consumer's 64 packed rows are whole tokens (G divides 64): one box of G heads x 64 / G
  // tokens. q is (d, head, token) with the caller's strides; tokens past T read as zeros.
  if (64 % prm.G == 0 && tensor_maps_available() && prefill_sm90_tma_allowed()) {
    const uint64_t dims[3] = {uint64_t(p.D), uint64_t(p.Hq), uint64_t(p.T)};
    const uint64_t strides[2] = {uint64_t(p.q_stride_h) * 2, uint64_t(p.q_stride_t) * 2};
    const uint32_t box[3] = {64, uint32_t(prm.G), uint32_t(64 / prm.G)};
    prm.use_tma_q =
        try_encode_tiled_map(&prm.tmap_q, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, p.q, dims, strides, box) ? 1
                                                                                                        : 0;
  }
  // Work items: sum over sequences of ceil(q_len G / kBM) <= ceil(T G / kBM) + B; one persistent block an
  // SM at most (the shared memory holds one).
  const int64_t items = (int64_t(p.T) * prm.G + prefill_sm90::kBM - 1) / prefill_sm90::kBM + p.B;
  KILN_CHECK(items * p.Hkv < (int64_t(1) << 30), "paged attention prefill v4: ", items * p.Hkv,
             " work items");
  const int64_t blocks = std::min<int64_t>(items * p.Hkv, sm_count());
  const LaunchCfg cfg{.grid = dim3(unsigned(blocks)),
                      .block = dim3(prefill_sm90::kThreads),
                      .smem = p.D == 128 ? prefill_sm90::smem_bytes<128>() : prefill_sm90::smem_bytes<64>(),
                      .stream = stream,
                      .pdl = pdl};
  if (p.D == 128)
    launch_d<128>(cfg, prm);
  else
    launch_d<64>(cfg, prm);
  return true;
}

}  // namespace kiln::cuda
