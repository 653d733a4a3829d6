// Shared by the engine tests: a thread-safe event sink and small request/option builders.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/engine.h"

namespace kiln::test {

inline std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = (i * 5 + salt * 11) % 60;
  return v;
}

// Collects events per request; waits for finishes.
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<TokenEvent>> events;
  int finished = 0;
  std::function<void(const TokenEvent&)> cb() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lk(mu);
      events[e.id].push_back(e);
      if (e.finished) ++finished;
      cv.notify_all();
    };
  }
  void wait_finished(int n) {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return finished >= n; }))
        << finished << " of " << n;
  }
  std::vector<int32_t> tokens(RequestId id) {
    std::lock_guard<std::mutex> lk(mu);
    std::vector<int32_t> out;
    for (const auto& e : events[id]) out.insert(out.end(), e.ids.begin(), e.ids.end());
    return out;
  }
  TokenEvent last(RequestId id) {
    std::lock_guard<std::mutex> lk(mu);
    return events[id].back();
  }
  void expect_one_finish_each() {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [id, evs] : events) {
      int n = 0;
      for (auto& e : evs) n += e.finished;
      EXPECT_EQ(n, 1) << "request " << id;
      EXPECT_TRUE(evs.back().finished) << "request " << id << ": events after the finish";
    }
  }
};

inline EngineOptions small_opts(int64_t tokens, int page_size = 4, int chunk = 16) {
  EngineOptions o;
  o.page_size = page_size;
  o.max_total_tokens = tokens;
  o.chunked_prefill_size = chunk;
  return o;
}

inline Request greedy(std::vector<int32_t> prompt, int n) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_new_tokens = n;
  return r;
}

// Submits every request, waits until all have finished, and returns each one's tokens and final event.
struct Finished {
  std::vector<int32_t> tokens;
  TokenEvent last;
};
inline std::vector<Finished> run_requests(Engine& e, const std::vector<Request>& requests) {
  Sink sink;
  std::vector<RequestId> ids;
  for (const Request& r : requests) ids.push_back(e.submit(r, sink.cb()));
  sink.wait_finished(int(ids.size()));
  sink.expect_one_finish_each();
  std::vector<Finished> out;
  for (RequestId id : ids) out.push_back({sink.tokens(id), sink.last(id)});
  return out;
}

inline void expect_pool_clean(Engine& e) {
  e.flush_cache();
  EngineStats s = e.stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.kv_pages_cached, 0);
  EXPECT_EQ(s.kv_pages_free, s.kv_pages_total);
}

}  // namespace kiln::test
