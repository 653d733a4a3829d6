// A step's small host-to-device inputs (token ids, positions, slots, page tables, sampling parameters)
// without a synchronous pageable copy each: their bytes go into one pinned host arena and leave by
// cudaMemcpyAsync on the stream that consumes them. With them a batch-1 serving step of the 4B shape takes
// ~30 µs less host time (its seven input copies and the sampling parameters' copy; H200, 2026-12-03,
// `0546dfd`, docs/PERF.md "Serving").
//
// Use: begin(bound, stream) with an upper bound of the batch's bytes (the sum of footprint() over its
// copies), copy() per input, end(). begin() waits for the previous batch's copies to leave the arena, so no
// byte is overwritten while a copy still reads it (also after a batch that a failed copy left open), and when
// the batch goes to another stream than the previous one it waits for the device first: a pageable cudaMemcpy
// used to order a step's inputs after every earlier launch, and the previous batch's readers ran on the other
// stream. CPU devices copy at once with memcpy.
#pragma once

#include <cstddef>

#include "kiln/tensor.h"

namespace kiln {

class StagedUploads {
 public:
  explicit StagedUploads(Device d) : device_(d) {}
  ~StagedUploads();
  StagedUploads(const StagedUploads&) = delete;
  StagedUploads& operator=(const StagedUploads&) = delete;

  // A copy's room in the arena: its size rounded up to 16 bytes.
  static size_t footprint(size_t bytes) { return (bytes + 15) / 16 * 16; }

  // stream: the cudaStream_t the readers of the batch's destinations run on (nullptr: the legacy stream).
  void begin(size_t bound, void* stream);
  void copy(void* dst, const void* src, size_t bytes);  // dst: memory of this object's device
  void end();

 private:
  Device device_;
  void* arena_ = nullptr;  // pinned host memory (cudaMallocHost)
  size_t capacity_ = 0, used_ = 0, bound_ = 0;
  void* stream_ = nullptr;  // the open (or last) batch's stream
  bool any_batch_ = false;  // a batch was begun before (stream_ is meaningful)
  void* done_ = nullptr;    // cudaEvent_t recorded after the last ended batch's copies
  bool open_ = false;
};

// Pinned host memory (cudaMallocHost; heap memory in a build without CUDA): where asynchronous
// device-to-host copies land. reserve() keeps the contents only while the size fits; the caller makes sure
// no copy into it is still in flight when it grows or is destroyed.
class PinnedHost {
 public:
  PinnedHost() = default;
  ~PinnedHost();
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  void* reserve(size_t bytes);
  void* data() const { return p_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kiln
