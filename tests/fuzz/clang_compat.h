// Force-included into the clang++ fuzz builds only. clang 14 (Debian 12's) lacks __builtin_source_location,
// so libstdc++ 12's <source_location> declares nothing; kiln/error.h needs std::source_location::current(),
// file_name() and line(). This supplies them from clang's older builtins. Never part of the main (g++) build.
#pragma once
#include <cstdint>
#include <source_location>

#if defined(__clang__) && !defined(__cpp_lib_source_location)
namespace std {
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           const char* func = __builtin_FUNCTION(),
                                           uint_least32_t line = __builtin_LINE(),
                                           uint_least32_t column = __builtin_COLUMN()) noexcept {
    source_location s;
    s.file_ = file;
    s.func_ = func;
    s.line_ = line;
    s.column_ = column;
    return s;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return func_; }
  constexpr uint_least32_t line() const noexcept { return line_; }
  constexpr uint_least32_t column() const noexcept { return column_; }

 private:
  const char* file_ = "";
  const char* func_ = "";
  uint_least32_t line_ = 0;
  uint_least32_t column_ = 0;
};
}  // namespace std
#endif
