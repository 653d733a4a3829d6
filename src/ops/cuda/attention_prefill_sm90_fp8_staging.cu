// FP8 prefill through bf16 staging: an fp8 cache's pages that prefill v4 will read are first widened into
// a bf16 copy in the workspace (exact: e4m3 * 2^k is a bf16 value), then v4 runs on that copy with its TMA
// path. Measured on the H200 (docs/PERF.md): v4's producer warpgroup widening fp8 rows itself is the
// prefill's bottleneck (203 TFLOP/s at 4096 tokens against 372 for bf16), while the copy costs one pass over
// the context (1 byte read, 2 written per element). The kernel's inputs are the same bf16 values either way,
// so the output is bitwise the unstaged v4's (tests/cuda/test_cuda_attention.cpp checks it).
//
// Work mapping (stage_fp8_pages): grid (prefill_pages, Hkv), 128 threads. The staged sequences are the ones
// the prefill kernel runs (prefill_sm90_runs_sequence); staged page x is, in sequence order, page i of
// sequence b (each warp finds (b, i) alone: a prefix sum of ceil(kv_len / page_size) over 32 sequences at a
// time). Block (x, hk) widens rows [0, min(page_size, kv_len - i page_size)) of KV head hk of that page, K
// then V, 8 elements a thread and step (one 8-byte load, one scale byte, one 16-byte store), into slot x of
// the staging copy: HND bf16 [slot][Hkv][page_size][D] for K, the same after it for V. Block (x, 0) writes
// the staged table entry table[b, i] = x. Rows past kv_len are not written: v4 never reads them (it
// zero-fills a tile's rows at or past kv_len itself).
#include <cstdlib>
#include <string>

#include "ops/cuda/attention_prefill_sm90_wgmma.cuh"
#include "ops/cuda/tensor_map.h"

