// Helpers shared by the unit and GPU tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln::test_support {

// n bf16 values drawn uniformly from [lo, hi) by a seeded generator.
inline std::vector<bf16_t> random_bf16(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<bf16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

// A writable folder of this process alone: ctest runs every TEST as its own process, so any path two TESTs
// of one binary (or two binaries) could write at once must carry the pid. Created on first use, removed
// with everything in it when the process exits normally.
inline std::filesystem::path process_scratch_dir(const std::string& tag) {
  struct Registry {
    std::mutex m;
    std::set<std::filesystem::path> dirs;
    ~Registry() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Registry reg;
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("kiln_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  const std::lock_guard<std::mutex> lock(reg.m);
  reg.dirs.insert(d);
  return d;
}

// The message of the kiln::Error f throws, or a marker that none was thrown.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no kiln::Error thrown>";
}

inline void expect_contains(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// Log-softmax in fp64 of n logits (the reference side of every log-prob comparison).
inline std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = -1e300, sum = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - mx - std::log(sum);
  return out;
}

}  // namespace kiln::test_support
