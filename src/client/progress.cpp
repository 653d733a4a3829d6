#include "client/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kiln::client {

Progress::Progress(std::string label, size_t total)
    : label_(std::move(label)),
      total_(total),
      enabled_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  std::lock_guard<std::mutex> lock(mu_);
  draw(true);
}

Progress::~Progress() {
  finish();
}

void Progress::tick(bool failed) {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  if (failed) ++failed_;
  draw(done_ == total_);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  draw(true);
  if (enabled_) std::fputc('\n', stderr);
}

void Progress::draw(bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = total_ ? int(double(done_) / double(total_) * kWidth) : kWidth;
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '.');
  const double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%-14s [%s] %zu/%zu  %.1f s", label_.c_str(), bar.c_str(), done_, total_, secs);
  if (failed_) std::fprintf(stderr, "  (%zu failed)", failed_);
  std::fflush(stderr);
}

}  // namespace kiln::client
