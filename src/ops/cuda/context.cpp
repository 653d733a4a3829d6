// Per-thread stream and per-device scratch / GEMM engine (see context.h).
#include "ops/cuda/context.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::cuda {
namespace {

thread_local cudaStream_t g_stream = nullptr;

struct DeviceState {
  std::vector<void*> retired;  // outgrown scratch buffers: never freed, a captured graph may still use them
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  std::unique_ptr<GemmEngine> gemm;
};

std::mutex g_mu;
std::map<int, DeviceState>& states() {
  static std::map<int, DeviceState> s;  // lives to process exit: device memory is released by the driver
  return s;
}

int current_device() {
  int d = 0;
  const cudaError_t e = cudaGetDevice(&d);
  KILN_CHECK(e == cudaSuccess, "cudaGetDevice: ", cudaGetErrorString(e));
  return d;
}

}  // namespace

namespace {
std::atomic<bool> g_pdl{false};
}  // namespace

void set_pdl(bool on) {
  g_pdl = on;
}
bool pdl_enabled() {
  return g_pdl;
}
bool pdl_for(PdlSite site) {
  static const unsigned mask = [] {
    const char* e = std::getenv("KILN_PDL_SITES");
    if (!e || !*e) return ~0u;
    static constexpr const char* kNames[] = {"elementwise", "gemv", "attention", "lm_head"};
    unsigned m = 0;
    std::string list(e);
    for (size_t a = 0; a <= list.size();) {
      const size_t b = std::min(list.find(',', a), list.size());
      const std::string name = list.substr(a, b - a);
      bool known = false;
      for (unsigned i = 0; i < 4; ++i)
        if (name == kNames[i]) m |= 1u << i, known = true;
      KILN_CHECK(known, "KILN_PDL_SITES: unknown site '", name, "' (elementwise, gemv, attention, lm_head)");
      a = b + 1;
    }
    return m;
  }();
  return g_pdl && (mask >> unsigned(site) & 1u);
}

cudaStream_t current_stream() {
  return g_stream;
}
void set_current_stream(cudaStream_t s) {
  g_stream = s;
}

bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(g_stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

void* scratch(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceState& s = states()[current_device()];
  if (bytes > s.scratch_bytes) {
    KILN_CHECK(!capturing(), "CUDA scratch must grow from ", s.scratch_bytes, " to ", bytes,
               " bytes during graph capture: run the step once eagerly before capturing it");
    if (s.scratch) s.retired.push_back(s.scratch);
    const size_t grown = bytes + bytes / 4;
    const cudaError_t e = cudaMalloc(&s.scratch, grown);
    KILN_CHECK(e == cudaSuccess, "cudaMalloc of ", grown, " scratch bytes: ", cudaGetErrorString(e));
    s.scratch_bytes = grown;
  }
  return s.scratch;
}

GemmEngine& gemm_engine() {
  std::lock_guard<std::mutex> lock(g_mu);
  const int dev = current_device();
  DeviceState& s = states()[dev];
  if (!s.gemm) {
    s.gemm = std::make_unique<GemmEngine>(dev);
    s.gemm->load(default_tactic_cache_path());
  }
  return *s.gemm;
}

}  // namespace kiln::cuda
