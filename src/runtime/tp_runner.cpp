// Tensor-parallel runner: worker threads, lockstep calls, the command broadcast and failure (tp_runner.h).
#include "runtime/tp_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "dist/local_comm.h"
#include "dist/nccl_comm.h"
#include "dist/rendezvous.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"
#include "model/qwen3.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_command.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;
constexpr double kAbortGraceS = 30;

void select_device(Device d) {
#ifdef KILN_HAVE_CUDA
  if (d.is_cuda()) {
    const cudaError_t e = cudaSetDevice(d.index);
    KILN_CHECK(e == cudaSuccess, "cannot select ", device_name(d), ": ", cudaGetErrorString(e));
  }
#else
  (void)d;
#endif
}
}  // namespace

TpRunnerOptions tp_runner_options(const EngineOptions& e) {
  TpRunnerOptions o;
  o.tp = e.tp;
  o.nnodes = e.nnodes;
  o.node_rank = e.node_rank;
  o.dist_init_addr = e.dist_init_addr;
  o.expert_parallel = e.expert_parallel;
  if (const char* t = std::getenv("KILN_TP_TIMEOUT"); t && *t) {
    o.timeout_s = std::atof(t);
    KILN_CHECK(o.timeout_s > 0, "KILN_TP_TIMEOUT must be a positive number of seconds, got '", t, "'");
  }
  if (const char* f = std::getenv("KILN_TP_FAULT"); f && *f) {  // RANK:N or RANK:load
    const std::string s = f;
    const size_t colon = s.find(':');
    KILN_CHECK(colon != std::string::npos && colon > 0, "KILN_TP_FAULT must be RANK:N or RANK:load, got '", s,
               "'");
    o.fail_rank = std::stoi(s.substr(0, colon));
    if (s.substr(colon + 1) == "load") {
      o.fail_at_load = true;
    } else {
      o.fail_collective = std::stoll(s.substr(colon + 1));
    }
  }
  return o;
}

// One local rank: its thread, device, communicator, shard and runner, and the mailbox the engine thread
// (or, for the follower loops, nobody) posts jobs to.
struct RankWorker {
  int local = 0, global = 0;
  Device device;
  dist::Communicator* comm = nullptr;
  std::unique_ptr<dist::Communicator> owned_comm;  // ncclCommInitRank's (across nodes)
  TpShard shard;
  std::unique_ptr<Qwen3Runner> runner;
  std::thread thread;
  std::vector<float> junk_logits, junk_hidden;  // what ranks other than 0 compute and nobody reads
  std::optional<Buffer> wire;                   // command broadcast staging, on the rank's device

  std::mutex m;
  std::condition_variable cv;
  std::function<void(RankWorker&)> job;
  uint64_t posted = 0, done = 0;
  bool quit = false;
  std::string error;       // the last job's failure
  uint64_t error_seq = 0;  // order of failures over the group: the first is the root cause
};

struct TpRunner::Impl {
  TpRunnerOptions opts;
  ModelConfig cfg;  // the whole model's
  Qwen3RunnerSettings st;
  dist::ReduceType reduce = dist::ReduceType::f32;
  std::unique_ptr<dist::LocalGroup> group;
  std::vector<std::unique_ptr<dist::Communicator>> nccl;
  std::vector<std::unique_ptr<RankWorker>> workers;
  std::atomic<uint64_t> failures{0};
  std::string failed;           // non-empty: the runner is dead, with this message
  bool follower_loops = false;  // local ranks other than 0 run follow() (broadcast mode)
  bool leader = true;           // this process holds global rank 0

  void start(const EngineOptions& eo);
  void abort_all();
  std::string async_error();  // the first communicator's asynchronous error, or ""
  void worker_main(RankWorker& w);
  // Runs fn on the given local ranks' threads and waits for all of them; a failure or a timeout makes the
  // runner dead and throws RunnerFatalError.
  void run(const std::vector<int>& which, const std::function<void(RankWorker&)>& fn, const char* what);
  std::vector<int> all_or_leader() const;
  // One engine call: rank 0 runs rank0 (after broadcasting c when others follow broadcasts), every other
  // local rank executes c over `batch` (the caller's, read in place).
  void call(const TpCommand& c, const BatchDesc& batch, const std::function<void(Qwen3Runner&)>& rank0,
            const char* what);
  TpCommand forward_command(const BatchDesc& batch, bool logits, bool hidden) const;
  [[noreturn]] void die(const std::string& msg);
  std::string root_cause() const;
  // The command protocol (tp_command.h).
  void send(RankWorker& w, const TpCommand& c);
  TpCommand receive(RankWorker& w);
  void execute(RankWorker& w, const TpCommand& c, const BatchDesc& batch);
  void follow(RankWorker& w);
  ~Impl();
};

