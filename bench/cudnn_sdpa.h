// cuDNN fused SDPA (flash attention forward, bf16) built through cuDNN's C backend API, for the kernel bench
// (bench/cudnn_sdpa_bench.cpp). The operation graph is the one cuDNN's runtime-fusion SDPA engines match:
//   [paged K load] -> S = Q K^T -> S * scale -> [padding mask] -> [causal mask] -> softmax (max, sub, exp,
//   sum, log + add = stats, div) -> P (bf16) V -> O
// Paged K/V (cuDNN >= 9.5: CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR) needs per-sequence lengths,
// so that form also carries the padding mask. The second form is cuDNN's single SDPA operation
// (CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, >= 9.13; paged >= 9.15), which cudnn-frontend prefers where
// it applies; in 9.19 it has no causal mask (that needs >= 9.21), so it serves the decode rows only. Every
// failing cudnnBackend* call becomes an error string naming the call (never an abort): a machine on which
// cuDNN cannot build the graph still runs the bench.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace kiln::bench::cudnn {

using Dims = std::array<int64_t, 4>;

struct SdpaSpec {
  int64_t B = 1, Hq = 1, Hkv = 1, D = 128, s_q = 1, s_kv = 1;
  bool causal = false;  // top-left diagonal: query row i sees keys 0..i
  float scale = 1.0f;
  Dims q_stride{}, o_stride{};  // Q and O: dims [B, Hq, s_q, D]
  Dims kv_stride{};             // contiguous K and V: dims [B, Hkv, s_kv, D]
  // Paged K/V when page_size > 0: K and V containers [num_pages, Hkv, page_size, D] (packed, HND pages), a
  // page table [B, 1, s_kv / page_size, 1] each, and int32 lengths [B, 1, 1, 1] for queries and keys.
  int64_t page_size = 0, num_pages = 0;
  // Softmax stats (max + log sum exp, fp32 [B, Hq, s_q, 1]) as a real output (the training graph) instead
  // of a virtual tensor (inference): a second form to try when no engine takes the first.
  bool stats_output = false;
  bool single_op = false;  // the SDPA_FWD operation instead of the graph (no causal mask)
};

// Device pointers of one input set; the paged ones only when SdpaSpec::page_size > 0.
struct SdpaBuffers {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *stats = nullptr;
  void *seq_q = nullptr, *seq_kv = nullptr, *table_k = nullptr, *table_v = nullptr;
};

// Owns one cudnnBackendDescriptor_t.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type);  // throws (caught inside SdpaPlan) when creation fails
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc();
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A finalized execution plan for one SdpaSpec, or the reason there is none.
class SdpaPlan {
 public:
  // Builds the graph, asks the heuristics (mode A, then the fallback list) and keeps the first engine
  // config whose plan finalizes.
  static SdpaPlan build(cudnnHandle_t handle, const SdpaSpec& spec);
  bool ok() const { return plan_ != nullptr; }
  const std::string& error() const { return error_; }
  const std::string& engine() const { return engine_; }  // "engine 8 (heuristic A, config 1 of 3)"
  const std::string& json() const { return json_; }      // the plan's engine and knobs (cuDNN's JSON), or ""
  int64_t workspace_bytes() const { return workspace_; }
  // A variant pack binding one input set and the workspace (>= workspace_bytes()); an empty Desc and
  // `error` set when cuDNN refuses it.
  Desc pack(const SdpaBuffers& b, void* workspace, std::string& error) const;
  cudnnStatus_t execute(cudnnHandle_t handle, const Desc& pack) const;

 private:
  SdpaSpec spec_;
  std::deque<Desc> keep_;  // tensors, ops and the graph the plan was built from (a deque: stable addresses)
  std::unique_ptr<Desc> plan_;
  std::string error_, engine_, json_;
  int64_t workspace_ = 0;
  // The by-value scalars (scale, -inf) the variant packs point at: on the heap, so moving the plan keeps
  // their address.
  std::unique_ptr<std::array<float, 2>> scalars_;
};

// "CUDNN_STATUS_NOT_SUPPORTED (...cudnnGetLastErrorString...)".
std::string status_text(cudnnStatus_t st);

}  // namespace kiln::bench::cudnn
