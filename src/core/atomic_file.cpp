#include "kiln/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/error.h"

namespace kiln {

std::string unique_temp_path(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  // The random part guards against a pid reused by a later process that finds an orphaned temporary.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char tail[64];
  std::snprintf(tail, sizeof tail, ".tmp.%ld.%llu.%08llx", long(::getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return path + tail;
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = unique_temp_path(path);
  try {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) KILN_FAIL(path, ": cannot open ", tmp, " for writing");
    write(f);
    f.flush();
    if (!f) KILN_FAIL(path, ": writing ", tmp, " failed");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    KILN_FAIL(path, ": cannot rename from ", tmp, ": ", ec.message());
  }
}

}  // namespace kiln
