// EAGLE-3 chains in CUDA graphs (see eagle3_draft_graphs.h).
#include "model/eagle3_draft_graphs.h"

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

std::pair<int32_t, int32_t> Eagle3Model::DraftGraphs::shape_for(const std::vector<BatchDesc>& passes) const {
  const int32_t R = passes.empty() ? 0 : passes[0].num_seqs();
  if (R == 0 || R > buckets_.back()) return {0, 0};
  int32_t stride = 0;
  for (const BatchDesc& b : passes) {
    if (b.mrope) return {0, 0};
    stride = std::max(stride, b.pages_stride);
  }
  if (stride > widths_.back()) return {0, 0};
  return {*std::lower_bound(buckets_.begin(), buckets_.end(), R),
          *std::lower_bound(widths_.begin(), widths_.end(), stride)};
}

#ifdef KILN_HAVE_CUDA
Eagle3Model::DraftGraphs::DraftGraphs(std::vector<int32_t> buckets, std::vector<int32_t> widths,
                                      int32_t max_extend_q)
    : buckets_(std::move(buckets)), widths_(std::move(widths)), max_extend_q_(max_extend_q) {
  KILN_CHECK(!buckets_.empty() && !widths_.empty(), "EAGLE-3 draft graphs: buckets and page-table widths");
  for (const std::vector<int32_t>* v : {&buckets_, &widths_})
    for (size_t i = 0; i < v->size(); ++i)
      KILN_CHECK((*v)[i] >= 1 && (i == 0 || (*v)[i] > (*v)[i - 1]),
                 "EAGLE-3 draft graph buckets and widths must be ascending and >= 1");
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
}

Eagle3Model::DraftGraphs::~DraftGraphs() {
  const auto destroy = [](Graph& g) {
    if (g.exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g.exec));
    if (g.graph) cudaGraphDestroy(static_cast<cudaGraph_t>(g.graph));
  };
  for (auto& [key, g] : graphs_) destroy(g);
  for (auto& [key, g] : extend_graphs_) destroy(g);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void Eagle3Model::DraftGraphs::capture(Eagle3Model& m, Graph& g, const std::function<void()>& launch) {
  auto* s = static_cast<cudaStream_t>(stream_);
  launch();
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  capture_cuda_graph(s, launch, &g.graph, &g.exec);
  g.generation = m.ws_generation();
}

void Eagle3Model::DraftGraphs::capture(Eagle3Model& m, Graph& g, int32_t bucket, size_t passes) {
  // The passes' K/V writes are idempotent; their residual updates are not (run() stages the inputs again).
  capture(m, g, [&] { m.launch_chain(bucket, passes); });
}

std::pair<int32_t, int32_t> Eagle3Model::DraftGraphs::extend_shape_for(const BatchDesc& b) const {
  const int32_t B = b.num_seqs();
  // A token tree runs eagerly: its masks are per-pass data the graphs do not stage.
  if (B == 0 || B > buckets_.back() || b.mrope || b.has_tree() || b.pages_stride > widths_.back() ||
      b.logit_rows.size() != size_t(B))
    return {0, 0};
  const int32_t q = b.q_len(0);
  if (q < 2 || q > max_extend_q_) return {0, 0};
  for (int32_t i = 0; i < B; ++i)
    if (b.q_len(i) != q) return {0, 0};
  return {*std::lower_bound(buckets_.begin(), buckets_.end(), B),
          *std::lower_bound(widths_.begin(), widths_.end(), b.pages_stride)};
}

void Eagle3Model::DraftGraphs::run_extend(Eagle3Model& m, const BatchDesc& in, const Tensor& features,
                                          const std::vector<int32_t>& rows, std::pair<int32_t, int32_t> shape,
                                          Out* out) {
  const auto [bucket, width] = shape;
  const int32_t B = in.num_seqs(), q = in.q_len(0);
  staged_.resize(1);
  BatchDesc& b = staged_[0];
  copy_with_table_width(in, bucket, width, b);
  b.logit_rows = in.logit_rows;
  staged_rows_ = rows;
  for (int32_t i = B; i < bucket; ++i) {  // padding: q rows at slot -1 (no K/V written) on page 0
    for (int32_t j = 0; j < q; ++j) {
      b.tokens.push_back(0);
      b.positions.push_back(j);
      b.slot_mapping.push_back(-1);
      staged_rows_.push_back(0);
    }
    b.logit_rows.push_back(b.cu_q.back() + q - 1);
    b.cu_q.push_back(b.cu_q.back() + q);
    b.kv_lens.push_back(q);
  }
  const int64_t T = b.num_tokens();
  auto* s = static_cast<cudaStream_t>(stream_);
  {
    cuda::StreamScope scope(s);
    m.stage(b, &staged_rows_, nullptr);
    Graph& g = extend_graphs_[{bucket, width, q}];
    if (!g.exec || g.generation != m.ws_generation() || g.features != features.data || g.topk != m.topk()) {
      // The eager pass writes the same K/V the replay does, and its residual is recomputed from the features.
      capture(m, g, [&] { m.launch_features(features, T, bucket, q); });
      g.features = features.data;
      g.topk = m.topk();
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g.exec), s));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  m.read_out(bucket, out, B);  // the padding sequences' logit rows come after the B real ones
}

