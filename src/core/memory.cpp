// Host and device allocation, and byte copies between them.
#include <cstdlib>
#include <cstring>

#include "kiln/tensor.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/cuda_check.h"
#endif

namespace kiln {

Buffer::Buffer(size_t bytes, Device d) : bytes_(bytes), device_(d) {
  void* p = nullptr;
  if (d.is_cpu()) {
    p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    KILN_CHECK(p != nullptr, "host allocation of ", bytes, " bytes failed");
  } else {
#ifdef KILN_HAVE_CUDA
    KILN_CUDA_CHECK(cudaSetDevice(d.index));
    KILN_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
#else
    KILN_FAIL("kiln was built without CUDA: cannot allocate on ", device_name(d));
#endif
  }
  ptr_ = std::unique_ptr<void, Free>(p, Free{d});
}

void Buffer::Free::operator()(void* p) const {
  if (!p) return;
  if (device.is_cpu()) {
    std::free(p);
  } else {
#ifdef KILN_HAVE_CUDA
    cudaFree(p);
#endif
  }
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef KILN_HAVE_CUDA
  KILN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  KILN_FAIL("kiln was built without CUDA: cannot copy to/from a GPU");
#endif
}

bool cuda_available() {
#ifdef KILN_HAVE_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

}  // namespace kiln
