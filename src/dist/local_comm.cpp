#include "dist/local_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln::dist {

// The rendezvous of one collective: each rank publishes its buffer, waits for all (barrier), works on its
// slice, waits again. A generation counter makes the barrier reusable.
struct LocalGroup::Shared {
  explicit Shared(int n) : n(n), bufs(size_t(n), nullptr), fail_at(size_t(n), -1) {}
  const int n;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<void*> bufs;
  std::vector<float> scratch;    // the reduced values, before every rank copies them back
  std::vector<int64_t> fail_at;  // per rank: the index of the collective that throws; -1: none
  std::vector<std::unique_ptr<Communicator>> ranks;

  void wait() {
    std::unique_lock lk(m);
    KILN_CHECK(!aborted, "tensor-parallel group aborted by another rank");
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (generation != gen) return;  // the barrier completed before any abort
    KILN_FAIL("tensor-parallel group aborted by another rank");
  }
};

namespace {

float load(const void* p, size_t i, ReduceType t) {
  return t == ReduceType::f32 ? static_cast<const float*>(p)[i]
                              : bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
}
void store(void* p, size_t i, float v, ReduceType t) {
  if (t == ReduceType::f32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16_t*>(p)[i] = f32_to_bf16(v);
}

}  // namespace

class LocalGroup::Rank final : public Communicator {
 public:
  Rank(Shared* s, int r) : s_(s), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return s_->n; }

  void all_reduce_sum(void* data, size_t count, ReduceType type, void* /*stream*/) override {
    enter("all-reduce");
    publish(data);
    if (r_ == 0) {
      std::lock_guard lk(s_->m);
      s_->scratch.resize(count);
    }
    s_->wait();
    // Rank r reduces elements [lo, hi), in rank order.
    const size_t per = (count + size_t(s_->n) - 1) / size_t(s_->n);
    const size_t lo = std::min(count, per * size_t(r_)), hi = std::min(count, lo + per);
    for (size_t i = lo; i < hi; ++i) {
      float acc = 0.0f;
      for (int q = 0; q < s_->n; ++q) acc += load(s_->bufs[size_t(q)], i, type);
      s_->scratch[i] = acc;
    }
    s_->wait();
    for (size_t i = 0; i < count; ++i) store(data, i, s_->scratch[i], type);
    s_->wait();  // scratch and bufs may be reused by the next collective
  }

  void broadcast(void* data, size_t bytes, int root, void* /*stream*/) override {
    KILN_CHECK(root >= 0 && root < s_->n, "broadcast root ", root, " out of range (", s_->n, " ranks)");
    enter("broadcast");
    publish(data);
    s_->wait();
    if (r_ != root) std::memcpy(data, s_->bufs[size_t(root)], bytes);
    s_->wait();
  }

  void all_gather(const void* send, void* recv, size_t bytes, void* /*stream*/) override {
    enter("all-gather");
    publish(const_cast<void*>(send));
    s_->wait();
    // In place (send == recv + rank * bytes) only this rank's own block is both read and written.
    for (int q = 0; q < s_->n; ++q) {
      char* dst = static_cast<char*>(recv) + size_t(q) * bytes;
      if (dst != s_->bufs[size_t(q)]) std::memmove(dst, s_->bufs[size_t(q)], bytes);
    }
    s_->wait();
  }

  void abort() override {
    std::lock_guard lk(s_->m);
    s_->aborted = true;
    s_->cv.notify_all();
  }

 private:
  // Counts this rank's collectives; throws at the injected one (fail_at) or once the group is aborted.
  void enter(const char* what) {
    std::lock_guard lk(s_->m);
    if (s_->aborted) KILN_FAIL("tensor-parallel group aborted by another rank");
    const int64_t k = int64_t(calls_++);
    if (k == s_->fail_at[size_t(r_)]) KILN_FAIL("injected failure: rank ", r_, " ", what, " #", k);
  }
  void publish(void* data) {
    std::lock_guard lk(s_->m);
    s_->bufs[size_t(r_)] = data;
  }
  Shared* s_;
  int r_;
  uint64_t calls_ = 0;
};

LocalGroup::LocalGroup(int size) {
  KILN_CHECK(size >= 1 && size <= 64, "tensor-parallel size must be in [1, 64], got ", size);
  shared_ = std::make_unique<Shared>(size);
  for (int r = 0; r < size; ++r) shared_->ranks.push_back(std::make_unique<Rank>(shared_.get(), r));
}

LocalGroup::~LocalGroup() = default;

int LocalGroup::size() const {
  return shared_->n;
}

Communicator& LocalGroup::comm(int rank) {
  KILN_CHECK(rank >= 0 && rank < shared_->n, "rank ", rank, " out of range (", shared_->n, " ranks)");
  return *shared_->ranks[size_t(rank)];
}

void LocalGroup::abort() {
  shared_->ranks[0]->abort();
}

bool LocalGroup::aborted() const {
  std::lock_guard lk(shared_->m);
  return shared_->aborted;
}

void LocalGroup::fail_at(int rank, uint64_t collective) {
  KILN_CHECK(rank >= 0 && rank < shared_->n, "fail_at: rank ", rank, " out of range (", shared_->n,
             " ranks)");
  std::lock_guard lk(shared_->m);
  shared_->fail_at[size_t(rank)] = int64_t(collective);
}

}  // namespace kiln::dist
