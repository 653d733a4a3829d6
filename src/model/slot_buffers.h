// Grow-only device buffers addressed by slot: a model's per-step activations and uploaded batch inputs.
// A slot's buffer is reallocated (at least doubling) only when a step needs more than it holds, so
// steady-state steps allocate nothing; every reallocation bumps `generation`, which tells a captured CUDA
// graph that an address it recorded is gone. Used by Qwen3Model's and Eagle3Model's workspaces, each with its
// own slot enum.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/staged_upload.h"
#include "kiln/tensor.h"

namespace kiln {

struct SlotBuffers {
  SlotBuffers(Device d, size_t num_slots) : device(d), bufs(num_slots), staged(d) {}

  // The slot's buffer, grown to at least `bytes` (256 at the least).
  void* get(size_t slot, size_t bytes) {
    Buffer& b = bufs[slot];
    if (b.bytes() < bytes || !b.data()) {
      b = Buffer(std::max<size_t>({bytes, 2 * b.bytes(), 256}), device);
      ++generation;
    }
    return b.data();
  }
  // A step's input into its slot by an asynchronous copy (between staged.begin and staged.end).
  template <typename T>
  void* stage_input(size_t slot, const std::vector<T>& v) {
    void* p = get(slot, v.size() * sizeof(T));
    staged.copy(p, v.data(), v.size() * sizeof(T));
    return p;
  }

  Device device;
  std::vector<Buffer> bufs;
  StagedUploads staged;     // the inputs leave by one pinned batch, not a synchronous copy each
  uint64_t generation = 0;  // bumped on every reallocation: a captured CUDA graph is then stale
};

}  // namespace kiln
