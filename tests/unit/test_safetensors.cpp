// Safetensors: writer -> reader round trip, every malformed-header case, sharded checkpoints, and the real
// files that HF's save_pretrained wrote into tests/fixtures/hf.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <thread>

#include "common/test_support.h"
#include "kiln/atomic_file.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

// A fresh directory per test, inside this process's scratch folder (removed at exit).
std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = kiln::test_support::process_scratch_dir("st") /
               (std::string(info->test_suite_name()) + "_" + info->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint8_t(n >> (8 * i)));
  s += header;
  s.append(data_bytes, '\x5a');
  return s;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Writes HEADER + DATA_BYTES into DIR/model.safetensors, then returns Checkpoint::open's error.
std::string open_error(const std::string& header, size_t data_bytes) {
  const std::string dir = temp_dir();
  write_bytes(dir + "/model.safetensors", raw_file(header, data_bytes));
  return error_of([&] { Checkpoint::open(dir); });
}

}  // namespace

TEST(Safetensors, DTypeNamesRoundTrip) {
  for (const char* n :
       {"BF16", "F16", "F32", "F64", "F8_E4M3", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL"})
    EXPECT_STREQ(safetensors_dtype_name(safetensors_dtype_from_string(n)), n);
  EXPECT_EQ(safetensors_dtype_from_string("BF16"), DType::bf16);
  EXPECT_EQ(safetensors_dtype_from_string("F8_E4M3"), DType::f8e4m3);
  expect_contains(error_of([] { safetensors_dtype_from_string("F8_E5M2"); }), {"F8_E5M2"});
}

TEST(Safetensors, WriterRoundTripsEveryDTypeAndMetadata) {
  const std::string dir = temp_dir();
  const DType all[] = {DType::bf16, DType::f16, DType::f32, DType::f64,  DType::f8e4m3,
                       DType::i8,   DType::i16, DType::i32, DType::i64,  DType::u8,
                       DType::u16,  DType::u32, DType::u64, DType::bool_};
  std::vector<std::vector<uint8_t>> storage;
  std::vector<NamedTensor> tensors;
  int k = 0;
  for (DType t : all) {
    // Odd shapes: 3 x (k+1), so sizes differ and a mixed-up offset shows up as wrong bytes.
    const int64_t cols = k + 1;
    storage.emplace_back(size_t(3 * cols * dtype_size(t)));
    for (size_t i = 0; i < storage.back().size(); ++i) storage.back()[i] = uint8_t(i * 7 + k * 31 + 1);
    tensors.push_back(
        {std::string("t.") + safetensors_dtype_name(t), Tensor(storage.back().data(), t, {3, cols})});
    ++k;
  }
  float scalar = 2.5f;
  tensors.push_back({"scalar", Tensor(&scalar, DType::f32, {})});
  tensors.push_back({"empty", Tensor(nullptr, DType::bf16, {0, 4})});
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}, {"note", "kiln test"}});

  const std::string bytes = read_bytes(dir + "/model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "the data buffer must start 8-byte aligned";

  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.size(), tensors.size());
  EXPECT_EQ(ck.metadata().at("format"), "pt");
  EXPECT_EQ(ck.metadata().at("note"), "kiln test");
  const auto names = ck.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (size_t i = 0; i + 2 < tensors.size(); ++i) {
    const auto& want = tensors[i];
    ASSERT_TRUE(ck.has(want.name)) << want.name;
    const Tensor got = ck.get(want.name);
    EXPECT_EQ(got.dtype, want.tensor.dtype) << want.name;
    ASSERT_EQ(got.ndim, 2);
    EXPECT_EQ(got.shape[0], 3);
    EXPECT_EQ(got.shape[1], want.tensor.shape[1]);
    EXPECT_EQ(got.stride[0], want.tensor.shape[1]);
    EXPECT_TRUE(got.device.is_cpu());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data) % uintptr_t(dtype_size(got.dtype)), 0u) << want.name;
    EXPECT_EQ(std::memcmp(got.data, want.tensor.data, size_t(want.tensor.nbytes())), 0) << want.name;
  }
  const Tensor s = ck.get("scalar", DType::f32, {});
  EXPECT_EQ(s.ndim, 0);
  EXPECT_EQ(*s.ptr<float>(), 2.5f);
  const Tensor e = ck.get("empty", DType::bf16, {0, 4});
  EXPECT_EQ(e.numel(), 0);
}

