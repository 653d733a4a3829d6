// kiln errors: one exception type carrying where the check failed, and check macros that print both
// sides of a failed comparison. Bad input is reported through these and never crashes the process.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void throw_error(const std::string& msg,
                              std::source_location loc = std::source_location::current());

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, "message parts", value, ...): throws kiln::Error with the parts concatenated.
#define KILN_CHECK(cond, ...)                                                                              \
  do {                                                                                                     \
    if (!(cond))                                                                                           \
      ::kiln::throw_error(::kiln::detail::concat("check failed: " #cond ": " __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define KILN_CHECK_OP_(a, b, op, ...)                                                                      \
  do {                                                                                                     \
    const auto& kiln_a_ = (a);                                                                             \
    const auto& kiln_b_ = (b);                                                                             \
    if (!(kiln_a_ op kiln_b_))                                                                             \
      ::kiln::throw_error(::kiln::detail::concat("check failed: " #a " " #op " " #b " (", kiln_a_, " vs ", \
                                                 kiln_b_, ") " __VA_OPT__(, ) __VA_ARGS__));               \
  } while (0)
#define KILN_CHECK_EQ(a, b, ...) KILN_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define KILN_CHECK_NE(a, b, ...) KILN_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define KILN_CHECK_LT(a, b, ...) KILN_CHECK_OP_(a, b, <, __VA_ARGS__)
#define KILN_CHECK_LE(a, b, ...) KILN_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define KILN_CHECK_GT(a, b, ...) KILN_CHECK_OP_(a, b, >, __VA_ARGS__)
#define KILN_CHECK_GE(a, b, ...) KILN_CHECK_OP_(a, b, >=, __VA_ARGS__)
#define KILN_FAIL(...) ::kiln::throw_error(::kiln::detail::concat(__VA_ARGS__))
