// Runs the built `kiln` binary as a user would: a subprocess with captured stdout, stderr and exit code.
// Tests that include this get KILN_BINARY_DIR from kiln_test() in cmake/kiln.cmake.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::test_support {

struct KilnResult {
  int code = -1;
  std::string out, err;
};

// $KILN_BIN when set (a binary elsewhere, for manual runs), else the one this build made.
inline std::string kiln_bin() {
  if (const char* e = std::getenv("KILN_BIN"); e && *e) return e;
  return std::string(KILN_BINARY_DIR) + "/bin/kiln";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `kiln ARGS` (arguments single-quoted for the shell); stdout/stderr go through files in scratch_dir.
inline KilnResult run_kiln(const std::vector<std::string>& args, const std::filesystem::path& scratch_dir) {
  std::string cmd = "'" + kiln_bin() + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  const std::filesystem::path out = scratch_dir / "stdout.txt", err = scratch_dir / "stderr.txt";
  cmd += " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  KilnResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace kiln::test_support
