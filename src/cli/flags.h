// A small flag parser for subcommands: --name VALUE, --name=VALUE, boolean --name. Unknown flags,
// missing values and unparsable numbers are errors that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "cli/command.h"

namespace kiln::cli {

// Thrown by Flags when the arguments hold --help or -h and the command does not take --help itself: main()
// prints the command's summary and the flags named here, and exits 0.
struct HelpRequested {
  std::set<std::string> value_flags, bool_flags;
};

class Flags {
 public:
  // value_flags take a value; bool_flags do not. Anything else is rejected.
  Flags(const Args& args, std::set<std::string> value_flags, std::set<std::string> bool_flags = {});
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& def = "") const;
  std::string required(const std::string& name) const;
  int64_t i64(const std::string& name, int64_t def) const;
  double f64(const std::string& name, double def) const;
  bool flag(const std::string& name) const { return has(name); }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace kiln::cli