namespace kiln::cuda {
namespace {

constexpr int kStageThreads = 128;

// Whether prefill v4 runs sequence b (the same test as its find_work): staged iff so.
__device__ __forceinline__ int staged_pages_of(const PagedAttnParams& p, bool skip_single, int b) {
  const int q_len = p.cu_q[b + 1] - p.cu_q[b], kv_len = p.kv_lens[b];
  const bool runs = q_len > 0 && !(skip_single && q_len == 1) && kv_len >= q_len &&
                    kv_len <= int64_t(p.pages_stride) * p.page_size;
  return runs ? (kv_len + p.page_size - 1) / p.page_size : 0;
}

// Staged page x -> (sequence b, its page i); false when x is past the last staged page. Warp-uniform.
__device__ __forceinline__ bool find_page(const PagedAttnParams& p, bool skip_single, int x, int* b_out,
                                          int* i_out) {
  const int lane = int(threadIdx.x % 32);
  int base = 0;
  for (int b0 = 0; b0 < p.B; b0 += 32) {
    const int b = b0 + lane;
    const int n = b < p.B ? staged_pages_of(p, skip_single, b) : 0;
    const int incl = warp_inclusive_sum(n);
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (x < base + total) {
      const int L = __ffs(__ballot_sync(0xffffffffu, x < base + incl)) - 1;
      *b_out = b0 + L;
      *i_out = x - base - (__shfl_sync(0xffffffffu, incl, L) - __shfl_sync(0xffffffffu, n, L));
      return true;
    }
    base += total;
  }
  return false;
}

template <int D>
__global__ void __launch_bounds__(kStageThreads)
    stage_fp8_pages(const PagedAttnParams p, int skip_single, uint16_t* staged, int32_t* table) {
  pdl_wait();
  const int x = int(blockIdx.x), hk = int(blockIdx.y);
  int b = 0, i = 0;
  if (find_page(p, skip_single != 0, x, &b, &i)) {
    if (hk == 0 && threadIdx.x == 0) table[int64_t(b) * p.pages_stride + i] = x;
    const int page = kv_page(p, b, i * p.page_size);
    const int rows = min(p.page_size, p.kv_lens[b] - i * p.page_size);
    const int64_t slot_elems = int64_t(p.Hkv) * p.page_size * D;
    uint16_t* const dst_k = staged + int64_t(x) * slot_elems + int64_t(hk) * p.page_size * D;
    uint16_t* const dst_v = dst_k + int64_t(gridDim.x) * slot_elems;
    constexpr int kChunks = D / 8;
    for (int c = int(threadIdx.x); c < 2 * rows * kChunks; c += kStageThreads) {
      const bool is_v = c >= rows * kChunks;
      const int rc = is_v ? c - rows * kChunks : c, r = rc / kChunks, d0 = (rc % kChunks) * 8;
      int64_t sc_off = 0;
      const int64_t off = kv_offset(p, page, r, hk, &sc_off);
      float f[8];
      load_kv8<KvDtype::f8e4m3>(is_v ? p.v : p.k, is_v ? p.v_scale : p.k_scale, off, sc_off, d0, f);
      *reinterpret_cast<uint4*>((is_v ? dst_v : dst_k) + int64_t(r) * D + d0) = pack8(f);
    }
  }
  pdl_launch_dependents();
}

// The most staging bytes a launch may use: KILN_ATTN_FP8_STAGING_MB (MiB, read once; default 256, about
// 64k context tokens of the Qwen3-4B shape); 0 turns staging off (v4 widens fp8 rows in its producer).
size_t staging_cap() {
  static const size_t cap = [] {
    const char* v = std::getenv("KILN_ATTN_FP8_STAGING_MB");
    return size_t(v && *v ? std::strtoull(v, nullptr, 10) : 256) << 20;
  }();
  return cap;
}

size_t table_bytes(const PagedAttnParams& p) {
  return (size_t(p.B) * size_t(p.pages_stride) * 4 + 255) / 256 * 256;
}
size_t pages_bytes(const PagedAttnParams& p) {
  return 2 * size_t(p.prefill_pages) * size_t(p.Hkv) * size_t(p.page_size) * size_t(p.D) * 2;
}

}  // namespace

size_t prefill_fp8_staging_bytes(const PagedAttnParams& p) {
  const bool applies = p.kv_dtype == KvDtype::f8e4m3 && p.prefill_pages > 0 &&
                       prefill_kernel() == PrefillKernel::v4 && prefill_sm90_applies(p) &&
                       p.page_size % 16 == 0 && prefill_sm90::kBN % p.page_size == 0 &&
                       tensor_maps_available();
  if (!applies) return 0;
  const size_t bytes = table_bytes(p) + pages_bytes(p);
  return bytes <= staging_cap() ? bytes : 0;
}

bool launch_prefill_fp8_staged(const PagedAttnParams& p, bool skip_single_rows, void* staging,
                               cudaStream_t stream, bool pdl) {
  if (staging == nullptr || prefill_fp8_staging_bytes(p) == 0) return false;
  auto* table = static_cast<int32_t*>(staging);
  auto* pages = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(staging) + table_bytes(p));
  const LaunchCfg cfg{.grid = dim3(unsigned(p.prefill_pages), unsigned(p.Hkv)),
                      .block = dim3(kStageThreads),
                      .stream = stream,
                      .pdl = pdl};
  if (p.D == 128)
    launch(cfg, stage_fp8_pages<128>, p, skip_single_rows ? 1 : 0, pages, table);
  else
    launch(cfg, stage_fp8_pages<64>, p, skip_single_rows ? 1 : 0, pages, table);
  // The same rows as a bf16 HND cache of prefill_pages pages.
  PagedAttnParams s = p;
  const int64_t slot_elems = int64_t(p.Hkv) * p.page_size * p.D;
  s.k = pages;
  s.v = pages + int64_t(p.prefill_pages) * slot_elems;
  s.s_page = slot_elems;
  s.s_head = int64_t(p.page_size) * p.D;
  s.s_row = p.D;
  s.k_scale = s.v_scale = nullptr;
  s.sc_page = s.sc_row = s.sc_head = 0;
  s.kv_dtype = KvDtype::bf16;
  s.page_table = table;
  s.num_pages = p.prefill_pages;
  s.prefill_pages = 0;
  return launch_prefill_sm90(s, skip_single_rows, stream, pdl);
}

}  // namespace kiln::cuda
