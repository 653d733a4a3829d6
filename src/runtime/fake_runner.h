// FakeRunner: a deterministic stand-in for a model, for scheduler/engine/server tests without weights.
// Its "KV cache" stores (token, position) per slot. Each step it writes the new tokens through
// slot_mapping, then, for every sequence, reads its whole context back through the page table and
// throws if any slot holds the wrong token or position: a wrong page table, a reused page that was still
// in use, or a prefix-cache hit on the wrong pages fails loudly. The logits of a row depend only on the
// context tokens, so the greedy continuation of a prompt is fixed: FakeRunner::reference() computes it
// without any batching, paging or caching.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "runtime/model_runner.h"

namespace kiln {

// A device sampler's stand-in on the host (FakeRunner's, and tests' CPU runners that sample as CUDA does):
// each row of logits [rows, vocab] with its processor applied in place, then greedy (lowest id among the
// maximal logits) or a draw from softmax(logits / T) over the top-k with a generator seeded by (seed, step)
// only; each draw's raw log-softmax and the top_n alternatives.
void draw_rows_on_host(std::vector<float>& logits, int64_t vocab,
                       const std::vector<ModelRunner::RowSampling>& rows, int top_n,
                       std::vector<ModelRunner::SampledRow>* out);

class FakeRunner : public ModelRunner {
 public:
  // vocab >= 2; eos is the model's eos token (config().eos_token_ids), or -1 for none.
  explicit FakeRunner(int64_t vocab = 64, int64_t hidden = 8, int32_t eos = -1,
                      int64_t max_positions = 1 << 20);

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::cpu(); }
  int64_t kv_bytes_per_token() const override { return 8; }
  int64_t kv_memory_budget(double mem_fraction) const override { return int64_t(mem_fraction * (1 << 20)); }
  void allocate_kv(int32_t num_pages, int32_t page_size) override;
  void prepare_graphs(const GraphPlan& plan) override { graph_plans.push_back(plan); }
  int32_t graph_bucket(const BatchDesc& batch) const override;
  void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) override;
  // With device_sampling set, stands in for a device sampler: greedy argmax, or a draw from
  // softmax(logits / T) over the top-k with a generator seeded by (seed, step) only. Counts its calls.
  using ModelRunner::forward_sampled;
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out, const std::function<void()>& before_sample) override;
  // With device_sampling and launch_ahead set: runs the step at once (a chained step takes its tokens from
  // the previous launch's draws) and keeps the rows until collect_sampled(), which returns them in order.
  bool launch_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                      bool chained) override;
  // With device_sampling and launch_ahead set: runs the forward at once and keeps its logits; sample_launched
  // draws from them as forward_sampled does (each row's processor applied first).
  bool launch_forward(const BatchDesc& batch, int top_n, bool chained) override;
  void sample_launched(const std::vector<RowSampling>& rows) override;
  void collect_sampled(std::vector<SampledRow>* out) override;
  void abandon_launched() override { launched_.clear(); }
  // Moves the (token, position) its slots hold, with ModelRunner::move_kv's checks and semantics.
  void move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) override;

  // The logits after `context` ([vocab] into row): values in [0, 1) except 2 at next_token().
  void write_logits(const int32_t* context, int64_t n, float* row) const;
  // The greedy argmax token after `context`. Logits peak there, by a margin of at least 1.
  int32_t next_token(const int32_t* context, int64_t n) const;
  // Greedy continuation of `prompt` by `steps` tokens (stops after eos when stop_at_eos).
  std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int steps, bool stop_at_eos) const;

  // Test hooks. A test may set them from its own thread only while the engine thread is known to be between
  // steps (idle, or held at the gate below).
  // The step gate: while held, every forward() waits at its start (before it counts the step) until
  // release_steps(). A test holds it while it submits several requests, so that they are all admitted before
  // the engine has run more than one step, however the threads are scheduled.
  void hold_steps();
  void release_steps();
  void wait_until_held();  // returns once a forward() waits at the held gate
  // Each step sleeps this long per prefill token (rows with q_len > 1) after the gate: a model whose prefill
  // takes at least this long, for the engine's time bound on steps (EngineOptions::max_prefill_chunk_ms).
  double ms_per_prefill_token = 0.0;
  int64_t steps = 0;
  int64_t logit_steps =
      0;  // steps with at least one logit row (a prefill chunk that ends no prompt has none)
  int64_t max_seqs_seen = 0;
  bool saw_mixed_step = false;                    // a step with both q_len == 1 and q_len > 1 rows
  std::vector<int32_t> graph_buckets;             // pad all-decode batches up to these (empty: never pad)
  std::vector<GraphPlan> graph_plans;             // what prepare_graphs was given
  int64_t fail_at_step = -1;                      // forward() throws on this step number
  std::function<void()> on_forward;               // runs at each forward()'s start, after the gate
  std::vector<int32_t> step_tokens;               // tokens per step
  bool device_sampling = false;                   // forward_sampled() works (else it declines)
  int64_t sampled_steps = 0;                      // steps served by forward_sampled()
  bool launch_ahead = false;                      // launch_sampled() works (with device_sampling)
  int64_t launched_steps = 0, chained_steps = 0;  // served by launch_sampled(), chained ones among them
  int64_t deferred_steps = 0;                     // launched by launch_forward() (counted in launched_steps)

 private:
  ModelConfig config_;
  int32_t page_size_ = 0;
  std::vector<int64_t> slot_token_;  // [num_pages * page_size]: -1 empty
  std::vector<int64_t> slot_pos_;
  struct Launched {
    std::vector<SampledRow> rows;  // the draws, once sampled
    std::vector<float> logits;     // launch_forward: [rows, vocab] until sampled
    int top_n = 0;
    bool sampled = true;
  };
  std::deque<Launched> launched_;  // launched, not collected (oldest first)
  // The step's input with a chained step's tokens taken from the draws of the step launched last.
  const BatchDesc& chain_input(const BatchDesc& batch, bool chained, BatchDesc& local);
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool gate_held_ = false;
  int gate_waiting_ = 0;
};

}  // namespace kiln
