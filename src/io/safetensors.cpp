// Safetensors header parsing (the fuzzed surface) and the mmap-backed Checkpoint.
#include "kiln/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "kiln/error.h"

namespace kiln {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The reference implementation refuses headers above 100 MB; so do we (a 235B checkpoint's is ~2 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"BF16", DType::bf16},      {"F16", DType::f16},    {"F32", DType::f32}, {"F64", DType::f64},
    {"F8_E4M3", DType::f8e4m3}, {"I8", DType::i8},      {"I16", DType::i16}, {"I32", DType::i32},
    {"I64", DType::i64},        {"U8", DType::u8},      {"U16", DType::u16}, {"U32", DType::u32},
    {"U64", DType::u64},        {"BOOL", DType::bool_},
};

bool lookup_dtype(const std::string& s, DType* out) {
  for (const auto& d : kDTypes)
    if (s == d.name) {
      *out = d.dtype;
      return true;
    }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// A non-negative JSON integer that fits int64, or an error naming what it is.
uint64_t json_u64(const json& v, const std::string& what, const std::string& where) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    KILN_FAIL(where, ": ", what, " must be a non-negative integer, got ", v.dump());
  return v.get<uint64_t>();
}

TensorEntry parse_entry(const std::string& name, const json& v, uint64_t data_size,
                        const std::string& source) {
  const std::string where = source + ": tensor '" + name + "'";
  if (!v.is_object()) KILN_FAIL(where, ": entry must be an object, got ", v.type_name());
  TensorEntry e;
  e.name = name;
  const auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) KILN_FAIL(where, ": missing or non-string \"dtype\"");
  if (!lookup_dtype(dt->get<std::string>(), &e.dtype))
    KILN_FAIL(where, ": unsupported safetensors dtype ", dt->dump());
  const auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) KILN_FAIL(where, ": missing or non-array \"shape\"");
  if (sh->size() > size_t(kMaxDims))
    KILN_FAIL(where, ": ", sh->size(), " dims; kiln supports at most ", kMaxDims);
  uint64_t numel = 1;
  for (const json& d : *sh) {
    const uint64_t n = json_u64(d, "each shape entry", where);
    e.shape.push_back(int64_t(n));
    if (__builtin_mul_overflow(numel, n, &numel)) KILN_FAIL(where, ": shape ", sh->dump(), " overflows");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes))
    KILN_FAIL(where, ": shape ", sh->dump(), " overflows");
  const auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2)
    KILN_FAIL(where, ": \"data_offsets\" must be [begin, end]");
  e.begin = json_u64((*off)[0], "data_offsets[0]", where);
  e.end = json_u64((*off)[1], "data_offsets[1]", where);
  if (e.begin > e.end) KILN_FAIL(where, ": data_offsets [", e.begin, ", ", e.end, "] run backwards");
  if (e.end > data_size)
    KILN_FAIL(where, ": data_offsets [", e.begin, ", ", e.end, "] out of range: the data buffer has ",
              data_size, " bytes (truncated file?)");
  if (e.end - e.begin != nbytes)
    KILN_FAIL(where, ": ", e.end - e.begin, " bytes at data_offsets, but ", safetensors_dtype_name(e.dtype),
              shape_str(e.shape), " needs ", nbytes);
  return e;
}

struct MappedFile {
  std::string path;
  void* base = nullptr;
  size_t size = 0;

  explicit MappedFile(const std::string& p) : path(p) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) KILN_FAIL(p, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      KILN_FAIL(p, ": cannot stat: ", std::strerror(err));
    }
    size = size_t(st.st_size);
    if (size > 0) {
      // Read-only: the views we hand out are inputs, and a writable private mapping would charge the whole
      // checkpoint to the commit limit.
      base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (base == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        base = nullptr;
        KILN_FAIL(p, ": mmap of ", size, " bytes failed: ", std::strerror(err));
      }
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (base) ::munmap(base, size);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
};

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) KILN_FAIL(path, ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

DType safetensors_dtype_from_string(const std::string& s) {
  DType t{};
  if (lookup_dtype(s, &t)) return t;
  KILN_FAIL("unsupported safetensors dtype \"", s, "\"");
}

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (t == d.dtype) return d.name;
  return "?";
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& source) {
  if (size < 8) KILN_FAIL(source, ": truncated: ", size, " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
  if (n > size - 8)
    KILN_FAIL(source, ": header length ", n, " runs past the end of the file (", size,
              " bytes): truncated or not safetensors");
  if (n > kMaxHeaderBytes)
    KILN_FAIL(source, ": header length ", n, " exceeds the ", kMaxHeaderBytes, "-byte limit");
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + n);
  } catch (const json::exception& e) {
    KILN_FAIL(source, ": header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) KILN_FAIL(source, ": header must be a JSON object, got ", header.type_name());

  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = size - h.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) KILN_FAIL(source, ": __metadata__ must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          KILN_FAIL(source, ": __metadata__[\"", mk, "\"] must be a string, got ", mv.dump());
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, data_size, source));
  }
  // Overlap: sort the non-empty byte ranges; each must start at or after the previous one's end.
  std::vector<const TensorEntry*> order;
  for (const auto& e : h.tensors)
    if (e.end > e.begin) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      KILN_FAIL(source, ": tensors '", order[i - 1]->name, "' [", order[i - 1]->begin, ", ",
                order[i - 1]->end, ") and '", order[i]->name, "' [", order[i]->begin, ", ", order[i]->end,
                ") overlap");
  return h;
}

