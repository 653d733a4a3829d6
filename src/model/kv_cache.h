// KvCache: the paged K/V storage of every layer, owned here; the ops see one layer at a time through
// ops::KvCacheView. Pages are handed out by the runtime's KvPool, which never touches these bytes.
// Storage is zero-filled at construction, so a page that was never written (e.g. the runtime's null
// page used by padded rows) reads as finite values.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/config.h"
#include "kiln/tensor.h"
#include "ops/kv_cache.h"

namespace kiln {

class KvCache {
 public:
  // dtype: bf16 | f16 | f8e4m3 (f8e4m3 needs head_dim % 64 == 0; it adds one UE8M0 scale byte per 64
  // elements). Layout per layer: NHD [num_pages, page_size, Hkv, D] or HND [num_pages, Hkv, page_size, D].
  KvCache(const ModelConfig& cfg, int num_pages, int page_size, ops::KvLayout layout, DType dtype,
          Device device);
  ~KvCache();
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;

  ops::KvCacheView layer(int i) const;
  int num_layers() const { return int(layers_.size()); }
  int num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }
  int64_t num_slots() const { return int64_t(num_pages_) * page_size_; }
  DType dtype() const { return dtype_; }
  ops::KvLayout layout() const { return layout_; }
  Device device() const { return device_; }
  int64_t bytes() const;

  // K and V bytes of one token over all layers (scales included).
  static int64_t bytes_per_token(const ModelConfig& cfg, DType dtype);

  // Slot moves (speculative decoding: a token tree's kept path moves from its nodes' slots to the slots of
  // its positions). For each i, slot from[i]'s K and V (fp8: and their UE8M0 scales) in every layer are
  // copied to slot to[i], as if every slot were read before any is written: a destination that is also a
  // source receives the value its source held before the call (chains and cycles of moves work), a slot
  // that is no destination keeps its value (also when it is a source), from[i] == to[i] changes nothing,
  // and one source may feed several destinations. Errors (kiln::Error, nothing changed): sizes differ; a
  // slot outside [0, num_slots()) (the message names from[i] or to[i]); a slot that is the destination of
  // two moves (which value it would get is undefined). CPU: copied at once. CUDA: two kernel launches on
  // ops::current_stream() after one staged upload of the indices (ops/cuda/kv_move.h); the caller's vectors
  // may change once this returns. Not for use inside CUDA graph capture.
  void move_slots(const std::vector<int64_t>& from, const std::vector<int64_t>& to);
  // move_slots' checks alone, against a cache of num_slots slots (the runners check once for several caches
  // of one page grid before moving any).
  static void check_slot_moves(const std::vector<int64_t>& from, const std::vector<int64_t>& to,
                               int64_t num_slots);

 private:
  struct MoveWork;  // CUDA: the layer table, index and scratch buffers of move_slots (made at first use)
  struct Layer {
    Buffer k, v, k_scale, v_scale;
  };
  Tensor shaped(const Buffer& b, DType t, int64_t last) const;

  std::vector<Layer> layers_;
  int num_pages_ = 0, page_size_ = 0;
  int64_t kv_heads_ = 0, head_dim_ = 0;
  ops::KvLayout layout_;
  DType dtype_;
  Device device_;
  std::unique_ptr<MoveWork> move_;
};

}  // namespace kiln