void TpRunner::Impl::abort_all() {
  if (group) group->abort();
  for (auto& c : nccl) c->abort();
  for (auto& w : workers)
    if (w->owned_comm) w->owned_comm->abort();
}

std::string TpRunner::Impl::async_error() {
  for (auto& c : nccl)
    if (std::string e = c->async_error(); !e.empty()) return e;
  for (auto& w : workers)
    if (w->owned_comm)
      if (std::string e = w->owned_comm->async_error(); !e.empty()) return e;
  return {};
}

// Waits until w has finished its job or the deadline passes, checking the communicators' asynchronous errors
// every second (a peer lost in another process): such an error aborts the group, which ends the wait.
static bool wait_done(TpRunner::Impl& impl, RankWorker& w, Clock::time_point deadline) {
  std::unique_lock lk(w.m);
  for (;;) {
    const auto slice = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    if (w.cv.wait_until(lk, slice, [&] { return w.done == w.posted; })) return true;
    if (Clock::now() >= deadline) return false;
    lk.unlock();
    if (const std::string e = impl.async_error(); !e.empty()) {
      std::fprintf(stderr, "kiln: tensor-parallel communicator error: %s: aborting the group\n", e.c_str());
      impl.abort_all();
    }
    lk.lock();
  }
}

void TpRunner::Impl::worker_main(RankWorker& w) {
  for (;;) {
    std::function<void(RankWorker&)> job;
    {
      std::unique_lock lk(w.m);
      w.cv.wait(lk, [&] { return w.quit || w.posted != w.done; });
      if (w.posted == w.done) return;  // quit with nothing left
      job = w.job;
    }
    std::string err;
    try {
      select_device(w.device);
      job(w);
    } catch (const std::exception& e) {
      err = e.what();
    }
    std::lock_guard lk(w.m);
    if (!err.empty()) {
      w.error = err;
      w.error_seq = ++failures;
      abort_all();  // ranks waiting for this one in a collective fail now instead of hanging
    }
    w.done = w.posted;
    w.cv.notify_all();
  }
}

std::string TpRunner::Impl::root_cause() const {
  uint64_t first = 0;
  std::string why = "tensor-parallel group failed";
  for (const auto& w : workers) {
    std::lock_guard lk(w->m);  // a follower loop may be recording its failure
    if (w->error_seq && (!first || w->error_seq < first)) {
      first = w->error_seq;
      why = "tensor-parallel rank " + std::to_string(w->global) + " failed: " + w->error;
    }
  }
  return why;
}

void TpRunner::Impl::die(const std::string& msg) {
  failed = msg + " (the tensor-parallel ranks cannot go on without it: stopping)";
  std::fprintf(stderr, "kiln: %s\n", failed.c_str());
  throw RunnerFatalError(failed);
}

void TpRunner::Impl::run(const std::vector<int>& which, const std::function<void(RankWorker&)>& fn,
                         const char* what) {
  if (!failed.empty()) throw RunnerFatalError(failed);
  for (int i : which) {
    RankWorker& w = *workers[size_t(i)];
    std::lock_guard lk(w.m);
    w.job = fn;
    w.error.clear();
    ++w.posted;
    w.cv.notify_all();
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opts.timeout_s));
  bool timed_out = false;
  for (int i : which) {
    if (!wait_done(*this, *workers[size_t(i)], deadline)) {
      timed_out = true;
      break;
    }
  }
  if (timed_out) {
    abort_all();
    const auto grace = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(kAbortGraceS));
    for (int i : which) {
      RankWorker& w = *workers[size_t(i)];
      std::unique_lock lk(w.m);
      if (!w.cv.wait_until(lk, grace, [&] { return w.done == w.posted; })) {
        std::fprintf(stderr,
                     "kiln: tensor-parallel rank %d did not finish %s within %.0f s, nor %.0f s after the "
                     "group was aborted: exiting\n",
                     w.global, what, opts.timeout_s, kAbortGraceS);
        std::_Exit(70);
      }
    }
    die(std::string("a tensor-parallel rank did not finish ") + what + " within " +
        std::to_string(int(opts.timeout_s)) + " s (KILN_TP_TIMEOUT)");
  }
  if (failures.load() > 0) die(root_cause() + " (in " + what + ")");
}