void Eagle3Model::DraftGraphs::run(Eagle3Model& m, const std::vector<BatchDesc>& passes,
                                   std::pair<int32_t, int32_t> shape, std::vector<bf16_t> hidden,
                                   std::vector<std::vector<int32_t>>* tokens) {
  const auto [bucket, width] = shape;
  const int32_t R = passes[0].num_seqs();
  const int64_t H = m.config().hidden;
  const size_t n = passes.size();
  staged_.resize(n);
  for (size_t j = 0; j < n; ++j) {
    BatchDesc& b = staged_[j];
    copy_with_table_width(passes[j], bucket, width, b);
    for (int32_t i = R; i < bucket; ++i) {  // padding: one key (page 0's first slot), no K/V written
      b.tokens.push_back(0);
      b.positions.push_back(0);
      b.slot_mapping.push_back(-1);
      b.cu_q.push_back(i + 1);
      b.kv_lens.push_back(1);
    }
    b.logit_rows.resize(size_t(bucket));
    for (int32_t r = 0; r < bucket; ++r) b.logit_rows[size_t(r)] = r;
  }
  hidden.resize(size_t(bucket * H), f32_to_bf16(0.0f));
  auto* s = static_cast<cudaStream_t>(stream_);
  {
    cuda::StreamScope scope(s);
    m.stage_chain(staged_, hidden);
    Graph& g = graphs_[{bucket, width, n}];
    if (!g.exec || g.generation != m.ws_generation()) {
      capture(m, g, bucket, n);
      // The capture's eager chain updated the residual, which holds the input hidden states, in place: the
      // replay needs them staged again (same sizes, so the same buffers the graph holds).
      m.stage_chain(staged_, hidden);
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g.exec), s));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  m.read_chain(bucket, R, n, tokens);
}
#else
Eagle3Model::DraftGraphs::DraftGraphs(std::vector<int32_t> buckets, std::vector<int32_t> widths,
                                      int32_t max_extend_q)
    : buckets_(std::move(buckets)), widths_(std::move(widths)), max_extend_q_(max_extend_q) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
Eagle3Model::DraftGraphs::~DraftGraphs() = default;
void Eagle3Model::DraftGraphs::capture(Eagle3Model&, Graph&, int32_t, size_t) {}
void Eagle3Model::DraftGraphs::capture(Eagle3Model&, Graph&, const std::function<void()>&) {}
std::pair<int32_t, int32_t> Eagle3Model::DraftGraphs::extend_shape_for(const BatchDesc&) const {
  return {0, 0};
}
void Eagle3Model::DraftGraphs::run_extend(Eagle3Model&, const BatchDesc&, const Tensor&,
                                          const std::vector<int32_t>&, std::pair<int32_t, int32_t>, Out*) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
void Eagle3Model::DraftGraphs::run(Eagle3Model&, const std::vector<BatchDesc>&, std::pair<int32_t, int32_t>,
                                   std::vector<bf16_t>, std::vector<std::vector<int32_t>>*) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
#endif

void Eagle3Model::prepare_draft_graphs(const std::vector<int32_t>& buckets,
                                       const std::vector<int32_t>& widths, int32_t max_extend_q) {
  draft_graphs_.reset();
  if (!device_.is_cuda() || buckets.empty()) return;
  draft_graphs_ = std::make_unique<DraftGraphs>(buckets, widths, max_extend_q);
}

int Eagle3Model::num_chain_graphs() const {
  return draft_graphs_ ? draft_graphs_->num_chain() : 0;
}

int Eagle3Model::num_extend_graphs() const {
  return draft_graphs_ ? draft_graphs_->num_extend() : 0;
}

bool Eagle3Model::run_chain_graph(const std::vector<BatchDesc>& passes, const std::vector<bf16_t>& hidden,
                                  std::vector<std::vector<int32_t>>* tokens) {
  if (!draft_graphs_) return false;
  const std::pair<int32_t, int32_t> shape = draft_graphs_->shape_for(passes);
  if (shape.first == 0) return false;
  draft_graphs_->run(*this, passes, shape, hidden, tokens);
  return true;
}

bool Eagle3Model::run_extend_graph(const BatchDesc& b, const Tensor& features,
                                   const std::vector<int32_t>& rows, Out* out) {
  if (!draft_graphs_) return false;
  const std::pair<int32_t, int32_t> shape = draft_graphs_->extend_shape_for(b);
  if (shape.first == 0) return false;
  draft_graphs_->run_extend(*this, b, features, rows, shape, out);
  return true;
}

}  // namespace kiln