// Concurrent writers of one path (ctest -j runs TESTs that write the same checkpoint at once): each write
// goes through its own temporary, so every one succeeds, the file ends whole (one writer's bytes, not a mix)
// and no temporary is left behind. With one fixed ".tmp" name the renames race and fail.
TEST(Safetensors, ConcurrentWritersOfOnePathNeverCollide) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/model.safetensors";
  constexpr int kThreads = 6, kWrites = 15;
  constexpr int64_t kN = 1 << 16;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<int32_t> v(size_t(kN), t);
      for (int i = 0; i < kWrites && errors[size_t(t)].empty(); ++i)
        errors[size_t(t)] = error_of([&] {
          write_safetensors(path, {{"v", Tensor(v.data(), DType::i32, {kN})}});
        });
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(errors[size_t(t)], "<no kiln::Error thrown>") << "writer " << t;
  Checkpoint ck = Checkpoint::open(dir);
  const Tensor v = ck.get("v", DType::i32, {kN});
  const int32_t first = v.ptr<int32_t>()[0];
  EXPECT_GE(first, 0);
  EXPECT_LT(first, kThreads);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(v.ptr<int32_t>()[i], first) << "mixed writers at element " << i;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"model.safetensors"});
}

TEST(Safetensors, UniqueTempPathsDiffer) {
  const std::string a = unique_temp_path("/x/model.safetensors"),
                    b = unique_temp_path("/x/model.safetensors");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("/x/model.safetensors.tmp." + std::to_string(::getpid()) + ".", 0), 0u) << a;
}

TEST(Safetensors, CheckedGetNamesTensorAndFile) {
  const std::string dir = temp_dir();
  std::vector<uint16_t> w(12, 0x3f80);
  write_safetensors(dir + "/model.safetensors", {{"layer.w", Tensor(w.data(), DType::bf16, {3, 4})}});
  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(ck.get("layer.w", DType::bf16, {3, 4}).numel(), 12);
  expect_contains(error_of([&] {
                    ck.get("layer.w", DType::f32, {3, 4});
                  }),
                  {"layer.w", "model.safetensors", "expected f32[3, 4]", "found bf16[3, 4]"});
  expect_contains(error_of([&] {
                    ck.get("layer.w", DType::bf16, {4, 3});
                  }),
                  {"layer.w", "expected bf16[4, 3]"});
  expect_contains(error_of([&] { ck.get("layer.missing"); }), {"layer.missing", "not found", dir});
  EXPECT_FALSE(ck.has("layer.missing"));
}

TEST(Safetensors, MalformedHeadersAreErrorsNamingFileAndTensor) {
  // Each row: header, data bytes, substrings the error must contain.
  struct Case {
    std::string header;
    size_t data;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"{not json", 0, {"not valid JSON"}},
      {"[1, 2]", 0, {"must be a JSON object"}},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4, {"'w'", "out of range"}},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12,
       {"'a'", "'b'", "overlap"}},
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, {"'w'", "needs 12"}},
      {R"({"w": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}})", 4, {"'w'", "F8_E5M2"}},
      {R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
       4,
       {"'w'", "non-negative integer"}},
      {R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})",
       4,
       {"'w'", "non-negative integer"}},
      {R"({"w": {"dtype": "U8", "shape": [1,1,1,1,1,1], "data_offsets": [0, 1]}})", 1, {"'w'", "at most"}},
      {R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"'w'", "dtype"}},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4, {"'w'", "backwards"}},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4, {"'w'", "data_offsets"}},
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
       4,
       {"'w'", "overflow"}},
      {R"({"w": 7})", 0, {"'w'", "object"}},
      {R"({"__metadata__": {"k": 1}})", 0, {"__metadata__"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string msg = open_error(c.header, c.data);
    expect_contains(msg, {"model.safetensors"});
    for (const auto& w : c.want) expect_contains(msg, {w});
  }
}

