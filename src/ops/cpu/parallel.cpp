#include "ops/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::ops::cpu {
namespace {

thread_local bool t_in_pool = false;

// Workers wait for a job; a job is a chunked range that every worker (and the caller) pulls from.
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  void run(int64_t chunks, const std::function<void(int64_t)>& body) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one job at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      body_ = &body;
      chunks_ = chunks;
      next_.store(0);
      done_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work(body, chunks);
    // Wait for every chunk and for every worker that joined this job to leave it, so no worker can
    // carry this job's body into the next one.
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_ == chunks_ && active_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    t_in_pool = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* body = nullptr;
      int64_t chunks = 0;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (!body_) continue;  // that job already ended
        body = body_;
        chunks = chunks_;
        ++active_;
      }
      work(*body, chunks);
      std::lock_guard<std::mutex> lk(mu_);
      --active_;
      done_cv_.notify_all();
    }
  }
  void work(const std::function<void(int64_t)>& body, int64_t chunks) {
    const bool was_in_pool = t_in_pool;
    t_in_pool = true;
    int64_t finished = 0;
    for (;;) {
      const int64_t c = next_.fetch_add(1);
      if (c >= chunks) break;
      try {
        body(c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      ++finished;
    }
    t_in_pool = was_in_pool;
    if (finished) {
      std::lock_guard<std::mutex> lk(mu_);
      done_ += finished;
      done_cv_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t chunks_ = 0, done_ = 0;
  int active_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

int configured_threads() {
  if (const char* e = std::getenv("KILN_NUM_THREADS")) {
    const int n = std::atoi(e);
    if (n > 0) return std::min(n, 256);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}

}  // namespace

int num_threads() {
  return pool().size();
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || t_in_pool || pool().size() == 1) {
    fn(0, n);
    return;
  }
  pool().run(chunks, [&](int64_t c) { fn(c * grain, std::min(n, (c + 1) * grain)); });
}

}  // namespace kiln::ops::cpu
