// One layer's paged KV cache as seen by the ops: views only, the runtime's KV pool owns the memory.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::ops {

enum class KvLayout : uint8_t {
  nhd,  // [num_pages, page_size, num_kv_heads, head_dim]: one token's heads are adjacent
  hnd,  // [num_pages, num_kv_heads, page_size, head_dim]: one head's tokens of a page are adjacent
};

// Slot s of the cache is page s / page_size, row s % page_size. k and v have the same shape, dtype and
// strides (in elements; the last dim has stride 1, other strides are free so K and V may interleave).
// dtype: bf16 | f16 | f8e4m3. For f8e4m3, k_scale / v_scale are u8 UE8M0 bytes, one per 64 contiguous
// elements of head_dim, shaped like k / v with head_dim / 64 as the last dim (same layout, last stride 1);
// head_dim must then be a multiple of 64. For bf16 / f16 the scales are empty.
struct KvCacheView {
  Tensor k, v;
  Tensor k_scale, v_scale;
  KvLayout layout = KvLayout::hnd;
  int page_size = 0;
  int64_t num_pages() const { return k.ndim == 4 ? k.shape[0] : 0; }
  int64_t num_slots() const { return num_pages() * page_size; }
};

}  // namespace kiln::ops