TEST(Safetensors, TruncatedFilesAreErrors) {
  // A file shorter than 8 bytes, and a header length that runs past the end.
  {
    const std::string dir = temp_dir();
    write_bytes(dir + "/model.safetensors", std::string("\x10\x00\x00", 3));
    expect_contains(error_of([&] { Checkpoint::open(dir); }), {"model.safetensors", "truncated"});
  }
  std::string lying = raw_file("{}", 0);
  lying[0] = char(0xe8);  // claims a 1000-byte header
  lying[1] = char(0x03);
  expect_contains(error_of([&] {
                    parse_safetensors_header(reinterpret_cast<const uint8_t*>(lying.data()), lying.size(),
                                             "lying.safetensors");
                  }),
                  {"lying.safetensors", "header length 1000", "past the end"});

  // Every proper prefix of a valid file is rejected (the last tensor is non-empty).
  const std::string dir = temp_dir();
  std::vector<float> a(5, 1.0f), b(3, 2.0f);
  write_safetensors(dir + "/whole.safetensors",
                    {{"a", Tensor(a.data(), DType::f32, {5})}, {"b", Tensor(b.data(), DType::f32, {3})}});
  const std::string whole = read_bytes(dir + "/whole.safetensors");
  EXPECT_NO_THROW(
      parse_safetensors_header(reinterpret_cast<const uint8_t*>(whole.data()), whole.size(), "w"));
  int rejected = 0;
  for (size_t n = 0; n < whole.size(); ++n) {
    try {
      parse_safetensors_header(reinterpret_cast<const uint8_t*>(whole.data()), n, "prefix");
    } catch (const Error& e) {
      ++rejected;
      EXPECT_NE(std::string(e.what()).find("prefix"), std::string::npos);
    }
  }
  EXPECT_EQ(rejected, int(whole.size()));
}

TEST(Safetensors, GapsBetweenTensorsAreAllowed) {
  const std::string msg = open_error(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})", 8);
  EXPECT_EQ(msg, "<no kiln::Error thrown>");
}

TEST(Safetensors, ShardedIndex) {
  const std::string dir = temp_dir();
  std::vector<int32_t> x(6);
  std::iota(x.begin(), x.end(), 10);
  std::vector<uint16_t> y(4, 0x4000);
  write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"x", Tensor(x.data(), DType::i32, {2, 3})}});
  write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"y", Tensor(y.data(), DType::bf16, {4})}});
  const std::string good = R"({"metadata": {"total_size": 32}, "weight_map": {
      "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})";
  write_bytes(dir + "/model.safetensors.index.json", good);
  {
    Checkpoint ck = Checkpoint::open(dir);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(ck.files().size(), 2u);
    EXPECT_EQ(ck.get("x", DType::i32, {2, 3}).ptr<int32_t>()[5], 15);
    EXPECT_EQ(ck.get("y", DType::bf16, {4}).ptr<uint16_t>()[3], 0x4000);
    EXPECT_EQ(ck.metadata().at("total_size"), "32");
    EXPECT_EQ(ck.entry("y").file, 1);
  }
  // The index lies about which shard holds a tensor.
  write_bytes(
      dir + "/model.safetensors.index.json",
      R"({"weight_map": {"x": "model-00002-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir); }),
                  {"'x'", "model-00002-of-00002", "does not contain"});
  // A shard that does not exist.
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map": {"x": "nope.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir); }), {"nope.safetensors", "cannot open"});
  // A shard outside the checkpoint directory.
  write_bytes(dir + "/model.safetensors.index.json", R"({"weight_map": {"x": "../evil.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir); }), {"../evil.safetensors", "not a file inside"});
  // No weight_map; non-JSON.
  write_bytes(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  expect_contains(error_of([&] { Checkpoint::open(dir); }), {"weight_map"});
  write_bytes(dir + "/model.safetensors.index.json", "{");
  expect_contains(error_of([&] { Checkpoint::open(dir); }), {"index.json", "not valid JSON"});
  // The same tensor in two shards.
  write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"x", Tensor(x.data(), DType::i32, {6})}});
  write_bytes(
      dir + "/model.safetensors.index.json",
      R"({"weight_map": {"x": "model-00001-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}})");
  expect_contains(error_of([&] { Checkpoint::open(dir); }), {"'x'", "also appears"});
}

