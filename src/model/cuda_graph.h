// CudaDecodeGraph: single-sequence decode steps of a Qwen3Model replayed from one CUDA graph.
//
// Each step stages the batch metadata (token, position, slot, kv_len, page table) into the model's
// workspace with ordinary copies, then replays a graph of every launch of the step (all layers and the
// LM head). The graph holds only device pointers to those staged buffers, so new inputs need no
// recapture: it is correct when inputs change between replays (tests/cuda/test_cuda_graph.cpp checks
// replay == eager bit for bit). It is recaptured when a workspace buffer was reallocated (a larger
// prefill ran in between). The page table is padded to a fixed width, so one graph serves every
// context up to pages_stride * page_size tokens, and the decode attention's split count stays fixed.
#pragma once

#include <cstdint>

#include "kiln/batch.h"
#include "kiln/tensor.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"

namespace kiln {

class CudaDecodeGraph {
 public:
  // model and cache on one CUDA device; pages_stride: the page-table width of every step.
  CudaDecodeGraph(Qwen3Model& model, KvCache& cache, int32_t pages_stride);
  ~CudaDecodeGraph();
  CudaDecodeGraph(const CudaDecodeGraph&) = delete;
  CudaDecodeGraph& operator=(const CudaDecodeGraph&) = delete;

  // One decode step: b has one sequence with one new token and logit_rows == {0}; b.pages_stride may be
  // smaller than the graph's (the table is padded). Returns f32 [1, vocab] logits on the device, valid
  // until the next step. Synchronous with the host only through the staging copies.
  Tensor step(const BatchDesc& b);
  int captures() const { return captures_; }
  void* stream() const { return stream_; }

 private:
  void capture();

  Qwen3Model& model_;
  KvCache& cache_;
  int32_t pages_stride_;
  Buffer logits_buf_;
  Tensor logits_;
  void* stream_ = nullptr;  // cudaStream_t (blocking: ordered with the staging copies)
  void* graph_ = nullptr;   // cudaGraph_t
  void* exec_ = nullptr;    // cudaGraphExec_t
  uint64_t generation_ = 0;
  int captures_ = 0;
};

}  // namespace kiln
