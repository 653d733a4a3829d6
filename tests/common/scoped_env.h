// ScopedEnv: an environment variable set or unset for a scope, for switches a test reads where they are read
// (a model's load, a runner's setup).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace kiln::test_support {

// Sets `name` to `value` (nullptr: unsets it) for the scope; its earlier value, or its absence, comes back
// after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* e = std::getenv(name)) before_ = e;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (before_) {
      setenv(name_.c_str(), before_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> before_;
};

}  // namespace kiln::test_support
