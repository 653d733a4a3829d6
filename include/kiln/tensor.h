// Tensor: a non-owning view (pointer, dtype, shape, strides in elements, device).
// Buffer: owned memory on one device. Ops take views; whoever allocates owns a Buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
};
std::string device_name(Device d);  // "cpu", "cuda:0"
// --device values: "cpu", "cuda", "cuda:N" or "auto" (the first GPU when one is visible, as vLLM and SGLang
// do; else the CPU); anything else is an error. Does not check that a named GPU exists.
Device parse_device(const std::string& s);

inline constexpr int kMaxDims = 5;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  Tensor() = default;
  // Contiguous (row-major) view.
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device d = {});
  static Tensor strided(void* p, DType t, std::initializer_list<int64_t> dims,
                        std::initializer_list<int64_t> strides, Device d = {});

  int64_t size(int i) const { return shape[i < 0 ? i + ndim : i]; }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  bool is_contiguous() const;
  bool empty() const { return numel() == 0; }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // View of rows [begin, end) along dim 0.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same storage, new contiguous shape (requires a contiguous tensor and equal numel).
  Tensor reshape(std::initializer_list<int64_t> dims) const;
  std::string describe() const;  // "bf16[4, 128] cuda:0"
};

// Owned, 256-byte aligned memory. CUDA memory comes from cudaMalloc (never managed memory).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device d);
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  void* data() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Tensor view(DType t, std::initializer_list<int64_t> dims) const;

 private:
  struct Free {
    Device device;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_{nullptr, Free{}};
  size_t bytes_ = 0;
  Device device_{};
};

// Copies between devices (contiguous bytes). Synchronous on the default stream.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
bool cuda_available();  // a CUDA build with at least one GPU visible

}  // namespace kiln
