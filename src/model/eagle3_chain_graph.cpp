// EAGLE-3 chain passes in CUDA graphs (see eagle3_chain_graph.h).
#include "model/eagle3_chain_graph.h"

#include <algorithm>
#include <utility>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "model/cuda_graph.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "ops/cuda/context.h"
#endif

namespace kiln {

int32_t Eagle3Model::ChainGraphs::bucket_for(const BatchDesc& b) const {
  const int32_t B = b.num_seqs();
  if (B == 0 || B > buckets_.back() || b.num_tokens() != B || b.mrope || b.pages_stride > pages_stride_ ||
      b.logit_rows.size() != size_t(B))
    return 0;
  for (int32_t i = 0; i <= B; ++i)
    if (b.cu_q[size_t(i)] != i) return 0;
  for (int32_t r = 0; r < B; ++r)
    if (b.logit_rows[size_t(r)] != r) return 0;
  return *std::lower_bound(buckets_.begin(), buckets_.end(), B);
}

#ifdef KILN_HAVE_CUDA
Eagle3Model::ChainGraphs::ChainGraphs(std::vector<int32_t> buckets, int32_t pages_stride)
    : buckets_(std::move(buckets)), pages_stride_(pages_stride) {
  KILN_CHECK(!buckets_.empty() && pages_stride_ > 0, "EAGLE-3 chain graphs: buckets and a page-table width");
  for (size_t i = 0; i < buckets_.size(); ++i)
    KILN_CHECK(buckets_[i] >= 1 && (i == 0 || buckets_[i] > buckets_[i - 1]),
               "EAGLE-3 chain graph buckets must be ascending and >= 1");
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
}

Eagle3Model::ChainGraphs::~ChainGraphs() {
  for (auto& [bucket, g] : graphs_) {
    if (g.exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g.exec));
    if (g.graph) cudaGraphDestroy(static_cast<cudaGraph_t>(g.graph));
  }
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void Eagle3Model::ChainGraphs::capture(Eagle3Model& m, Graph& g, int32_t bucket) {
  auto* s = static_cast<cudaStream_t>(stream_);
  // Eager once on the stream: GEMM plans made and scratch sized, so the captured launches allocate nothing.
  // The pass's K/V write is idempotent; its residual update is not (run() stages the inputs again).
  m.launch_midlayer(bucket, bucket, 1);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  capture_cuda_graph(
      s, [&] { m.launch_midlayer(bucket, bucket, 1); }, &g.graph, &g.exec);
  g.generation = m.ws_generation();
}

void Eagle3Model::ChainGraphs::run(Eagle3Model& m, const BatchDesc& in, int32_t bucket,
                                   std::vector<bf16_t> hidden, Out* out) {
  const int32_t B = in.num_seqs();
  const int64_t H = m.config().hidden;
  BatchDesc& b = staged_;
  copy_with_table_width(in, bucket, pages_stride_, b);
  for (int32_t i = B; i < bucket; ++i) {  // padding: one key (page 0's first slot), no K/V written
    b.tokens.push_back(0);
    b.positions.push_back(0);
    b.slot_mapping.push_back(-1);
    b.cu_q.push_back(i + 1);
    b.kv_lens.push_back(1);
  }
  b.logit_rows.resize(size_t(bucket));
  for (int32_t r = 0; r < bucket; ++r) b.logit_rows[size_t(r)] = r;
  hidden.resize(size_t(bucket * H), f32_to_bf16(0.0f));
  auto* s = static_cast<cudaStream_t>(stream_);
  {
    cuda::StreamScope scope(s);
    m.stage(b, nullptr, &hidden);
    Graph& g = graphs_[bucket];
    if (!g.exec || g.generation != m.ws_generation()) {
      capture(m, g, bucket);
      // The capture's eager pass updated the residual, which holds the input hidden states, in place: the
      // replay needs them staged again (same sizes, so the same buffers the graph holds).
      m.stage(b, nullptr, &hidden);
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g.exec), s));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  m.read_out(bucket, out);
  out->tokens.resize(size_t(B));
  out->hidden.resize(size_t(B * H));
}
#else
Eagle3Model::ChainGraphs::ChainGraphs(std::vector<int32_t> buckets, int32_t pages_stride)
    : buckets_(std::move(buckets)), pages_stride_(pages_stride) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
Eagle3Model::ChainGraphs::~ChainGraphs() = default;
void Eagle3Model::ChainGraphs::capture(Eagle3Model&, Graph&, int32_t) {}
void Eagle3Model::ChainGraphs::run(Eagle3Model&, const BatchDesc&, int32_t, std::vector<bf16_t>, Out*) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
#endif

void Eagle3Model::prepare_chain_graphs(const std::vector<int32_t>& buckets, int32_t pages_stride) {
  chain_graphs_.reset();
  if (!device_.is_cuda() || buckets.empty()) return;
  chain_graphs_ = std::make_unique<ChainGraphs>(buckets, pages_stride);
}

int Eagle3Model::num_chain_graphs() const {
  return chain_graphs_ ? chain_graphs_->size() : 0;
}

bool Eagle3Model::run_chain_graph(const BatchDesc& b, const std::vector<bf16_t>& hidden, Out* out) {
  if (!chain_graphs_) return false;
  const int32_t bucket = chain_graphs_->bucket_for(b);
  if (bucket == 0) return false;
  chain_graphs_->run(*this, b, bucket, hidden, out);
  return true;
}

}  // namespace kiln
