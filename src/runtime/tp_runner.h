// TpRunner: tensor parallelism behind the ModelRunner interface (issue 14). The engine and its scheduler
// run unchanged on the engine thread and see one runner; behind it, one worker thread per local rank owns
// that rank's device, weights (model/tensor_parallel.h), KV cache (the rank's KV heads; the one KvPool of
// the engine hands out page ids valid in every rank's cache) and CUDA graphs, in a Qwen3Runner of its own.
//
// Every call of the engine becomes one step of all ranks in lockstep: the engine thread hands the call (the
// step's BatchDesc included) to every local rank and waits for all of them. Rank 0 alone returns logits,
// hidden states or, on CUDA, the sampled tokens (sampling on rank 0: the other ranks hold the same
// all-gathered logits but draw nothing, so seeded sampling is exactly the TP = 1 engine's); the others run
// the same step with the same collectives (a replay of the same decode graph) and discard the result.
//
// Communicators: the CPU backend's ranks are threads over dist::LocalGroup (what CI runs); CUDA ranks use
// NCCL, one GPU each (device cuda:N: GPUs N .. N + tp / nnodes - 1 of this node), ncclCommInitAll within one
// node, else ncclCommInitRank with the unique id from node 0's TCP rendezvous (--dist-init-addr). Ranks on
// other nodes cannot read the engine's call from memory: global rank 0 broadcasts each call as a TpCommand
// (runtime/tp_command.h) and every other rank runs a loop of receive and execute; TpFollower is that loop
// for the processes of nodes 1 .. nnodes - 1. TpRunnerOptions::broadcast_commands makes one process run
// the same way (the CPU tests of that protocol).
//
// Failure: a rank whose load or step throws aborts the group (Communicator::abort: ranks waiting in a
// collective fail instead of waiting for it), and the call throws RunnerFatalError naming the rank and its
// error; the engine then ends every request with it and stops, and so does `kiln serve`. A step that
// outlasts TpRunnerOptions::timeout_s on any rank (a peer lost without an error) aborts the group the same
// way, as does an asynchronous communicator error (polled every second: a peer process lost); a rank that
// still does not return within a grace period after the abort ends the process (exit 70) rather than hang it.
// Once failed, every call throws again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/config.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace kiln {

class Qwen3Runner;

struct TpRunnerOptions {
  int tp = 1;  // ranks over all nodes; 1 still runs the TP path (one-rank group: tests)
  int nnodes = 1, node_rank = 0;
  std::string dist_init_addr;    // host:port of node 0's rendezvous; needed when nnodes > 1
  std::string reduce = "auto";   // the all-reduce's rounding: auto (CPU f32, CUDA bf16) | f32 | bf16
  bool expert_parallel = false;  // MoE: whole experts per rank (dist/shard_plan.h)
  double timeout_s = 600;        // the longest any rank may take for a load or a step (KILN_TP_TIMEOUT)
  double rendezvous_timeout_s = 300;
  bool broadcast_commands = false;  // every rank but 0 receives its calls by broadcast (always across nodes)
  // Failure injection (tests; also KILN_TP_FAULT=RANK:N or RANK:load): global rank fail_rank throws at its
  // fail_collective-th collective (CPU communicator), or while loading when fail_at_load.
  int fail_rank = -1;
  int64_t fail_collective = -1;
  bool fail_at_load = false;
};

// EngineOptions' tp, nnodes, node_rank and dist_init_addr, plus KILN_TP_FAULT and KILN_TP_TIMEOUT.
TpRunnerOptions tp_runner_options(const EngineOptions& opts);

class TpRunner : public ModelRunner {
 public:
  // Loads every local rank's slice of opts.model_dir (opts' device, load format, KV layout and dtype).
  // Throws (naming the rank) if any rank fails to load; no thread is left behind.
  TpRunner(const EngineOptions& opts, const TpRunnerOptions& tp);
  ~TpRunner() override;

  const ModelConfig& config() const override { return cfg_; }  // the whole model's
  Device device() const override;                              // rank 0's
  int64_t kv_bytes_per_token() const override;                 // one rank's (its KV heads)
  // Per rank: the smallest over the local GPUs; CPU ranks split the one host budget.
  int64_t kv_memory_budget(double mem_fraction) const override;
  void allocate_kv(int32_t num_pages, int32_t page_size) override;
  void prepare_graphs(const GraphPlan& plan) override;
  int32_t graph_bucket(const BatchDesc& batch) const override;
  void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) override;
  using ModelRunner::forward_sampled;
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out, const std::function<void()>& before_sample) override;
  void release_request(uint64_t request) override;
  // Checked on the engine thread first (a bad move is an error that changes no rank and leaves the group
  // alive), then every rank moves its own shard's slots (its KV heads), as one lockstep call.
  void move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) override;

  int tp() const { return opts_.tp; }
  int local_ranks() const;
  int global_rank(int local) const;
  // A local rank's runner (tests: its model and KV cache). Only while no call is in flight.
  Qwen3Runner& rank_runner(int local);

  struct Impl;

 private:
  TpRunnerOptions opts_;
  ModelConfig cfg_;
  std::unique_ptr<Impl> impl_;
};

// The processes of nodes 1 .. nnodes - 1 under `kiln serve --nnodes`: loads this node's ranks and runs the
// calls global rank 0 broadcasts until the leader stops (returns) or a rank fails (throws).
void run_tp_follower(const EngineOptions& opts, const TpRunnerOptions& tp);

// Engine::create's runner for opts.tp > 1.
std::unique_ptr<ModelRunner> make_tp_runner(const EngineOptions& opts);

}  // namespace kiln
