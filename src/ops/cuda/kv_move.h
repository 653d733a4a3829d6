// Moving paged KV slots between positions (speculative decoding: a token tree's kept path, written at its
// nodes' slots, moves to the slots of the path's positions). Raw device pointers; enqueued on `stream`.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// One layer's storage: K and V rows, and their UE8M0 scale bytes (fp8 caches; null otherwise).
struct KvMoveLayer {
  void* k;
  void* v;
  void* k_scale;
  void* v_scale;
};

// The cache's shape, the same for every layer. Slot s is page s / page_size, row s % page_size; one head's
// row of a slot holds row_bytes of K (as many of V) and scale_bytes of each scale (0: no scales), at
//   NHD: (s * kv_heads + h) * bytes          HND: ((page * kv_heads + h) * page_size + row) * bytes
// with bytes = row_bytes or scale_bytes.
struct KvMoveShape {
  int32_t num_layers = 0, kv_heads = 0, page_size = 0;
  int64_t row_bytes = 0, scale_bytes = 0;
  bool hnd = false;
};

// Scratch bytes one moved slot needs (kv_move_slots' `scratch` holds n of them).
int64_t kv_move_slot_bytes(const KvMoveShape& s);

// For each i < n, slot from[i]'s K, V and scales in every layer are copied to slot to[i], every slot read
// before any is written (so a destination may also be a source). Two launches on `stream`: every source
// row into `scratch` (n * kv_move_slot_bytes, 16-byte aligned), then scratch to the destinations. No
// allocation, no host synchronisation. layers: device [num_layers], every buffer 16-byte aligned; from, to:
// device i64 [n], valid slots (the caller checks them, and that no slot is the destination of two moves).
void kv_move_slots(const KvMoveLayer* layers, const KvMoveShape& s, const int64_t* from, const int64_t* to,
                   int64_t n, void* scratch, cudaStream_t stream);

}  // namespace kiln::cuda
