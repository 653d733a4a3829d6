// KV slot moves (kv_move.h): a gather of every source row into scratch, then a scatter to the destinations.
// Two launches on one stream give "every slot read before any is written" without a grid-wide barrier.
#include "ops/cuda/common.cuh"
#include "ops/cuda/kv_move.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

struct KvMoveParams {
  const KvMoveLayer* layers;  // [num_layers]
  const int64_t* slots;       // [n]: the sources (gather) or the destinations (scatter)
  uint8_t* scratch;           // [n, num_layers, layer_stride] bytes: K rows, V rows, K scales, V scales
  int64_t layer_stride;       // bytes of one slot's layer in scratch (16-byte multiple)
  int32_t kv_heads, page_size;
  int64_t row_bytes, scale_bytes;
  bool hnd;
};

__device__ __forceinline__ int64_t row_offset(const KvMoveParams& p, int64_t slot, int64_t h, int64_t bytes) {
  if (!p.hnd) return (slot * p.kv_heads + h) * bytes;
  return ((slot / p.page_size * p.kv_heads + h) * p.page_size + slot % p.page_size) * bytes;
}

// Grid (n, num_layers): block (m, l) copies slot slots[m]'s rows of layer l between the cache and scratch
// row (m, l). Its 128 threads stride over the K then V head rows in units of Vec (uint4: 16 bytes where
// row_bytes allows, else single bytes), then over the K then V scale bytes. Each block touches only its own
// scratch row and its own slot's bytes, so blocks are independent.
template <bool kGather, typename Vec>
__global__ void __launch_bounds__(kThreads) kv_move_kernel(const __grid_constant__ KvMoveParams p) {
  const int64_t m = blockIdx.x, l = blockIdx.y;
  const KvMoveLayer L = p.layers[l];
  const int64_t slot = p.slots[m];
  uint8_t* row = p.scratch + (m * gridDim.y + l) * p.layer_stride;
  const int64_t per_head = p.row_bytes / int64_t(sizeof(Vec)), kv_units = p.kv_heads * per_head;
  for (int64_t i = threadIdx.x; i < 2 * kv_units; i += kThreads) {
    const int64_t which = i / kv_units, j = i % kv_units, h = j / per_head, c = j % per_head;
    uint8_t* base = static_cast<uint8_t*>(which == 0 ? L.k : L.v);
    Vec* cache = reinterpret_cast<Vec*>(base + row_offset(p, slot, h, p.row_bytes)) + c;
    Vec* scratch = reinterpret_cast<Vec*>(row) + i;
    if constexpr (kGather) {
      *scratch = *cache;
    } else {
      *cache = *scratch;
    }
  }
  if (p.scale_bytes == 0) return;
  const int64_t sc_units = p.kv_heads * p.scale_bytes;
  uint8_t* scales = row + 2 * kv_units * int64_t(sizeof(Vec));
  for (int64_t i = threadIdx.x; i < 2 * sc_units; i += kThreads) {
    const int64_t which = i / sc_units, j = i % sc_units, h = j / p.scale_bytes, c = j % p.scale_bytes;
    uint8_t* base = static_cast<uint8_t*>(which == 0 ? L.k_scale : L.v_scale);
    uint8_t* cache = base + row_offset(p, slot, h, p.scale_bytes) + c;
    if constexpr (kGather) {
      scales[i] = *cache;
    } else {
      *cache = scales[i];
    }
  }
}

int64_t layer_stride(const KvMoveShape& s) {
  return (2 * s.kv_heads * (s.row_bytes + s.scale_bytes) + 15) / 16 * 16;
}

template <typename Vec>
void launch_pair(const KvMoveParams& gather, const KvMoveParams& scatter, int64_t n, int32_t layers,
                 cudaStream_t stream) {
  const LaunchCfg cfg{.grid = dim3(unsigned(n), unsigned(layers)), .block = dim3(kThreads), .stream = stream};
  launch(cfg, kv_move_kernel<true, Vec>, gather);
  launch(cfg, kv_move_kernel<false, Vec>, scatter);
}

}  // namespace

int64_t kv_move_slot_bytes(const KvMoveShape& s) {
  return int64_t(s.num_layers) * layer_stride(s);
}

void kv_move_slots(const KvMoveLayer* layers, const KvMoveShape& s, const int64_t* from, const int64_t* to,
                   int64_t n, void* scratch, cudaStream_t stream) {
  KILN_CHECK(s.num_layers >= 1 && s.num_layers <= 65535 && s.kv_heads >= 1 && s.page_size >= 1 &&
                 s.row_bytes >= 1 && s.scale_bytes >= 0,
             "kv_move_slots: bad cache shape (", s.num_layers, " layers, ", s.kv_heads,
             " KV heads, page size ", s.page_size, ", row bytes ", s.row_bytes, ", scale bytes ",
             s.scale_bytes, ")");
  KILN_CHECK(n >= 0 && n <= 0x7fffffff, "kv_move_slots: ", n, " moves (at most 2^31 - 1)");
  if (n == 0) return;
  KILN_CHECK(layers && from && to && scratch, "kv_move_slots: null pointer");
  KvMoveParams p{.layers = layers,
                 .slots = from,
                 .scratch = static_cast<uint8_t*>(scratch),
                 .layer_stride = layer_stride(s),
                 .kv_heads = s.kv_heads,
                 .page_size = s.page_size,
                 .row_bytes = s.row_bytes,
                 .scale_bytes = s.scale_bytes,
                 .hnd = s.hnd};
  KvMoveParams q = p;
  q.slots = to;
  // 16-byte units need 16-byte aligned rows: every K/V buffer is (cudaMalloc), so a row size that is a
  // multiple of 16 keeps every row aligned; the scratch rows are 16-byte multiples by construction.
  const bool vec = s.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(scratch) % 16 == 0;
  if (vec) {
    launch_pair<uint4>(p, q, n, s.num_layers, stream);
  } else {
    launch_pair<uint8_t>(p, q, n, s.num_layers, stream);
  }
}

}  // namespace kiln::cuda
