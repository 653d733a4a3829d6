#include "kiln/error.h"

#include <cstring>

namespace kiln {

void throw_error(const std::string& msg, std::source_location loc) {
  const char* file = loc.file_name();
  // Keep the path short: from "src/" or "include/" on.
  for (const char* key : {"/src/", "/include/", "/tests/", "/bench/"}) {
    if (const char* p = std::strstr(file, key)) {
      file = p + 1;
      break;
    }
  }
  throw Error(msg + " [" + file + ":" + std::to_string(loc.line()) + "]");
}

}  // namespace kiln
