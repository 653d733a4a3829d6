// Safetensors checkpoints: an mmap reader (one file or a sharded model.safetensors.index.json) and a writer.
//
// File layout (https://huggingface.co/docs/safetensors): u64 little-endian N, then N bytes of JSON
//   {"__metadata__": {str: str}, NAME: {"dtype": "BF16", "shape": [d0, ...], "data_offsets": [begin, end]},
//   ...}
// then the data buffer; offsets are relative to its start, row-major, little-endian.
//
// Every malformed input is a kiln::Error naming the file (and the tensor where there is one): truncated file,
// header length past the end, non-JSON or non-object header, a field of the wrong type, unknown dtype,
// offsets out of range, overlapping tensors, byte size != numel x dtype size, more than kMaxDims dims,
// a missing tensor, or a dtype/shape other than the caller expected. Gaps between tensors are allowed.
//
// Views returned by Checkpoint::get point into a private (copy-on-write) mapping: writing through them never
// changes the file, and they stay valid while the Checkpoint (or a move of it) lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/tensor.h"

namespace kiln {

// "BF16" <-> DType::bf16 and so on for BF16 F16 F32 F64 F8_E4M3 I8 I16 I32 I64 U8 U16 U32 U64 BOOL.
// parse throws (naming the string) on anything else, e.g. F8_E5M2.
DType safetensors_dtype_from_string(const std::string& s);
const char* safetensors_dtype_name(DType t);

struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer, [begin, end)
  int file = 0;                 // index into Checkpoint::files()
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length: where the data buffer begins in the file
};

// Parses and validates the header of an in-memory safetensors file of `size` bytes (the whole file, so that
// offsets can be checked against the data buffer). `source` names the file in errors. The fuzz target.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& source);

class Checkpoint {
 public:
  // DIR holding model.safetensors.index.json (sharded) or model.safetensors, or any single *.safetensors
  // file (DIR may also name a .safetensors file directly).
  static Checkpoint open(const std::string& dir);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  bool has(const std::string& name) const;
  // Host view into the mapping, with the file's dtype and shape.
  Tensor get(const std::string& name) const;
  // Same, checked: throws naming the tensor and file unless dtype and shape match exactly.
  Tensor get(const std::string& name, DType expected, std::initializer_list<int64_t> shape) const;
  const TensorEntry& entry(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::vector<std::string>& files() const;
  const std::map<std::string, std::string>& metadata() const;  // of the first file, plus index "metadata"
  size_t size() const;

 private:
  struct Impl;
  explicit Checkpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // host, contiguous
};

// Writes a safetensors file (atomically: PATH.tmp, then rename). Tensors are laid out largest element size
// first, so every tensor's offset is aligned to its element size; the header is space-padded to 8 bytes.
// Throws on duplicate names, non-host or non-contiguous tensors, or an I/O failure.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln
