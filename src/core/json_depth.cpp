#include "kiln/json_depth.h"

#include <string>

#include "kiln/error.h"

namespace kiln {

size_t json_nesting_depth(std::string_view text, size_t stop_after) {
  size_t depth = 0, deepest = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '"') {  // skip the string: a backslash escapes the next byte, whatever it is
      for (++i; i < n && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stop_after) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_json_depth(std::string_view text, const char* what, size_t limit) {
  if (json_nesting_depth(text, limit) > limit)
    throw Error(std::string(what) + " nests deeper than " + std::to_string(limit) +
                " levels (kiln's limit for JSON inputs)");
}

}  // namespace kiln
