// KvCache: the paged K/V storage of every layer, owned here; the ops see one layer at a time through
// ops::KvCacheView. Pages are handed out by the runtime's KvPool, which never touches these bytes.
// Storage is zero-filled at construction, so a page that was never written (e.g. the runtime's null
// page used by padded rows) reads as finite values.
#pragma once

#include <cstdint>
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

  ops::KvCacheView layer(int i) const;
  int num_layers() const { return int(layers_.size()); }
  int num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }
  DType dtype() const { return dtype_; }
  ops::KvLayout layout() const { return layout_; }
  Device device() const { return device_; }
  int64_t bytes() const;

  // K and V bytes of one token over all layers (scales included).
  static int64_t bytes_per_token(const ModelConfig& cfg, DType dtype);

 private:
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
};

}  // namespace kiln
