#include "model/kv_cache.h"

#include <cstring>
#include <unordered_map>

#include "kiln/error.h"
#include "kiln/staged_upload.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/kv_move.h"
#include "ops/stream.h"
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

struct KvCache::MoveWork {
  explicit MoveWork(Device d) : uploads(d) {}
  Buffer layers;   // device cuda::KvMoveLayer [num_layers]
  Buffer indices;  // device i64 [2, n]: from, then to
  Buffer scratch;  // n * cuda::kv_move_slot_bytes
  StagedUploads uploads;
};

KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

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

void KvCache::check_slot_moves(const std::vector<int64_t>& from, const std::vector<int64_t>& to,
                               int64_t num_slots) {
  KILN_CHECK_EQ(from.size(), to.size(), "KV slot moves: from and to sizes");
  for (size_t i = 0; i < from.size(); ++i) {
    KILN_CHECK(from[i] >= 0 && from[i] < num_slots, "KV slot moves: from[", i, "] = ", from[i],
               " outside the cache's slots [0, ", num_slots, ")");
    KILN_CHECK(to[i] >= 0 && to[i] < num_slots, "KV slot moves: to[", i, "] = ", to[i],
               " outside the cache's slots [0, ", num_slots, ")");
  }
  std::unordered_map<int64_t, size_t> dest;
  for (size_t i = 0; i < to.size(); ++i) {
    const auto [it, fresh] = dest.emplace(to[i], i);
    KILN_CHECK(fresh, "KV slot moves: to[", it->second, "] and to[", i, "] are both slot ", to[i]);
  }
}

void KvCache::move_slots(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  check_slot_moves(from, to, num_slots());
  const int64_t n = int64_t(from.size());
  if (n == 0) return;
  const int64_t esize = dtype_size(dtype_), row = head_dim_ * esize,
                scale = dtype_ == DType::f8e4m3 ? head_dim_ / 64 : 0;
  if (device_.is_cpu()) {
    // Byte offset of head h's row of `slot` in a buffer whose head rows are `bytes` long.
    const auto at = [&](int64_t slot, int64_t h, int64_t bytes) {
      if (layout_ == ops::KvLayout::nhd) return (slot * kv_heads_ + h) * bytes;
      return ((slot / page_size_ * kv_heads_ + h) * page_size_ + slot % page_size_) * bytes;
    };
    std::vector<uint8_t> held;
    for (Layer& L : layers_) {
      for (auto [buf, bytes] :
           {std::pair{&L.k, row}, {&L.v, row}, {&L.k_scale, scale}, {&L.v_scale, scale}}) {
        if (bytes == 0) continue;
        auto* base = static_cast<uint8_t*>(buf->data());
        held.resize(size_t(n * kv_heads_ * bytes));
        for (int64_t i = 0; i < n; ++i)  // every source read first ...
          for (int64_t h = 0; h < kv_heads_; ++h)
            std::memcpy(held.data() + (i * kv_heads_ + h) * bytes, base + at(from[size_t(i)], h, bytes),
                        size_t(bytes));
        for (int64_t i = 0; i < n; ++i)  // ... then every destination written
          for (int64_t h = 0; h < kv_heads_; ++h)
            std::memcpy(base + at(to[size_t(i)], h, bytes), held.data() + (i * kv_heads_ + h) * bytes,
                        size_t(bytes));
      }
    }
    return;
  }
#ifdef KILN_HAVE_CUDA
  if (!move_) {
    move_ = std::make_unique<MoveWork>(device_);
    std::vector<cuda::KvMoveLayer> table;
    for (const Layer& L : layers_)
      table.push_back({L.k.data(), L.v.data(), L.k_scale.data(), L.v_scale.data()});
    move_->layers = Buffer(table.size() * sizeof(table[0]), device_);
    copy_bytes(move_->layers.data(), device_, table.data(), Device::cpu(), table.size() * sizeof(table[0]));
  }
  MoveWork& w = *move_;
  const cuda::KvMoveShape shape{.num_layers = num_layers(),
                                .kv_heads = int32_t(kv_heads_),
                                .page_size = page_size_,
                                .row_bytes = row,
                                .scale_bytes = scale,
                                .hnd = layout_ == ops::KvLayout::hnd};
  const size_t index_bytes = size_t(n) * sizeof(int64_t);
  // Grown buffers: the old one's cudaFree waits for the device, so no earlier move still reads it.
  if (w.indices.bytes() < 2 * index_bytes) w.indices = Buffer(4 * index_bytes, device_);
  const size_t scratch_bytes = size_t(n * cuda::kv_move_slot_bytes(shape));
  if (w.scratch.bytes() < scratch_bytes) w.scratch = Buffer(2 * scratch_bytes, device_);
  void* const stream = ops::current_stream();
  auto* idx = static_cast<int64_t*>(w.indices.data());
  w.uploads.begin(2 * StagedUploads::footprint(index_bytes), stream);
  w.uploads.copy(idx, from.data(), index_bytes);
  w.uploads.copy(idx + n, to.data(), index_bytes);
  w.uploads.end();
  cuda::kv_move_slots(static_cast<const cuda::KvMoveLayer*>(w.layers.data()), shape, idx, idx + n, n,
                      w.scratch.data(), static_cast<cudaStream_t>(stream));
#else
  KILN_FAIL("kiln was built without CUDA: no device KV cache to move");
#endif
}

int64_t KvCache::bytes_per_token(const ModelConfig& cfg, DType dtype) {
  const int64_t elems = cfg.num_kv_heads * cfg.head_dim;
  const int64_t per = elems * dtype_size(dtype) + (dtype == DType::f8e4m3 ? elems / 64 : 0);
  return 2 * per * cfg.num_layers;
}

}  // namespace kiln
