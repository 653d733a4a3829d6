// Per-thread CUDA stream and per-device resources for the Tensor-level op wrappers (ops_cuda.h), whose
// signatures (ops/*.h) carry no stream or workspace:
//   current_stream(): the stream ops enqueue on in this thread (default: the legacy stream, nullptr). The
//     model sets it around a forward pass, a graph runner around capture (StreamScope).
//   scratch(bytes):   a grow-only device buffer per device (attention split-KV partials, LM-head row
//     gathers). It may grow only outside graph capture: run a step eagerly before capturing it.
//   gemm_engine():    the cuBLASLt engine of the current device; on creation it loads the tactic cache
//     (default_tactic_cache_path()) when one exists for this GPU and library versions.
// Usage contract: scratch memory is valid until the next op on the same stream that asks for scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/gemm.h"

namespace kiln::cuda {

cudaStream_t current_stream();
void set_current_stream(cudaStream_t s);

class StreamScope {
 public:
  explicit StreamScope(cudaStream_t s) : prev_(current_stream()) { set_current_stream(s); }
  ~StreamScope() { set_current_stream(prev_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t prev_;
};

void* scratch(size_t bytes);
GemmEngine& gemm_engine();

// Programmatic dependent launch for the op wrappers' own kernels (process-wide switch, default off;
// every kiln kernel waits for its predecessor's writes before reading, so either setting is correct).
void set_pdl(bool on);
bool pdl_enabled();
// The op families whose kernels may use PDL while pdl_enabled(): all of them by default, else those named
// in KILN_PDL_SITES (a comma list of elementwise, gemv, attention, lm_head; read once), for A/B runs
// (H200, 2026-12-02, `af20cce`: bench/results/h200_pdl_decode_step_2026-12-02.txt). elementwise covers the
// norms, SiLU, the embedding gather and the fused attn_prep kernels; gemv every small-M projection kiln runs
// itself (cuBLASLt's kernels never use PDL).
enum class PdlSite : uint8_t { elementwise, gemv, attention, lm_head };
bool pdl_for(PdlSite site);

// True while the current stream is capturing a graph.
bool capturing();

}  // namespace kiln::cuda
