// Qwen3Runner's CUDA graphs (runtime/qwen3_runner.h prepare_graphs): the decode graphs per (batch bucket,
// page-table width), the verify graphs and the token-tree verify graphs beside them, and which one a step
// replays.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "kiln/env.h"
#include "kiln/error.h"
#include "model/cuda_step_choice.h"
#include "runtime/qwen3_runner.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln {

namespace {
// The draft's chains and passes after verify steps from CUDA graphs (KILN_EAGLE3_DRAFT_GRAPHS=0: eager): on
// by default since they measured faster, 0.838 against 1.053 ms per verify step at batch 1 on the trained
// small model (H100, 2026-12-07, `550e8bc`, docs/PERF.md SP4).
constexpr bool kEagle3DraftGraphsByDefault = true;
}  // namespace

void Qwen3Runner::prepare_graphs(const GraphPlan& plan) {
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  if (!device().is_cuda() || plan.buckets.empty()) return;
  // An embedding model's steps read hidden states (forward_hidden), never logits: no decode graphs (they end
  // in the LM head, which it has none of) and no logits buffer.
  if (config().arch == ModelArch::qwen3_embedding) return;
  KILN_CHECK(plan.max_pages_per_seq > 0, "prepare_graphs: max_pages_per_seq must be positive");
  for (size_t i = 0; i < plan.buckets.size(); ++i)
    KILN_CHECK(plan.buckets[i] >= 1 && (i == 0 || plan.buckets[i] > plan.buckets[i - 1]),
               "CUDA graph batch sizes must be ascending and >= 1");
  const auto t0 = std::chrono::steady_clock::now();
  graphs_.clear();
  graph_buckets_ = plan.buckets;
  graph_widths_.clear();
  for (int32_t w = 16; w < plan.max_pages_per_seq; w *= 2) graph_widths_.push_back(w);
  graph_widths_.push_back(plan.max_pages_per_seq);
  const int32_t top = graph_buckets_.back();
  const int32_t seqs = std::max(plan.max_seqs, top);
  graph_pdl_ = plan.pdl;
  graph_pdl_min_batch_ = plan.pdl_min_batch;
  verify_graphs_.clear();
  tree_graphs_.clear();
  verify_buckets_.clear();
  verify_rows_ = plan.verify_rows_per_seq >= 2 ? plan.verify_rows_per_seq : 0;
  if (verify_rows_ > 0)
    for (int32_t b : graph_buckets_)
      if (b <= kMaxVerifySeqs) verify_buckets_.push_back(b);
  const int64_t verify_max = verify_buckets_.empty() ? 0 : int64_t(verify_buckets_.back()) * verify_rows_;
  // Size the workspace for every step the scheduler may form first (and the verify steps), so no later step
  // reallocates it and forces the graphs to be captured again.
  model_->reserve_workspace(std::max<int64_t>({plan.max_step_tokens, top, verify_max}), seqs,
                            graph_widths_.back(), std::max<int64_t>(seqs, verify_max));
  // EAGLE-3's chains (one row per sequence a pass) from a graph per batch size up to kMaxVerifySeqs, width
  // and pass count.
  if (draft_) {
    std::vector<int32_t> chain_buckets;
    if (env_switch("KILN_EAGLE3_DRAFT_GRAPHS", kEagle3DraftGraphsByDefault))
      for (int32_t b : graph_buckets_)
        if (b <= kMaxVerifySeqs) chain_buckets.push_back(b);
    draft_->prepare_draft_graphs(chain_buckets, graph_widths_, verify_rows_);
  }
  const int64_t V = config().vocab_size;
  if (verify_max > 0) verify_logits_buf_ = Buffer(size_t(verify_max) * size_t(V) * sizeof(float), device());
  graph_logits_buf_ = Buffer(size_t(top) * size_t(V) * sizeof(float), device());
  const Tensor shared(graph_logits_buf_.data(), DType::f32, {top, V}, device());
  // The batch-1 residual-norm prologue from the whole step timed both ways, before the graphs that read it.
  if (graph_buckets_.front() == 1)
    cuda_choose_norm_in_by_step(*model_, *cache_, plan.pdl && plan.pdl_min_batch <= 1);
  // Capture now, on steps of padding rows only (no K/V is written), so no serving step waits for one. Each
  // graph has its own PDL setting; eager steps keep the process's (off by default).
  for (int32_t b : graph_buckets_) {
    for (int32_t w : graph_widths_) {
      auto g = std::make_unique<CudaDecodeGraph>(*model_, *cache_, w, b, shared,
                                                 plan.pdl && b >= plan.pdl_min_batch);
      BatchDesc pad;
      pad.page_size = cache_->page_size();
      pad_batch(pad, b);
      g->step(pad);
      graphs_[{b, w}] = std::move(g);
    }
  }
  // With token trees every verify step is a tree (runtime/engine_tree.cpp): no chain verify graphs then.
  for (int32_t b : verify_buckets_)
    for (int32_t w : graph_widths_) capture_verify_graph(b, w, plan.verify_trees);
#ifdef KILN_HAVE_CUDA
  KILN_CHECK(cudaDeviceSynchronize() == cudaSuccess,
             "capturing the decode CUDA graphs failed: ", cudaGetErrorString(cudaGetLastError()));
#endif
  std::fprintf(stderr,
               "kiln: captured %zu decode CUDA graphs (%zu batch sizes up to %d x %zu page-table widths "
               "up to %d pages%s), %zu verify graphs and %zu token-tree verify graphs in %.2f s\n",
               graphs_.size(), graph_buckets_.size(), top, graph_widths_.size(), graph_widths_.back(),
               plan.pdl ? (", PDL from batch " + std::to_string(plan.pdl_min_batch)).c_str() : "",
               verify_graphs_.size(), tree_graphs_.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

int32_t Qwen3Runner::graph_bucket(const BatchDesc& batch) const {
  if (graph_buckets_.empty() || !is_graphable_decode(batch) || !images_.plain_positions_suffice(batch))
    return 0;
  if (batch.num_seqs() > graph_buckets_.back() || batch.pages_stride > graph_widths_.back()) return 0;
  return *std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), batch.num_seqs());
}

