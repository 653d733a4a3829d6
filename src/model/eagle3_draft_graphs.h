// Eagle3Model::DraftGraphs: the CUDA graphs of the EAGLE-3 draft (model/eagle3_model.h prepare_draft_graphs).
// The chain graphs, one per (bucket of sequences, page-table width, pass count): every pass of one row per
// sequence padded to the bucket and its page table re-laid to the width, so a graph's launch shapes (the
// GEMMs' M, the decode attention's split count) are fixed; one replay runs the whole chain. The extend
// graphs: the uniform pass after a verify step (q rows a sequence, one logit row each), one per (bucket,
// width, q), captured again when the draft's top k changed (set_topk). Token trees never take a graph (their
// passes run eagerly). Internal to src/model (eagle3_model.cpp destroys it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/batch.h"
#include "model/eagle3_model.h"

namespace kiln {

class Eagle3Model::DraftGraphs {
 public:
  // buckets, widths: ascending sequence counts and page-table widths, >= 1; max_extend_q: the longest
  // uniform extend pass (rows a sequence) given a graph (below 2: none).
  DraftGraphs(std::vector<int32_t> buckets, std::vector<int32_t> widths, int32_t max_extend_q);
  ~DraftGraphs();
  DraftGraphs(const DraftGraphs&) = delete;
  DraftGraphs& operator=(const DraftGraphs&) = delete;

  // The (bucket, width) a chain runs padded to, or {0, 0} (eager): its R sequences within the largest
  // bucket, every pass's page table within the widest width (forward_chain checked the rest: one row and
  // logit row per sequence).
  std::pair<int32_t, int32_t> shape_for(const std::vector<BatchDesc>& passes) const;
  // The chain through the (bucket, width, pass count) graph: staged padded, replayed, the real rows' tokens
  // copied back. hidden: bf16 [R, H].
  void run(Eagle3Model& m, const std::vector<BatchDesc>& passes, std::pair<int32_t, int32_t> shape,
           std::vector<bf16_t> hidden, std::vector<std::vector<int32_t>>* tokens);
  // The (bucket, width) a uniform extend pass runs padded to, or {0, 0} (eager): every sequence q rows,
  // 2 <= q <= max_extend_q, and one logit row, within the largest bucket and width, no token tree.
  std::pair<int32_t, int32_t> extend_shape_for(const BatchDesc& b) const;
  // The extend pass through the (bucket, width, q) graph: staged padded (padding sequences read feature row
  // 0), replayed, the real logit rows' outputs copied back.
  void run_extend(Eagle3Model& m, const BatchDesc& b, const Tensor& features,
                  const std::vector<int32_t>& rows, std::pair<int32_t, int32_t> shape, Out* out);
  int num_chain() const { return int(graphs_.size()); }
  int num_extend() const { return int(extend_graphs_.size()); }

 private:
  struct Graph {
    void* graph = nullptr;  // cudaGraph_t
    void* exec = nullptr;   // cudaGraphExec_t
    uint64_t generation = 0;
    const void* features = nullptr;  // an extend graph's feature buffer (the target's; it may move)
    int topk = 0;                    // an extend graph's top k (set_topk changes its launches)
  };
  void capture(Eagle3Model& m, Graph& g, int32_t bucket, size_t passes);
  // Captures `launch` on the stream after running it once eagerly (GEMM plans made, scratch sized, so the
  // captured launches allocate nothing).
  void capture(Eagle3Model& m, Graph& g, const std::function<void()>& launch);

  std::vector<int32_t> buckets_, widths_;
  int32_t max_extend_q_ = 0;
  void* stream_ = nullptr;  // cudaStream_t (blocking: ordered with the legacy stream's synchronous copies)
  std::map<std::tuple<int32_t, int32_t, size_t>, Graph> graphs_;          // (bucket, width, passes)
  std::map<std::tuple<int32_t, int32_t, int32_t>, Graph> extend_graphs_;  // (bucket, width, q)
  std::vector<BatchDesc> staged_;  // the padded passes, reused across chains (an extend pass: staged_[0])
  std::vector<int32_t> staged_rows_;
};

}  // namespace kiln
