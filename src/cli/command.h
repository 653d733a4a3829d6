// Subcommand registry: each cmd_*.cpp registers one subcommand with KILN_COMMAND; main() dispatches.
// Errors thrown by a command become one clear line on stderr and exit code 1.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kiln::cli {

using Args = std::vector<std::string>;  // arguments after the subcommand name

struct Command {
  std::string name;  // "generate", "bench serve" (multi-word names take the words that follow)
  std::string summary;
  std::function<int(const Args&)> run;
};

bool register_command(Command c);
const std::vector<Command>& commands();

}  // namespace kiln::cli

#define KILN_CONCAT2_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT2_(a, b)
#define KILN_COMMAND(name, summary, fn)                            \
  static const bool KILN_CONCAT_(kiln_cmd_registered_, __LINE__) = \
      ::kiln::cli::register_command({name, summary, fn})
