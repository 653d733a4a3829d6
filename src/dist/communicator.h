// Tensor-parallel collectives (issue 14): what a sharded model calls after its row-parallel projections (O
// and down) and what the engine uses to hand every rank the step's batch. Two implementations:
//   LocalGroup (local_comm.h): the ranks are threads of one process over host memory; the CPU backend's
//     TP, what CI runs at TP = 2 and 4.
//   NcclComm (nccl_comm.h): one GPU per rank, ncclAllReduce on the rank's stream (capturable in graphs).
// Every rank must call the same collectives in the same order (lockstep), as with NCCL.
#pragma once

#include <cstddef>
#include <string>

namespace kiln::dist {

enum class ReduceType { f32, bf16 };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data (count elements) becomes the sum over ranks, the same bits on every rank. Host memory for
  // LocalGroup; device memory enqueued on `stream` (a cudaStream_t) for NCCL.
  virtual void all_reduce_sum(void* data, size_t count, ReduceType type, void* stream = nullptr) = 0;
  // root's `bytes` at data copied to every rank's data.
  virtual void broadcast(void* data, size_t bytes, int root, void* stream = nullptr) = 0;
  // Rank r's `bytes` at send land at recv + r * bytes on every rank (recv: size() * bytes; send may be
  // recv + rank() * bytes, in place). Same memory rules as all_reduce_sum.
  virtual void all_gather(const void* send, void* recv, size_t bytes, void* stream = nullptr) = 0;
  // Gives up on the group: every rank blocked in (or later entering) a collective fails instead of waiting
  // for a rank that will not come (LocalGroup: throws; NCCL: ncclCommAbort). Callable from any thread.
  virtual void abort() = 0;
  // An error the group hit outside any call (NCCL: ncclCommGetAsyncError, e.g. a peer process that died),
  // or "" when there is none. Callable from any thread; a watchdog polls it.
  virtual std::string async_error() { return {}; }
};

}  // namespace kiln::dist
