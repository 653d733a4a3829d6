// Writing a file so that readers never see half of it and concurrent writers never collide: the bytes go
// to a temporary file in the same folder (same file system, so the rename is atomic), named uniquely per
// process and per call, then renamed over the target.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace kiln {

// PATH.tmp.<pid>.<counter>.<random>: distinct for every call in every process.
std::string unique_temp_path(const std::string& path);

// Calls write(stream) on a unique temporary sibling of path, then renames it over path. On any failure
// (open, write, a throwing writer, rename) the temporary file is removed and kiln::Error names the path;
// path itself is then untouched.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace kiln
