// LocalGroup: n ranks as threads of one process, collectives over host memory (the CPU backend's tensor
// parallelism; see communicator.h). The sum is deterministic and identical on every rank: each element is
// accumulated in fp32 over ranks 0, 1, ..., n - 1 and rounded once (bf16: round to nearest even), whatever
// the thread timing. A rank that fails calls abort(): every rank blocked in (or later entering) a collective
// of the group then throws instead of waiting forever. fail_at injects a failure (the tests of a rank that
// fails in a step): that rank's n-th collective (0-based, counted over all kinds) throws instead of running.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace kiln::dist {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  int size() const;
  Communicator& comm(int rank);  // rank's communicator; use it from that rank's thread only
  void abort();
  bool aborted() const;
  void fail_at(int rank, uint64_t collective);

 private:
  struct Shared;
  class Rank;
  std::unique_ptr<Shared> shared_;
};

}  // namespace kiln::dist