int32_t Qwen3Runner::verify_graph_bucket(int32_t num_seqs, int32_t rows_per_seq, int32_t pages_stride,
                                         bool tree) const {
  if (verify_buckets_.empty() || rows_per_seq != verify_rows_ || num_seqs > verify_buckets_.back() ||
      pages_stride > graph_widths_.back() || (tree ? tree_graphs_ : verify_graphs_).empty())
    return 0;
  return *std::lower_bound(verify_buckets_.begin(), verify_buckets_.end(), num_seqs);
}

void Qwen3Runner::capture_verify_graph(int32_t bucket, int32_t width, bool tree) {
  const int64_t rows = int64_t(verify_buckets_.back()) * verify_rows_;
  const Tensor shared(verify_logits_buf_.data(), DType::f32, {rows, config().vocab_size}, device());
  auto g =
      std::make_unique<CudaDecodeGraph>(*model_, *cache_, width, bucket, shared,
                                        graph_pdl_ && bucket >= graph_pdl_min_batch_, verify_rows_, tree);
  BatchDesc pad;
  pad.page_size = cache_->page_size();
  pad_batch(pad, bucket, verify_rows_);  // slot -1 everywhere: no K/V is written
  if (tree) {  // causal sequences of a token-tree batch: the captured attention reads the staged masks
    pad.tree_window.assign(size_t(bucket), 0);
    pad.tree_mask.assign(pad.tokens.size(), 0);
  }
  g->step(pad);  // captures it
  (tree ? tree_graphs_ : verify_graphs_)[{bucket, width}] = std::move(g);
}

CudaDecodeGraph* Qwen3Runner::verify_graph_for(const BatchDesc& batch) {
  const auto w = std::lower_bound(graph_widths_.begin(), graph_widths_.end(), batch.pages_stride);
  if (w == graph_widths_.end()) return nullptr;
  auto& graphs = batch.has_tree() ? tree_graphs_ : verify_graphs_;
  const auto g = graphs.find({batch.num_seqs(), *w});
  if (g == graphs.end()) return nullptr;
  ++verify_replays_;
  if (batch.has_tree()) ++tree_replays_;
  return g->second.get();
}

CudaDecodeGraph* Qwen3Runner::graph_for(const BatchDesc& batch) {
  // A token tree replays a tree graph where it is a uniform verify step, else runs eagerly.
  if (graph_buckets_.empty()) return nullptr;
  if (verify_rows_ > 0 && is_uniform_verify(batch, verify_rows_)) return verify_graph_for(batch);
  if (!is_graphable_decode(batch)) return nullptr;
  if (!std::binary_search(graph_buckets_.begin(), graph_buckets_.end(), batch.num_seqs())) return nullptr;
  const auto w = std::lower_bound(graph_widths_.begin(), graph_widths_.end(), batch.pages_stride);
  if (w == graph_widths_.end()) return nullptr;
  return graphs_.at({batch.num_seqs(), *w}).get();
}

}  // namespace kiln
