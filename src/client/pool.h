// Runs fn(http, i) for i in [0, n) on `workers` threads, each with its own keep-alive connection.
// Exceptions thrown by fn are rethrown (the first one) after all workers stop.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "client/http.h"

namespace kiln::client {

template <typename Fn>
void parallel_requests(const std::string& base_url, double timeout_s, const std::string& api_key, size_t n,
                       int workers, Fn&& fn) {
  std::atomic<size_t> next{0};
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> threads;
  const size_t count = std::min<size_t>(n, size_t(std::max(1, workers)));
  for (size_t w = 0; w < count; ++w) {
    threads.emplace_back([&] {
      try {
        HttpClient http(base_url, timeout_s, api_key);
        for (size_t i = next++; i < n; i = next++) fn(http, i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
        next = n;  // stop the other workers early
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace kiln::client