TEST(Safetensors, OpenErrors) {
  const std::string dir = temp_dir();
  expect_contains(error_of([&] { Checkpoint::open(dir + "/missing"); }), {"missing", "no such checkpoint"});
  expect_contains(error_of([&] { Checkpoint::open(dir); }), {dir, "no model.safetensors"});
  // A directory with some other .safetensors file; and a path naming the file itself.
  std::vector<float> v(2, 3.0f);
  write_safetensors(dir + "/weights.safetensors", {{"v", Tensor(v.data(), DType::f32, {2})}});
  EXPECT_TRUE(Checkpoint::open(dir).has("v"));
  EXPECT_TRUE(Checkpoint::open(dir + "/weights.safetensors").has("v"));
}

TEST(Safetensors, WriterRejectsBadInput) {
  const std::string dir = temp_dir();
  std::vector<float> v(6, 1.0f);
  const Tensor t(v.data(), DType::f32, {2, 3});
  expect_contains(error_of([&] {
                    write_safetensors(dir + "/a.safetensors", {{"w", t}, {"w", t}});
                  }),
                  {"duplicate", "'w'"});
  const Tensor strided = Tensor::strided(v.data(), DType::f32, {2, 2}, {3, 1});
  expect_contains(error_of([&] {
                    write_safetensors(dir + "/a.safetensors", {{"s", strided}});
                  }),
                  {"'s'", "not contiguous"});
  expect_contains(error_of([&] {
                    write_safetensors(dir + "/a.safetensors", {{"__metadata__", t}});
                  }),
                  {"reserved"});
  expect_contains(error_of([&] {
                    write_safetensors(dir + "/no/such/dir/a.safetensors", {{"w", t}});
                  }),
                  {"cannot open"});
  EXPECT_FALSE(fs::exists(dir + "/a.safetensors"));
}

TEST(Safetensors, ReadsCheckpointsWrittenByTransformers) {
  const std::string root = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/";
  {
    Checkpoint ck = Checkpoint::open(root + "qwen3_gqa4_d64_tied");  // tied: no lm_head.weight
    EXPECT_FALSE(ck.has("lm_head.weight"));
    EXPECT_EQ(ck.get("model.embed_tokens.weight", DType::bf16, {512, 64}).numel(), 512 * 64);
    // 4 query heads x 64, 1 kv head x 64, per-head q/k norms of 64.
    ck.get("model.layers.1.self_attn.q_proj.weight", DType::bf16, {256, 64});
    ck.get("model.layers.1.self_attn.k_proj.weight", DType::bf16, {64, 64});
    ck.get("model.layers.0.self_attn.q_norm.weight", DType::bf16, {64});
    ck.get("model.norm.weight", DType::bf16, {64});
    EXPECT_EQ(ck.size(), 2u * 11u + 2u);  // 11 per layer, embed, final norm
  }
  {
    Checkpoint ck = Checkpoint::open(root + "qwen3_gqa2_d128_untied");
    ck.get("lm_head.weight", DType::bf16, {512, 64});
    ck.get("model.layers.0.self_attn.v_proj.weight", DType::bf16, {256, 64});
    ck.get("model.layers.0.mlp.down_proj.weight", DType::bf16, {64, 128});
    // Norm weights were initialised to 1 + N(0, 0.1^2): all finite, centred near 1.
    const Tensor n = ck.get("model.layers.0.input_layernorm.weight");
    double sum = 0;
    for (int64_t i = 0; i < n.numel(); ++i) sum += bf16_to_f32(n.ptr<bf16_t>()[i]);
    EXPECT_NEAR(sum / double(n.numel()), 1.0, 0.1);
  }
}
