// Eagle3Model::ChainGraphs: the CUDA graphs of EAGLE-3 chain passes (model/eagle3_model.h
// prepare_chain_graphs), one per bucket of sequences, each pass of one row per sequence padded to its bucket
// and its page table re-laid to one width, so a graph's launch shapes (the GEMMs' M, the decode attention's
// split count) are fixed. Internal to src/model (eagle3_model.cpp destroys it).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "kiln/batch.h"
#include "model/eagle3_model.h"

namespace kiln {

class Eagle3Model::ChainGraphs {
 public:
  // buckets: ascending sequence counts >= 1; pages_stride: the page-table width of every pass.
  ChainGraphs(std::vector<int32_t> buckets, int32_t pages_stride);
  ~ChainGraphs();
  ChainGraphs(const ChainGraphs&) = delete;
  ChainGraphs& operator=(const ChainGraphs&) = delete;

  // The bucket a pass runs padded to, or 0 (eager): one row per sequence, logit rows 0 .. B - 1, B within
  // the largest bucket, a page table within the width.
  int32_t bucket_for(const BatchDesc& b) const;
  // The pass `b` (bucket_for(b) = bucket) through the bucket's graph: staged padded, replayed, the real rows'
  // outputs copied back. hidden: bf16 [B, H].
  void run(Eagle3Model& m, const BatchDesc& b, int32_t bucket, std::vector<bf16_t> hidden, Out* out);
  int size() const { return int(graphs_.size()); }

 private:
  struct Graph {
    void* graph = nullptr;  // cudaGraph_t
    void* exec = nullptr;   // cudaGraphExec_t
    uint64_t generation = 0;
  };
  void capture(Eagle3Model& m, Graph& g, int32_t bucket);

  std::vector<int32_t> buckets_;
  int32_t pages_stride_ = 0;
  void* stream_ = nullptr;  // cudaStream_t (blocking: ordered with the legacy stream's synchronous copies)
  std::map<int32_t, Graph> graphs_;
  BatchDesc staged_;  // reused across passes
};

}  // namespace kiln
