// Environment switches: the A/B knobs kiln reads from the environment (each one's default and meaning where
// it is read; docs list them). One reader so every switch takes the same values and refuses the same way.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kiln/error.h"

namespace kiln {

// NAME=0 or NAME=1; unset or empty: `fallback`. Any other value is an error naming the switch.
inline bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::string_view s(v);
  KILN_CHECK(s == "0" || s == "1", name, " must be 0 or 1, got '", v, "'");
  return s == "1";
}

// NAME=a number; unset or empty: `fallback`. Anything that is not a whole number is an error naming it.
inline double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  KILN_CHECK(end != v && *end == '\0', name, " must be a number, got '", v, "'");
  return x;
}

// NAME=a whole number in [min, 2^40]; unset or empty: `fallback`. Anything else is an error naming it, with
// `meaning` (e.g. " (0: never)") after the bound.
inline int64_t env_count(const char* name, int64_t min, int64_t fallback, const char* meaning = "") {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  KILN_CHECK(end != v && *end == '\0' && n >= min && n <= (1ll << 40), name,
             " must be a whole number >= ", min, meaning, ", got '", v, "'");
  return int64_t(n);
}

}  // namespace kiln
