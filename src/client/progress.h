// A one-line progress bar on stderr, drawn only when stderr is a terminal (logs and CI stay clean).
// Thread-safe: workers call tick() as requests finish.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

namespace kiln::client {

class Progress {
 public:
  Progress(std::string label, size_t total);
  ~Progress();
  void tick(bool failed);
  void finish();  // final redraw and newline; idempotent

 private:
  void draw(bool force);

  std::string label_;
  size_t total_, done_ = 0, failed_ = 0;
  bool enabled_, finished_ = false;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kiln::client
