// Fuzzes the safetensors header parser: any byte string either parses into a header whose every tensor lies
// inside the buffer with the byte size its dtype and shape imply, without overlaps, or is a kiln::Error.
// Anything else (another exception type, a sanitizer report, a trap below) is a bug.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/error.h"
#include "kiln/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::SafetensorsHeader h;
  try {
    h = kiln::parse_safetensors_header(data, size, "fuzz.safetensors");
  } catch (const kiln::Error&) {
    return 0;
  }
  if (h.data_start > size) __builtin_trap();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  uint64_t checksum = 0;
  for (const auto& e : h.tensors) {
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= uint64_t(d);
    if (e.begin > e.end || e.end > size - h.data_start) __builtin_trap();
    if (e.end - e.begin != numel * uint64_t(kiln::dtype_size(e.dtype))) __builtin_trap();
    if (e.shape.size() > size_t(kiln::kMaxDims)) __builtin_trap();
    // Touch the tensor's first and last byte: ASan reports any read outside the input.
    if (e.end > e.begin) checksum += data[h.data_start + e.begin] + data[h.data_start + e.end - 1];
    if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) __builtin_trap();
  return int(checksum & 0);
}
