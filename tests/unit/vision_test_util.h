// Helpers for the src/vision tests: fixture paths and byte files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kiln::vision_test {

inline std::filesystem::path fixture_dir() {
  return std::filesystem::path(KILN_SOURCE_DIR) / "tests/fixtures/vision";
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace kiln::vision_test
