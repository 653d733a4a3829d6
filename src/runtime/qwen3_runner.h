// Qwen3Runner: the ModelRunner for the real model (src/model/qwen3.h) on the CPU or a GPU. It owns the
// Qwen3Model and its KvCache, and copies each step's logits / hidden rows back to the host.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/staged_upload.h"
#include "model/cuda_graph.h"
#include "model/eagle3_model.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "runtime/device_penalties.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "runtime/vl_images.h"

namespace kiln {

class Qwen3Runner : public ModelRunner {
 public:
  Qwen3Runner(std::unique_ptr<Qwen3Model> model, ops::KvLayout layout, DType kv_dtype);
  ~Qwen3Runner() override;  // waits for the steps launch_sampled left in flight

  const ModelConfig& config() const override { return model_->config(); }
  Device device() const override { return model_->device(); }
  int64_t kv_bytes_per_token() const override {
    return KvCache::bytes_per_token(config(), kv_dtype_) + (draft_ ? draft_->kv_bytes_per_token() : 0);
  }
  int64_t kv_memory_budget(double mem_fraction) const override;
  void allocate_kv(int32_t num_pages, int32_t page_size) override;
  // CUDA: captures one decode graph per (bucket, page-table width) at once; widths are powers of two
  // from 16 pages up to the plan's widest. The CPU runs eagerly; so does a Qwen3-VL step with image rows
  // (M-RoPE positions), while its decode steps replay the graphs (place_positions keeps them plain). An
  // embedding model captures none (it runs no LM head).
  void prepare_graphs(const GraphPlan& plan) override;
  int32_t graph_bucket(const BatchDesc& batch) const override;
  // CUDA, plan.verify_rows_per_seq = q >= 2: verify steps of the plan's batch sizes up to kMaxVerifySeqs
  // replay a graph per (bucket, page-table width) with q rows per sequence, all captured here with the decode
  // graphs (a capture inside serving stalls every running request: ~3 ms each for the small spec model).
  // plan.verify_trees: the verify graphs are tree graphs (token-tree steps of that width), none for chains.
  int32_t verify_graph_bucket(int32_t num_seqs, int32_t rows_per_seq, int32_t pages_stride,
                              bool tree) const override;
  static constexpr int32_t kMaxVerifySeqs = 32;
  // Qwen3-VL: plain positions (with each image request's offset) unless a row is an image pad, then three
  // M-RoPE rows (VlImages::text_positions).
  void place_positions(BatchDesc& batch) const override;
  void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) override;
  // CUDA: the query rows through the LM head in groups of kRowLogprobGroup, reduced on the device, only the
  // answers copied back (prompt_logprobs_device.cpp). CPU, hidden states asked, or a tensor-parallel shard:
  // ModelRunner's host default.
  void forward_logprobs(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden,
                        const std::vector<LogprobQuery>& queries, std::vector<RowLogprobs>* out) override;
  // CUDA: logits stay on the device; kiln::cuda::sample draws every row there. CPU: declines.
  // Rows with logit processing (bias, min-token mask, penalties) get it on the device first
  // (DevicePenalties), graph or not.
  using ModelRunner::forward_sampled;
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out, const std::function<void()>& before_sample) override;
  // CUDA, graph steps only, rows without logit processing: the step's replay, its sampling and the copy of
  // the draws to pinned host memory are queued on the graph's stream and an event marks their end; a
  // chained step (same graph as the step launched before it) takes its input tokens from that step's draws
  // by a device copy. Two steps at most in flight, each with its own draw buffers.
  bool launch_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                      bool chained) override;
  // launch_sampled in two halves (launch_sampled is both): the replay alone, then the rows' processing (their
  // grammar masks, DevicePenalties), the sampling, the draws' copy and the end event on the graph's stream.
  bool launch_forward(const BatchDesc& batch, int top_n, bool chained) override;
  void sample_launched(const std::vector<RowSampling>& rows) override;
  void collect_sampled(std::vector<SampledRow>* out) override;
  void abandon_launched() override;
  void release_request(uint64_t request) override;
  // Qwen3-VL images: encoded on the CPU backend (model/qwen3_vl_vision.h) when a step reaches their pads.
  void attach_images(uint64_t request, VlPromptLayout layout,
                     std::vector<vision::ImagePatches> images) override;
  // Polled between the vision tower's blocks (VlImages::prepare): a pass whose requests are all abandoned
  // stops and forward throws StepCancelled.
  void set_abandoned_check(std::function<bool(uint64_t request)> abandoned) override {
    abandoned_ = std::move(abandoned);
  }
  const VlImages& images() const { return images_; }
  const DevicePenalties& penalties() const { return penalties_; }
  // The step with its logits left on the device (f32 [R, vocab], valid until the next step): what the
  // tensor-parallel ranks other than 0 run (runtime/tp_runner.h), replaying the same graph rank 0 does.
  Tensor forward_device(const BatchDesc& batch);

  // EAGLE-3: the draft beside the model (before allocate_kv and prepare_graphs: the target's steps capture
  // the draft's features from then on, graphs included). On CUDA, KILN_EAGLE3_CUDA=0 refuses it by name.
  // prepare_graphs also gives the draft's chains and its passes after verify steps graphs per batch size
  // (Eagle3Model::prepare_draft_graphs; KILN_EAGLE3_DRAFT_GRAPHS=0: eager).
  void set_draft(std::unique_ptr<Eagle3Model> draft);
  bool has_draft() const override { return draft_ != nullptr; }
  void draft_from_step(const BatchDesc& batch, const std::vector<int32_t>& step_rows, DraftOut* out) override;
  void draft_from_hidden(const BatchDesc& batch, const std::vector<float>& hidden, DraftOut* out) override;
  void draft_chain(const std::vector<BatchDesc>& passes, const std::vector<float>& hidden,
                   std::vector<std::vector<int32_t>>* tokens) override;
  // With the draft's graphs, or KILN_EAGLE3_UNIFORM_EXTEND=1 (tests on the CPU backend).
  bool uniform_draft_extend() const override;
  // The draft's Eagle3Model::set_topk (without a draft: k == 1 only).
  void set_draft_topk(int k) override;
  // The target's KvCache::move_slots, then the draft's (both checked before either moves). CUDA: on
  // ops::current_stream(), whose steps (eager or graph replays, on blocking streams) it is ordered with.
  void move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) override;
  // move_kv's checks alone (tests, and the tensor-parallel runner before it sends a move to its ranks).
  void check_kv_moves(const std::vector<int64_t>& from, const std::vector<int64_t>& to) const;

  Qwen3Model& model() { return *model_; }
  KvCache& cache() { return *cache_; }
  int num_graphs() const { return int(graphs_.size()); }
  int num_verify_graphs() const { return int(verify_graphs_.size()); }
  int64_t verify_graph_replays() const { return verify_replays_; }  // verify steps that replayed a graph
  int64_t tree_graph_replays() const { return tree_replays_; }      // of them, token trees (tree graphs)
  int num_draft_chain_graphs() const { return draft_ ? draft_->num_chain_graphs() : 0; }
  int num_draft_extend_graphs() const { return draft_ ? draft_->num_extend_graphs() : 0; }

 private:
  Tensor device_rows(Buffer& buf, int64_t rows, int64_t cols);  // f32 [rows, cols], grown on demand
  // The batch the model runs: `batch` itself, or (requests with images in it) a copy with their positions
  // placed (plain, or M-RoPE rows with `visual` then holding the image rows); either way idempotent.
  const BatchDesc& with_images(const BatchDesc& batch, BatchDesc& local, VisualInput& visual);
  CudaDecodeGraph* graph_for(const BatchDesc& batch);  // null: run eagerly
  CudaDecodeGraph* verify_graph_for(const BatchDesc& batch);
  // prepare_graphs, on a step of padding rows (tree: causal padding sequences of a token-tree batch).
  void capture_verify_graph(int32_t bucket, int32_t width, bool tree);

  std::unique_ptr<Qwen3Model> model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Eagle3Model> draft_;
  ops::KvLayout layout_;
  DType kv_dtype_;
  Buffer logits_buf_, hidden_buf_;
  Buffer query_buf_, query_logits_buf_;        // forward_logprobs: a group's inputs and answers; its logits
  Buffer sample_params_buf_, sample_out_buf_;  // device: SampleParams [R]; tokens, logprobs, top ids/logprobs
  StagedUploads sample_uploads_;               // the SampleParams' copies
  // launch_sampled's steps in flight, oldest first: each has a slot (draw buffers on the device and in
  // pinned host memory, and the event recorded after its draws reached the host).
  struct Launched {
    int64_t rows = 0;
    int top_n = 0;
    int slot = 0;
    CudaDecodeGraph* graph = nullptr;
    Tensor logits;         // f32 [rows, vocab] in the graphs' logits buffer
    bool sampled = false;  // its sampling is queued (sample_launched)
  };
  std::vector<Launched> launched_;
  // CUDA: uploads the rows' SampleParams (StagedUploads on `stream`) and queues cuda::sample of `logits` into
  // `out` (device, draw_bytes(rows, top_n): tokens, logprobs, top ids, top logprobs).
  void sample_into(const Tensor& logits, const std::vector<RowSampling>& rows, int top_n, void* out,
                   void* stream);
  Buffer launch_out_buf_[2];
  PinnedHost launch_host_[2];
  void* launch_done_[2] = {nullptr, nullptr};  // cudaEvent_t
  int next_slot_ = 0;
  DevicePenalties penalties_;
  VlImages images_;
  std::function<bool(uint64_t request)> abandoned_;
  std::vector<int32_t> graph_buckets_, graph_widths_;  // ascending; empty: no graphs
  Buffer graph_logits_buf_;                            // f32 [largest bucket, vocab], shared by the graphs
  bool graph_pdl_ = false;                             // GraphPlan::pdl and pdl_min_batch, for verify graphs
  int32_t graph_pdl_min_batch_ = 1;
  int32_t verify_rows_ = 0;              // GraphPlan::verify_rows_per_seq (0: no verify graphs)
  std::vector<int32_t> verify_buckets_;  // ascending
  Buffer verify_logits_buf_;             // f32 [largest verify bucket * verify_rows_, vocab]
  int64_t verify_replays_ = 0;
  int64_t tree_replays_ = 0;
  // Declared last: destroyed first, while the model, cache and logits buffer they use still exist.
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<CudaDecodeGraph>> graphs_;  // (bucket, width)
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<CudaDecodeGraph>> verify_graphs_;
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<CudaDecodeGraph>>
      tree_graphs_;  // GraphPlan::verify_trees
};

// The string options (device, load format, KV layout and dtype) parsed; errors name the bad value.
struct Qwen3RunnerSettings {
  LoadOptions load;
  ops::KvLayout layout = ops::KvLayout::nhd;
  std::string kv_cache_dtype = "auto";
  DType kv_dtype(const ModelConfig& cfg) const;  // "auto": the model's dtype
};
Qwen3RunnerSettings parse_qwen3_runner_settings(const EngineOptions& opts);

// Parses the string options and loads the model.
std::unique_ptr<Qwen3Runner> load_qwen3_runner(const EngineOptions& opts);

}  // namespace kiln