std::vector<int> TpRunner::Impl::all_or_leader() const {
  if (follower_loops) return {0};
  std::vector<int> v(workers.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = int(i);
  return v;
}

void TpRunner::Impl::call(const TpCommand& c, const BatchDesc& batch,
                          const std::function<void(Qwen3Runner&)>& rank0, const char* what) {
  run(
      all_or_leader(),
      [&](RankWorker& w) {
        if (w.global != 0) return execute(w, c, batch);
        if (follower_loops) send(w, c);
        rank0(*w.runner);
      },
      what);
}

TpCommand TpRunner::Impl::forward_command(const BatchDesc& batch, bool logits, bool hidden) const {
  // Token trees come only from EAGLE-3 tree drafting, which runs on one rank (the command encoding does not
  // carry them): refused before any rank sees the step.
  KILN_CHECK(!batch.has_tree(),
             "tensor parallelism does not run token-tree steps (EAGLE-3 tree drafting is "
             "single-rank)");
  TpCommand c;
  c.op = TpCommand::Op::forward;
  c.want_logits = logits;
  c.want_hidden = hidden;
  if (follower_loops) c.batch = batch;  // to be encoded; ranks in this process read the caller's batch
  return c;
}

void TpRunner::Impl::send(RankWorker& w, const TpCommand& c) {
  const std::string payload = tp_encode(c), header = tp_header(c, payload.size());
  const size_t need = std::max(payload.size(), kTpHeaderBytes);
  if (!w.wire || w.wire->bytes() < need) w.wire.emplace(std::max<size_t>(need * 2, 4096), w.device);
  copy_bytes(w.wire->data(), w.device, header.data(), Device::cpu(), kTpHeaderBytes);
  w.comm->broadcast(w.wire->data(), kTpHeaderBytes, 0);
  if (payload.empty()) return;
  copy_bytes(w.wire->data(), w.device, payload.data(), Device::cpu(), payload.size());
  w.comm->broadcast(w.wire->data(), payload.size(), 0);
}

TpCommand TpRunner::Impl::receive(RankWorker& w) {
  if (!w.wire) w.wire.emplace(4096, w.device);
  char header[kTpHeaderBytes];
  w.comm->broadcast(w.wire->data(), kTpHeaderBytes, 0);
  copy_bytes(header, Device::cpu(), w.wire->data(), w.device, kTpHeaderBytes);
  const size_t n = tp_payload_bytes(header);
  std::string payload(n, '\0');
  if (n > 0) {
    if (w.wire->bytes() < n) w.wire.emplace(n * 2, w.device);  // every rank grows alike: same sizes
    w.comm->broadcast(w.wire->data(), n, 0);
    copy_bytes(payload.data(), Device::cpu(), w.wire->data(), w.device, n);
  }
  return tp_decode(header, payload.data(), n);
}

// What a rank other than 0 does for the engine's call on rank 0: the same model work, nothing returned.
void TpRunner::Impl::execute(RankWorker& w, const TpCommand& c, const BatchDesc& batch) {
  switch (c.op) {
    case TpCommand::Op::allocate_kv:
      w.runner->allocate_kv(c.a, c.b);
      return;
    case TpCommand::Op::prepare_graphs:
      w.runner->prepare_graphs(c.graph);
      return;
    case TpCommand::Op::forward:
      // Rank 0's Qwen3Runner::forward / forward_sampled make the same model calls (and graph choice).
      if (c.want_logits && !c.want_hidden) {
        w.runner->forward_device(batch);
      } else {
        w.runner->forward(batch, c.want_logits ? &w.junk_logits : nullptr,
                          c.want_hidden ? &w.junk_hidden : nullptr);
      }
      return;
    case TpCommand::Op::move_kv:
      w.runner->move_kv(c.move_from, c.move_to);
      return;
    case TpCommand::Op::stop:
      return;
  }
}

void TpRunner::Impl::follow(RankWorker& w) {
  for (;;) {
    const TpCommand c = receive(w);
    if (c.op == TpCommand::Op::stop) return;
    execute(w, c, c.batch);
  }
}

void TpRunner::Impl::start(const EngineOptions& eo) {
  const int tp = opts.tp, nnodes = opts.nnodes;
  const bool expert_parallel = opts.expert_parallel;
  KILN_CHECK(tp >= 1 && tp <= 64, "--tp must be in [1, 64], got ", tp);
  KILN_CHECK(nnodes >= 1 && tp % nnodes == 0, "--tp ", tp, " must be a multiple of --nnodes ", nnodes);
  KILN_CHECK(opts.node_rank >= 0 && opts.node_rank < nnodes, "--node-rank ", opts.node_rank,
             " out of range for --nnodes ", nnodes);
  st = parse_qwen3_runner_settings(eo);
  const Device base = st.load.device;
  const int local_n = tp / nnodes;
  leader = opts.node_rank == 0;
  follower_loops = nnodes > 1 || opts.broadcast_commands;
  if (opts.reduce == "auto") {
    reduce = base.is_cpu() ? dist::ReduceType::f32 : dist::ReduceType::bf16;
  } else {
    KILN_CHECK(opts.reduce == "f32" || opts.reduce == "bf16", "bad tensor-parallel reduce '", opts.reduce,
               "': expected auto, f32 or bf16");
    reduce = opts.reduce == "f32" ? dist::ReduceType::f32 : dist::ReduceType::bf16;
    KILN_CHECK(base.is_cpu() || reduce == dist::ReduceType::bf16,
               "the fp32 tensor-parallel all-reduce runs on the CPU only");
  }

  // The whole model's config, and the checkpoint every rank reads its slices from (one mapping).
  cfg = load_model_config(eo.model_dir);
  if (eo.is_embedding) force_embedding(cfg);
  std::optional<Checkpoint> ckpt;
  if (st.load.load_format == LoadFormat::real) {
    ckpt.emplace(Checkpoint::open(eo.model_dir));
    adapt_weight_prefix(cfg, ckpt->names());
  }
  (void)dist::make_shard_plan(cfg, tp, 0, expert_parallel);  // divisibility errors before any thread starts

  std::vector<Device> devices(size_t(local_n), base);
  if (base.is_cuda()) {
#ifdef KILN_HAVE_CUDA
    int count = 0;
    KILN_CHECK(cudaGetDeviceCount(&count) == cudaSuccess, "cudaGetDeviceCount failed");
    KILN_CHECK(base.index + local_n <= count, "--tp ", tp, " over ", nnodes, " node(s) needs ", local_n,
               " GPUs on this node from ", device_name(base), ", but it has ", count);
#endif
    for (int i = 0; i < local_n; ++i) devices[size_t(i)] = Device::cuda(base.index + i);
  } else {
    KILN_CHECK(nnodes == 1, "the CPU backend's tensor parallelism runs in one process: --nnodes must be 1");
  }

  std::string nccl_id;
  if (base.is_cpu()) {
    group = std::make_unique<dist::LocalGroup>(tp);
    if (opts.fail_rank >= 0 && !opts.fail_at_load && opts.fail_collective >= 0)
      group->fail_at(opts.fail_rank, uint64_t(opts.fail_collective));
  } else {
    KILN_CHECK(dist::nccl_available(),
               "tensor parallelism on GPUs needs NCCL, and this build has none (CMake "
               "did not find nccl.h and libnccl; see the README)");
    KILN_CHECK(opts.fail_rank < 0 || opts.fail_at_load,
               "KILN_TP_FAULT RANK:N injects into the CPU communicator only (use RANK:load on GPUs)");
    if (nnodes == 1) {
      std::vector<int> ids;
      for (const Device& d : devices) ids.push_back(d.index);
      nccl = dist::nccl_local_group(ids);
    } else {
      KILN_CHECK(!opts.dist_init_addr.empty(), "--nnodes ", nnodes, " needs --dist-init-addr host:port");
      nccl_id =
          dist::exchange_blob(opts.dist_init_addr, nnodes, opts.node_rank,
                              leader ? dist::nccl_unique_id() : std::string(), opts.rendezvous_timeout_s);
    }
  }

  for (int i = 0; i < local_n; ++i) {
    auto w = std::make_unique<RankWorker>();
    w->local = i;
    w->global = opts.node_rank * local_n + i;
    w->device = devices[size_t(i)];
    if (group) w->comm = &group->comm(w->global);
    if (!nccl.empty()) w->comm = nccl[size_t(i)].get();
    w->shard.plan = dist::make_shard_plan(cfg, tp, w->global, expert_parallel);
    w->shard.reduce = reduce;
    workers.push_back(std::move(w));
  }
  for (auto& w : workers) {
    RankWorker* p = w.get();
    p->thread = std::thread([this, p] { worker_main(*p); });
  }
  const Checkpoint* ck = ckpt ? &*ckpt : nullptr;
  std::vector<int> all(workers.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  run(
      all,
      [&](RankWorker& w) {
        if (!nccl_id.empty()) {
          w.owned_comm = dist::nccl_comm(nccl_id, tp, w.global, w.device.index);
          w.comm = w.owned_comm.get();
        }
        w.shard.comm = w.comm;
        if (opts.fail_at_load && w.global == opts.fail_rank)
          KILN_FAIL("injected failure: rank ", w.global, " while loading");
        LoadOptions lo = st.load;
        lo.device = w.device;
        lo.tp = &w.shard;
        auto model = Qwen3Model::create(cfg, ck, lo);
        const DType kv = st.kv_dtype(model->config());
        w.runner = std::make_unique<Qwen3Runner>(std::move(model), st.layout, kv);
      },
      "loading");
  if (follower_loops) {  // ranks other than 0 now take their calls from the broadcast
    std::vector<int> rest;
    for (size_t i = leader ? 1 : 0; i < workers.size(); ++i) rest.push_back(int(i));
    for (int i : rest) {
      RankWorker& w = *workers[size_t(i)];
      std::lock_guard lk(w.m);
      w.job = [this](RankWorker& x) { follow(x); };
      ++w.posted;
      w.cv.notify_all();
    }
  }
}

TpRunner::Impl::~Impl() {
  if (failed.empty() && follower_loops && leader && !workers.empty() && workers[0]->runner) {
    try {
      TpCommand stop;
      stop.op = TpCommand::Op::stop;
      run(
          {0}, [&](RankWorker& w) { send(w, stop); }, "stopping");
    } catch (const std::exception&) {
      // Already reported; the loops were aborted.
    }
  }
  if (!failed.empty()) abort_all();
  for (auto& w : workers) {
    {
      std::lock_guard lk(w->m);
      w->quit = true;
      w->cv.notify_all();
    }
  }
  for (auto& w : workers)
    if (w->thread.joinable()) w->thread.join();
  // Runners (their graphs, caches, weights) go before the communicators they hold pointers to.
  for (auto& w : workers) w->runner.reset();
}

TpRunner::TpRunner(const EngineOptions& eo, const TpRunnerOptions& tp)
    : opts_(tp), impl_(std::make_unique<Impl>()) {
  KILN_CHECK(tp.node_rank == 0, "TpRunner runs on node 0; nodes 1.. run run_tp_follower");
  impl_->opts = tp;
  impl_->start(eo);
  cfg_ = impl_->cfg;
  std::fprintf(stderr, "kiln: tensor parallelism %d (%d rank(s) here, %s all-reduce, %s)\n", tp.tp,
               local_ranks(), impl_->reduce == dist::ReduceType::f32 ? "fp32" : "bf16",
               impl_->group ? "in-process CPU communicator" : "NCCL");
}

TpRunner::~TpRunner() = default;

int TpRunner::local_ranks() const {
  return int(impl_->workers.size());
}
int TpRunner::global_rank(int local) const {
  return impl_->workers.at(size_t(local))->global;
}
Qwen3Runner& TpRunner::rank_runner(int local) {
  return *impl_->workers.at(size_t(local))->runner;
}
Device TpRunner::device() const {
  return impl_->workers[0]->device;
}
int64_t TpRunner::kv_bytes_per_token() const {
  return impl_->workers[0]->runner->kv_bytes_per_token();
}

int64_t TpRunner::kv_memory_budget(double mem_fraction) const {
  // Read-only queries of each rank's device (no collective); remote nodes are taken to be alike.
  int64_t budget = INT64_MAX;
  for (const auto& w : impl_->workers) budget = std::min(budget, w->runner->kv_memory_budget(mem_fraction));
  // CPU ranks share the host's memory: each gets its share of the one budget.
  return device().is_cpu() ? budget / local_ranks() : budget;
}

void TpRunner::allocate_kv(int32_t num_pages, int32_t page_size) {
  TpCommand c;
  c.op = TpCommand::Op::allocate_kv;
  c.a = num_pages;
  c.b = page_size;
  impl_->call(
      c, c.batch, [&](Qwen3Runner& r) { r.allocate_kv(num_pages, page_size); }, "allocating the KV cache");
}

void TpRunner::prepare_graphs(const GraphPlan& plan) {
  TpCommand c;
  c.op = TpCommand::Op::prepare_graphs;
  c.graph = plan;
  impl_->call(
      c, c.batch, [&](Qwen3Runner& r) { r.prepare_graphs(plan); }, "capturing the decode CUDA graphs");
}

int32_t TpRunner::graph_bucket(const BatchDesc& batch) const {
  return impl_->workers[0]->runner->graph_bucket(batch);  // every rank has the same buckets
}

void TpRunner::forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) {
  const TpCommand c = impl_->forward_command(batch, logits != nullptr, hidden != nullptr);
  impl_->call(
      c, batch, [&](Qwen3Runner& r) { r.forward(batch, logits, hidden); }, "a step");
}

bool TpRunner::forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                               std::vector<SampledRow>* out, const std::function<void()>& before_sample) {
  if (!device().is_cuda()) return false;  // the CPU ranks' logits are sampled on the host
  const TpCommand c = impl_->forward_command(batch, true, false);
  impl_->call(
      c, batch,
      [&](Qwen3Runner& r) {
        KILN_CHECK(r.forward_sampled(batch, rows, top_n, out, before_sample),
                   "rank 0 declined device sampling on a GPU");
      },
      "a step");
  return true;
}

