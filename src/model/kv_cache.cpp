#include "model/kv_cache.h"

#include <cstring>

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln {
namespace {

void zero_fill(const Buffer& b) {
  if (b.bytes() == 0) return;
  if (b.device().is_cpu()) {
    std::memset(b.data(), 0, b.bytes());
    return;
  }
#ifdef KILN_HAVE_CUDA
  KILN_CHECK(cudaSetDevice(b.device().index) == cudaSuccess, "cannot select ", device_name(b.device()));
  const cudaError_t e = cudaMemset(b.data(), 0, b.bytes());
  KILN_CHECK(e == cudaSuccess, "zeroing the KV cache failed: ", cudaGetErrorString(e));
#else
  KILN_FAIL("kiln was built without CUDA: no device memory to zero");
#endif
}

}  // namespace

KvCache::KvCache(const ModelConfig& cfg, int num_pages, int page_size, ops::KvLayout layout, DType dtype,
                 Device device)
    : num_pages_(num_pages),
      page_size_(page_size),
      kv_heads_(cfg.num_kv_heads),
      head_dim_(cfg.head_dim),
      layout_(layout),
      dtype_(dtype),
      device_(device) {
  KILN_CHECK(num_pages > 0 && page_size > 0, "KV cache needs positive num_pages and page_size, got ",
             num_pages, " and ", page_size);
  KILN_CHECK(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f8e4m3,
             "KV cache dtype must be bf16, f16 or f8e4m3, got ", dtype_name(dtype));
  KILN_CHECK(dtype != DType::f8e4m3 || head_dim_ % 64 == 0, "an fp8 KV cache needs head_dim % 64 == 0, got ",
             head_dim_);
  KILN_CHECK(cfg.num_layers > 0 && kv_heads_ > 0 && head_dim_ > 0, "KV cache: bad model config");
  const size_t elems = size_t(num_pages) * size_t(page_size) * size_t(kv_heads_) * size_t(head_dim_);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    Layer L{Buffer(elems * size_t(dtype_size(dtype)), device),
            Buffer(elems * size_t(dtype_size(dtype)), device), Buffer(), Buffer()};
    if (dtype == DType::f8e4m3) {
      L.k_scale = Buffer(elems / 64, device);
      L.v_scale = Buffer(elems / 64, device);
    }
    for (const Buffer* b : {&L.k, &L.v, &L.k_scale, &L.v_scale}) zero_fill(*b);
    layers_.push_back(std::move(L));
  }
}

Tensor KvCache::shaped(const Buffer& b, DType t, int64_t last) const {
  return layout_ == ops::KvLayout::nhd ? b.view(t, {num_pages_, page_size_, kv_heads_, last})
                                       : b.view(t, {num_pages_, kv_heads_, page_size_, last});
}

ops::KvCacheView KvCache::layer(int i) const {
  KILN_CHECK(i >= 0 && i < num_layers(), "KV cache layer ", i, " out of range [0, ", num_layers(), ")");
  const Layer& L = layers_[size_t(i)];
  ops::KvCacheView v;
  v.k = shaped(L.k, dtype_, head_dim_);
  v.v = shaped(L.v, dtype_, head_dim_);
  if (dtype_ == DType::f8e4m3) {
    v.k_scale = shaped(L.k_scale, DType::u8, head_dim_ / 64);
    v.v_scale = shaped(L.v_scale, DType::u8, head_dim_ / 64);
  }
  v.layout = layout_;
  v.page_size = page_size_;
  return v;
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const Layer& L : layers_)
    n += int64_t(L.k.bytes() + L.v.bytes() + L.k_scale.bytes() + L.v_scale.bytes());
  return n;
}

int64_t KvCache::bytes_per_token(const ModelConfig& cfg, DType dtype) {
  const int64_t elems = cfg.num_kv_heads * cfg.head_dim;
  const int64_t per = elems * dtype_size(dtype) + (dtype == DType::f8e4m3 ? elems / 64 : 0);
  return 2 * per * cfg.num_layers;
}

}  // namespace kiln
