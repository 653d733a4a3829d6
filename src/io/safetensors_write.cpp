// write_safetensors: the writer used by `kiln demo-model` and the tests.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/atomic_file.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"

namespace kiln {

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") KILN_FAIL(path, ": \"__metadata__\" is reserved, not a tensor name");
    if (!seen.insert(t.name).second) KILN_FAIL(path, ": duplicate tensor name '", t.name, "'");
    if (!t.tensor.device.is_cpu())
      KILN_FAIL(path, ": tensor '", t.name, "' is on ", device_name(t.tensor.device));
    if (!t.tensor.is_contiguous()) KILN_FAIL(path, ": tensor '", t.name, "' is not contiguous");
    if (t.tensor.numel() > 0 && !t.tensor.data) KILN_FAIL(path, ": tensor '", t.name, "' has no data");
  }
  // Largest element first: with no gaps between tensors, every offset is then a multiple of its element size.
  std::vector<const NamedTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    const int sa = dtype_size(a->tensor.dtype), sb = dtype_size(b->tensor.dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    std::vector<int64_t> shape(t->tensor.shape.begin(), t->tensor.shape.begin() + t->tensor.ndim);
    const uint64_t bytes = uint64_t(t->tensor.nbytes());
    header[t->name] = {{"dtype", safetensors_dtype_name(t->tensor.dtype)},
                       {"shape", shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned

  write_file_atomically(path, [&](std::ostream& f) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(text.data(), std::streamsize(text.size()));
    for (const NamedTensor* t : order)
      if (t->tensor.nbytes() > 0)
        f.write(static_cast<const char*>(t->tensor.data), std::streamsize(t->tensor.nbytes()));
  });
}

}  // namespace kiln
