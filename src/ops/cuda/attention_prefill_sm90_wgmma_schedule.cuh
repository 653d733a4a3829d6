// Prefill v4's work schedule (see the mapping comment of attention_prefill_sm90_wgmma_kernel.cuh): work
// items, their lookup from cu_q, and the persistent blocks' static zigzag over them. Included by the producer
// and consumer code; every warp computes it alone.
#pragma once

#include "ops/cuda/attention_prefill_sm90_wgmma.cuh"

namespace kiln::cuda {
namespace prefill_sm90 {

struct Work {
  int b = 0, tile = 0, q0 = 0, q_len = 0, kv_len = 0;
};

// Work item x -> (sequence, row tile); false when x is past the last item. Every warp computes it alone
// (warp-uniform result, no shared memory): a prefix sum of ceil(q_len G / 128) over 32 sequences at a time.
__device__ __forceinline__ bool find_work(const PagedAttnParams& p, bool skip_single, int G, int x, Work& w) {
  const int lane = int(threadIdx.x % 32);
  int base = 0;
  for (int b0 = 0; b0 < p.B; b0 += 32) {
    const int b = b0 + lane;
    int n = 0, q0 = 0, q_len = 0, kv_len = 0;
    if (b < p.B) {
      q0 = p.cu_q[b];
      q_len = p.cu_q[b + 1] - q0;
      kv_len = p.kv_lens[b];
      // A kv_len below q_len or beyond the page table's reach violates the contract: skipped, never read.
      const bool ok = q_len > 0 && !(skip_single && q_len == 1) && kv_len >= q_len &&
                      kv_len <= int64_t(p.pages_stride) * p.page_size;
      n = ok ? (q_len * G + kBM - 1) / kBM : 0;
    }
    const int incl = warp_inclusive_sum(n);
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (x < base + total) {
      const int L = __ffs(__ballot_sync(0xffffffffu, x < base + incl)) - 1;
      const int nL = __shfl_sync(0xffffffffu, n, L);
      const int excl = __shfl_sync(0xffffffffu, incl, L) - nL;
      w.b = b0 + L;
      w.q0 = __shfl_sync(0xffffffffu, q0, L);
      w.q_len = __shfl_sync(0xffffffffu, q_len, L);
      w.kv_len = __shfl_sync(0xffffffffu, kv_len, L);
      w.tile = nL - 1 - (x - base - excl);
      return true;
    }
    base += total;
  }
  return false;
}

// One work item of the block: the KV head, the (sequence, row tile) and its key tiles.
struct Item {
  int hk = 0, n_tiles = 0;
  Work w;
};

// The block's item k, false past the last. Static persistent schedule: block b of P takes the linear work
// index k P + b in even rounds k and k P + P - 1 - b in odd ones (a zigzag); KV head index % Hkv, item
// index / Hkv. Items run longest first within a sequence, so each block pairs a long item with a short one
// and the blocks' totals even out. The indices grow with k, so the first one past the last item ends the
// block. Every warp computes it alone (warp-uniform).
__device__ __forceinline__ bool block_item(const PrefillSm90Params& prm, int k, Item& it) {
  const PagedAttnParams& p = prm.p;
  const int P = int(gridDim.x), b = int(blockIdx.x), x = k * P + ((k & 1) ? P - 1 - b : b);
  it.hk = x % p.Hkv;
  if (!find_work(p, prm.skip_single != 0, prm.G, x / p.Hkv, it.w)) return false;
  const int rows = it.w.q_len * prm.G, f_end = min((it.w.tile + 1) * kBM, rows);
  it.n_tiles = (it.w.kv_len - it.w.q_len + (f_end - 1) / prm.G) / kBN + 1;
  return true;
}

}  // namespace prefill_sm90
}  // namespace kiln::cuda