struct Checkpoint::Impl {
  std::string source;  // what open() was given
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<std::string> files;
  std::vector<uint64_t> data_start;
  std::unordered_map<std::string, TensorEntry> entries;
  std::map<std::string, std::string> metadata;

  int add_file(const std::string& path) {
    auto m = std::make_unique<MappedFile>(path);
    SafetensorsHeader h = parse_safetensors_header(static_cast<const uint8_t*>(m->base), m->size, path);
    const int index = int(files.size());
    for (auto& e : h.tensors) {
      e.file = index;
      auto it = entries.find(e.name);
      if (it != entries.end())
        KILN_FAIL(path, ": tensor '", e.name, "' also appears in ", files[size_t(it->second.file)]);
      entries.emplace(e.name, std::move(e));
    }
    if (maps.empty()) metadata = std::move(h.metadata);
    maps.push_back(std::move(m));
    files.push_back(path);
    data_start.push_back(h.data_start);
    return index;
  }

  void add_index(const std::string& dir, const std::string& index_path) {
    json index;
    try {
      index = json::parse(read_text_file(index_path));
    } catch (const json::exception& e) {
      KILN_FAIL(index_path, ": not valid JSON: ", e.what());
    }
    const auto wm = index.is_object() ? index.find("weight_map") : index.end();
    if (wm == index.end() || !wm->is_object()) KILN_FAIL(index_path, ": missing \"weight_map\" object");
    std::set<std::string> shard_names;
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string()) KILN_FAIL(index_path, ": weight_map[\"", name, "\"] must be a file name");
      const std::string f = file.get<std::string>();
      const fs::path p(f);
      if (f.empty() || p.is_absolute() || std::find(p.begin(), p.end(), "..") != p.end())
        KILN_FAIL(index_path, ": weight_map[\"", name, "\"] = \"", f,
                  "\" is not a file inside the checkpoint");
      shard_names.insert(f);
    }
    std::map<std::string, int> shard_index;
    for (const auto& f : shard_names) shard_index[f] = add_file((fs::path(dir) / f).string());
    for (const auto& [name, file] : wm->items()) {
      const std::string f = file.get<std::string>();
      auto it = entries.find(name);
      if (it == entries.end() || it->second.file != shard_index[f])
        KILN_FAIL(index_path, ": weight_map puts tensor '", name, "' in ", f, ", which does not contain it");
    }
    if (auto md = index.find("metadata"); md != index.end() && md->is_object())
      for (const auto& [k, v] : md->items()) metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
};

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->source = dir;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    impl->add_file(dir);
  } else if (!fs::is_directory(dir, ec)) {
    KILN_FAIL(dir, ": no such checkpoint directory or .safetensors file");
  } else if (const fs::path index = fs::path(dir) / "model.safetensors.index.json"; fs::exists(index, ec)) {
    impl->add_index(dir, index.string());
  } else if (const fs::path single = fs::path(dir) / "model.safetensors"; fs::exists(single, ec)) {
    impl->add_file(single.string());
  } else {
    std::vector<std::string> found;
    for (const auto& de : fs::directory_iterator(dir, ec))
      if (de.path().extension() == ".safetensors") found.push_back(de.path().string());
    if (found.empty())
      KILN_FAIL(dir, ": no model.safetensors, model.safetensors.index.json or other .safetensors file");
    std::sort(found.begin(), found.end());
    for (const auto& f : found) impl->add_file(f);
  }
  return Checkpoint(std::move(impl));
}

bool Checkpoint::has(const std::string& name) const {
  return impl_->entries.count(name) > 0;
}

const TensorEntry& Checkpoint::entry(const std::string& name) const {
  auto it = impl_->entries.find(name);
  if (it == impl_->entries.end())
    KILN_FAIL(impl_->source, ": tensor '", name, "' not found (checkpoint has ", impl_->entries.size(),
              " tensors)");
  return it->second;
}

Tensor Checkpoint::get(const std::string& name) const {
  const TensorEntry& e = entry(name);
  const size_t f = size_t(e.file);
  Tensor t;
  t.data = static_cast<char*>(impl_->maps[f]->base) + impl_->data_start[f] + e.begin;
  t.dtype = e.dtype;
  t.device = Device::cpu();
  t.ndim = int(e.shape.size());
  int64_t s = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    t.shape[size_t(k)] = e.shape[size_t(k)];
    t.stride[size_t(k)] = s;
    s *= e.shape[size_t(k)];
  }
  return t;
}

Tensor Checkpoint::get(const std::string& name, DType expected, std::initializer_list<int64_t> shape) const {
  const TensorEntry& e = entry(name);
  const std::vector<int64_t> want(shape);
  if (e.dtype != expected || e.shape != want)
    KILN_FAIL(impl_->files[size_t(e.file)], ": tensor '", name, "': expected ", dtype_name(expected),
              shape_str(want), ", found ", dtype_name(e.dtype), shape_str(e.shape));
  return get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->entries.size());
  for (const auto& kv : impl_->entries) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>& Checkpoint::files() const {
  return impl_->files;
}
const std::map<std::string, std::string>& Checkpoint::metadata() const {
  return impl_->metadata;
}
size_t Checkpoint::size() const {
  return impl_->entries.size();
}

}  // namespace kiln