void TpRunner::move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  if (!impl_->failed.empty()) throw RunnerFatalError(impl_->failed);
  impl_->workers[0]->runner->check_kv_moves(from, to);  // every rank's cache has rank 0's page grid
  TpCommand c;
  c.op = TpCommand::Op::move_kv;
  c.move_from = from;
  c.move_to = to;
  impl_->call(
      c, c.batch, [&](Qwen3Runner& r) { r.move_kv(from, to); }, "moving KV slots");
}

void TpRunner::release_request(uint64_t request) {
  if (!impl_->failed.empty()) return;  // called while the engine ends every request after a failure
  impl_->run(
      {0}, [&](RankWorker& w) { w.runner->release_request(request); }, "releasing a request");
}

void run_tp_follower(const EngineOptions& eo, const TpRunnerOptions& tp) {
  KILN_CHECK(tp.node_rank > 0, "run_tp_follower is for nodes 1.. (node 0 serves)");
  TpRunner::Impl impl;
  impl.opts = tp;
  impl.start(eo);
  std::fprintf(stderr, "kiln: node %d: %zu tensor-parallel rank(s) loaded, following node 0\n", tp.node_rank,
               impl.workers.size());
  for (auto& w : impl.workers)  // the loops end at the leader's stop, or at a failure (or a lost peer)
    while (!wait_done(impl, *w, Clock::now() + std::chrono::hours(24))) {
    }
  if (impl.failures.load() > 0) {
    impl.failed = impl.root_cause();
    throw Error(impl.failed);
  }
}

std::unique_ptr<ModelRunner> make_tp_runner(const EngineOptions& opts) {
  return std::make_unique<TpRunner>(opts, tp_runner_options(opts));
}

}  // namespace kiln
