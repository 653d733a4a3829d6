// A bound on how deeply a JSON text nests, checked on the raw text before it is parsed. nlohmann's parser is
// iterative, but dumping, copying, comparing and converting a parsed value recurse once per level (as do the
// template values built from it), so a request nested 100,000 deep would overflow the stack in one of them.
// Every JSON text that comes from a client or stdin is checked here first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

// The limit for requests and CLI inputs: far above any real request (a chat request with tool schemas nests
// about 10 levels), far below what the recursive walks can take on a worker thread's stack.
inline constexpr size_t kMaxJsonDepth = 128;

// The deepest nesting of arrays and objects in `text` (0 for a scalar). Brackets inside strings are skipped
// (escapes honoured), so the result is exact for valid JSON; for invalid JSON it is some count that the
// parser's own error makes moot. Stops counting once past `stop_after` (the scan is linear either way).
size_t json_nesting_depth(std::string_view text, size_t stop_after = SIZE_MAX);

// Throws kiln::Error "<what> nests deeper than <limit> levels (kiln's limit for JSON inputs)" when it does.
void check_json_depth(std::string_view text, const char* what, size_t limit = kMaxJsonDepth);

}  // namespace kiln
