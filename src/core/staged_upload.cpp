// StagedUploads (kiln/staged_upload.h): a pinned arena, asynchronous copies, one event a batch.
#include "kiln/staged_upload.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/cuda_check.h"
#endif

namespace kiln {

StagedUploads::~StagedUploads() {
#ifdef KILN_HAVE_CUDA
  if (done_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(done_));  // no copy may still read the arena
    cudaEventDestroy(static_cast<cudaEvent_t>(done_));
  }
  if (open_) cudaDeviceSynchronize();  // a batch a failed copy left open has no event
  if (arena_) cudaFreeHost(arena_);
#endif
}

void StagedUploads::begin(size_t bound, void* stream) {
  if (device_.is_cpu()) {
    open_ = true;
    used_ = 0;
    bound_ = bound;
    return;
  }
#ifdef KILN_HAVE_CUDA
  if (open_ || (any_batch_ && stream != stream_)) {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (done_) {
    KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(done_)));
  }
  open_ = false;
  if (bound > capacity_) {
    const size_t want = std::max<size_t>(bound, 2 * capacity_ + 4096);
    if (arena_) KILN_CUDA_CHECK(cudaFreeHost(arena_));
    arena_ = nullptr;
    capacity_ = 0;
    KILN_CUDA_CHECK(cudaMallocHost(&arena_, want));
    capacity_ = want;
  }
  open_ = any_batch_ = true;
  stream_ = stream;
  used_ = 0;
  bound_ = bound;
#else
  (void)bound;
  (void)stream;
  KILN_FAIL("kiln was built without CUDA: cannot stage uploads to ", device_name(device_));
#endif
}

void StagedUploads::copy(void* dst, const void* src, size_t bytes) {
  KILN_CHECK(open_, "StagedUploads::copy outside begin() / end()");
  if (bytes == 0) return;
  KILN_CHECK(used_ + footprint(bytes) <= bound_, "StagedUploads: ", used_ + footprint(bytes),
             " bytes staged past the batch's bound of ", bound_);
  if (device_.is_cpu()) {
    std::memcpy(dst, src, bytes);
    used_ += footprint(bytes);
    return;
  }
#ifdef KILN_HAVE_CUDA
  char* host = static_cast<char*>(arena_) + used_;
  std::memcpy(host, src, bytes);
  KILN_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)));
  used_ += footprint(bytes);
#endif
}

void StagedUploads::end() {
  KILN_CHECK(open_, "StagedUploads::end without begin()");
  if (device_.is_cpu()) {
    open_ = false;
    return;
  }
#ifdef KILN_HAVE_CUDA
  if (!done_) {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done_ = e;
  }
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done_), static_cast<cudaStream_t>(stream_)));
  open_ = false;
#endif
}

PinnedHost::~PinnedHost() {
#ifdef KILN_HAVE_CUDA
  if (p_) cudaFreeHost(p_);
#else
  std::free(p_);
#endif
}

void* PinnedHost::reserve(size_t bytes) {
  if (bytes <= bytes_ && p_) return p_;
  const size_t want = std::max<size_t>(bytes, 2 * bytes_);
#ifdef KILN_HAVE_CUDA
  if (p_) KILN_CUDA_CHECK(cudaFreeHost(p_));
  p_ = nullptr;
  bytes_ = 0;
  KILN_CUDA_CHECK(cudaMallocHost(&p_, want ? want : 1));
#else
  std::free(p_);
  p_ = std::malloc(want ? want : 1);
  KILN_CHECK(p_ != nullptr, "host allocation of ", want, " bytes failed");
#endif
  bytes_ = want;
  return p_;
}

}  // namespace kiln
