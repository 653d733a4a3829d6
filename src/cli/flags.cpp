#include "cli/flags.h"

#include <cmath>
#include <cstdlib>

#include "kiln/error.h"

namespace kiln::cli {

Flags::Flags(const Args& args, std::set<std::string> value_flags, std::set<std::string> bool_flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "--help" || a == "-h") && !bool_flags.count("help"))
      throw HelpRequested{value_flags, bool_flags};
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (bool_flags.count(name)) {
      KILN_CHECK(!inline_value, "flag --", name, " takes no value");
      values_[name] = "1";
    } else if (value_flags.count(name)) {
      if (!inline_value) {
        KILN_CHECK(i + 1 < args.size(), "flag --", name, " needs a value");
        value = args[++i];
      }
      values_[name] = value;
    } else {
      KILN_FAIL("unknown flag --", name);
    }
  }
}

std::string Flags::str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

std::string Flags::required(const std::string& name) const {
  auto it = values_.find(name);
  KILN_CHECK(it != values_.end(), "missing required flag --", name);
  return it->second;
}

int64_t Flags::i64(const std::string& name, int64_t def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  KILN_CHECK(errno == 0 && end && *end == '\0' && !it->second.empty(), "flag --", name,
             " needs an integer, got '", it->second, "'");
  return v;
}

double Flags::f64(const std::string& name, double def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  KILN_CHECK(end && *end == '\0' && !it->second.empty() && std::isfinite(v), "flag --", name,
             " needs a finite number, got '", it->second, "'");
  return v;
}

}  // namespace kiln::cli
