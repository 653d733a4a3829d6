// Per-device facts the kernel dispatchers ask for on every launch (is this an sm_90 device that runs the
// build's sm_90a code?), computed once per device and cached.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace kiln::cuda {

// Whether the current device has compute capability 9.0 (H100, H200).
inline bool current_device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  return ok && major == 9 && minor == 0;
}

// The binary version (e.g. 90) of the code the driver chose for `kernel` on the current device; 0 on error.
inline int kernel_binary_version(const void* kernel) {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return a.binaryVersion;
}

// A yes/no fact about the current device, probe() evaluated once per device (up to 64) and cached.
class PerDeviceFlag {
 public:
  template <typename Probe>
  bool get(Probe&& probe) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
      (void)cudaGetLastError();
      return false;
    }
    int8_t k = known_[dev].load(std::memory_order_relaxed);
    if (k == 0) {
      k = probe() ? 1 : 2;
      known_[dev].store(k, std::memory_order_relaxed);
    }
    return k == 1;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int8_t> known_[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
};

}  // namespace kiln::cuda
