// The Qwen3-VL text path on the CPU: `kiln demo-model --arch vl` writes the demo decoder as the language
// model of a Qwen3VLForConditionalGeneration checkpoint (text_config, interleaved M-RoPE, weights under
// model.language_model., a model.visual.* tensor to ignore). Text tokens get three equal M-RoPE rows,
// which rotate exactly as plain RoPE does, so every output must be bit-identical to the plain demo's:
// through Qwen3Model::forward, `kiln generate --json` and the runtime engine.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/kiln_process.h"
#include "engine_test_util.h"
#include "kiln/safetensors.h"
#include "model/qwen3.h"
#include "runtime/qwen3_runner.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace kiln {
namespace {

using Result = kiln::test_support::KilnResult;
using kiln::test_support::kiln_bin;
using kiln::test_support::slurp;

fs::path tmp_root() {
  static const fs::path root = fs::temp_directory_path() / ("kiln_test_vl_" + std::to_string(::getpid()));
  return root;
}

Result run_kiln(const std::vector<std::string>& args) {
  return kiln::test_support::run_kiln(args, tmp_root());
}

fs::path plain_dir() {
  return tmp_root() / "plain";
}
fs::path vl_dir() {
  return tmp_root() / "vl";
}

// A copy of the VL demo (links to its files) whose config.json is edited by `edit`.
fs::path vl_variant(const std::string& name, const std::function<void(json&)>& edit) {
  const fs::path d = tmp_root() / name;
  fs::create_directories(d);
  for (const auto& e : fs::directory_iterator(vl_dir())) {
    if (e.path().filename() != "config.json") fs::create_symlink(e.path(), d / e.path().filename());
  }
  json cfg = json::parse(slurp(vl_dir() / "config.json"));
  edit(cfg);
  std::ofstream(d / "config.json") << cfg.dump(2);
  return d;
}

class ModelVl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::create_directories(tmp_root());
    if (!fs::exists(kiln_bin())) return;  // SetUp skips each test and says why
    Result r = run_kiln({"demo-model", plain_dir().string(), "--seed", "5"});
    ASSERT_EQ(r.code, 0) << r.err;
    r = run_kiln({"demo-model", vl_dir().string(), "--seed", "5", "--arch", "vl"});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(tmp_root()); }
  void SetUp() override {
    if (!fs::exists(kiln_bin())) GTEST_SKIP() << "kiln binary not built at " << kiln_bin();
    ASSERT_TRUE(fs::exists(vl_dir() / "model.safetensors")) << "demo-model --arch vl did not run";
  }
};

std::vector<int32_t> prompt() {
  std::vector<int32_t> p;
  uint32_t rng = 11;
  for (int i = 0; i < 37; ++i) p.push_back(int32_t((rng = rng * 1664525u + 1013904223u) >> 8) % 151000);
  return p;
}

// Greedy generation through Qwen3Model::forward (prefill, then one token a step); the logits of every
// step are appended to `all_logits`. `mrope`: the VL path (three equal position rows).
std::vector<int32_t> greedy_forward(const std::string& dir, bool mrope, int steps,
                                    std::vector<float>* all_logits) {
  LoadOptions lo;
  lo.device = Device::cpu();
  const auto m = Qwen3Model::load(dir, lo);
  const int ps = 16, pages = 8;
  KvCache cache(m->config(), pages, ps, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  std::vector<int32_t> seq = prompt(), out;
  std::vector<float> logits(size_t(m->config().vocab_size));
  int32_t cached = 0;
  for (int s = 0; s < steps; ++s) {
    BatchDesc b;
    b.page_size = ps;
    const int32_t n = int32_t(seq.size()) - cached;
    for (int32_t p = cached; p < cached + n; ++p) {
      b.tokens.push_back(seq[size_t(p)]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(p);
    }
    b.cu_q = {0, n};
    b.kv_lens = {cached + n};
    b.pages_stride = pages;
    for (int32_t i = 0; i < pages; ++i) b.page_table.push_back(i);
    b.logit_rows = {n - 1};
    if (mrope) {
      b.set_text_mrope();
      EXPECT_EQ(b.positions.size(), size_t(3 * n));
    }
    m->forward(b, cache, Tensor(logits.data(), DType::f32, {1, m->config().vocab_size}));
    all_logits->insert(all_logits->end(), logits.begin(), logits.end());
    cached += n;
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

TEST_F(ModelVl, CheckpointIsQwen3VlShaped) {
  const json cfg = json::parse(slurp(vl_dir() / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "Qwen3VLForConditionalGeneration");
  EXPECT_EQ(cfg["text_config"]["rope_scaling"]["mrope_section"], json({12, 10, 10}));
  EXPECT_EQ(cfg["text_config"]["rope_scaling"]["mrope_interleaved"], true);
  const ModelConfig c = load_model_config(vl_dir().string());
  EXPECT_EQ(c.arch, ModelArch::qwen3_vl_text);
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_EQ(c.mrope_section, (std::vector<int>{12, 10, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  const Checkpoint ck = Checkpoint::open(vl_dir().string());
  EXPECT_TRUE(ck.has("model.language_model.embed_tokens.weight"));
  EXPECT_TRUE(ck.has("model.language_model.layers.3.mlp.down_proj.weight"));
  EXPECT_TRUE(ck.has("model.visual.patch_embed.proj.weight"));  // the loader must ignore it
  EXPECT_FALSE(ck.has("model.embed_tokens.weight"));
}

TEST_F(ModelVl, ForwardEqualsPlainQwen3BitForBit) {
  std::vector<float> want_logits, got_logits;
  const auto want = greedy_forward(plain_dir().string(), false, 6, &want_logits);
  const auto got = greedy_forward(vl_dir().string(), true, 6, &got_logits);
  EXPECT_EQ(got, want);
  ASSERT_EQ(got_logits.size(), want_logits.size());
  EXPECT_EQ(std::memcmp(got_logits.data(), want_logits.data(), got_logits.size() * sizeof(float)), 0)
      << "M-RoPE with three equal rows must equal plain RoPE bit for bit";
  // The sectioned axis map (Qwen2.5-VL style) gives the same, since all three rows are equal.
  const fs::path sectioned =
      vl_variant("sectioned", [](json& j) { j["text_config"]["rope_scaling"]["mrope_interleaved"] = false; });
  std::vector<float> sec_logits;
  EXPECT_EQ(greedy_forward(sectioned.string(), true, 6, &sec_logits), want);
  EXPECT_EQ(std::memcmp(sec_logits.data(), want_logits.data(), sec_logits.size() * sizeof(float)), 0);
}

TEST_F(ModelVl, GenerateJsonEqualsPlainQwen3) {
  auto gen = [](const fs::path& d) {
    const Result r = run_kiln({"generate", "--model", d.string(), "--json", "--prompt", "The kiln fires at",
                               "--max-tokens", "8", "--ignore-eos", "--device", "cpu"});
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? json::parse(r.out) : json{};
  };
  const json want = gen(plain_dir()), got = gen(vl_dir());
  ASSERT_FALSE(want.is_null());
  EXPECT_EQ(want["ids"].size(), 8u);
  EXPECT_EQ(got["ids"], want["ids"]);
  EXPECT_EQ(got["logprobs"], want["logprobs"]);
  EXPECT_EQ(got["text"], want["text"]);
}

TEST_F(ModelVl, MropeSectionNotSummingToHalfRotaryIsRejected) {
  const fs::path bad = vl_variant("bad_section", [](json& j) {
    j["text_config"]["rope_scaling"]["mrope_section"] = {12, 10, 9};
  });
  try {
    load_model_config(bad.string());
    FAIL() << "mrope_section 12+10+9 accepted for rotary_dim 64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mrope_section"), std::string::npos) << e.what();
  }
  const Result r = run_kiln({"generate", "--model", bad.string(), "--prompt-ids", "1,2,3"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("sums to 31"), std::string::npos) << r.err;
}

// Passes every step through to the real runner and counts the batches that reach it without three equal
// M-RoPE position rows: equal outputs alone cannot show the VL path was taken (it equals plain RoPE).
class WatchingRunner : public ModelRunner {
 public:
  WatchingRunner(std::unique_ptr<ModelRunner> r, std::atomic<int>* steps, std::atomic<int>* bad)
      : r_(std::move(r)), steps_(steps), bad_(bad) {}
  const ModelConfig& config() const override { return r_->config(); }
  Device device() const override { return r_->device(); }
  int64_t kv_bytes_per_token() const override { return r_->kv_bytes_per_token(); }
  int64_t kv_memory_budget(double f) const override { return r_->kv_memory_budget(f); }
  void allocate_kv(int32_t num_pages, int32_t page_size) override { r_->allocate_kv(num_pages, page_size); }
  void forward(const BatchDesc& b, std::vector<float>* logits, std::vector<float>* hidden) override {
    const size_t T = b.tokens.size();
    bool ok = b.mrope && b.positions.size() == 3 * T;
    for (size_t t = 0; ok && t < T; ++t)
      ok = b.positions[T + t] == b.positions[t] && b.positions[2 * T + t] == b.positions[t];
    ++*steps_;
    if (!ok) ++*bad_;
    r_->forward(b, logits, hidden);
  }

 private:
  std::unique_ptr<ModelRunner> r_;
  std::atomic<int>*steps_, *bad_;
};

TEST_F(ModelVl, EngineGeneratesAsPlainQwen3) {
  std::vector<std::vector<int32_t>> prompts = {prompt(), {1, 2, 3}, prompt()};
  prompts.back().push_back(7);  // shares a prefix with the first: the prefix cache serves it
  std::atomic<int> steps{0}, bad{0};
  auto run = [&](const fs::path& d) {
    EngineOptions o = test::small_opts(1024, 16, 16);  // 16-token chunks mixed with decode rows
    o.model_dir = d.string();
    o.device = "cpu";
    auto engine =
        std::make_unique<Engine>(std::make_unique<WatchingRunner>(load_qwen3_runner(o), &steps, &bad), o);
    test::Sink sink;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) ids.push_back(engine->submit(test::greedy(p, 6), sink.cb()));
    sink.wait_finished(int(prompts.size()));
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) out.push_back(sink.tokens(id));
    test::expect_pool_clean(*engine);
    return out;
  };
  const auto want = run(plain_dir());
  EXPECT_EQ(want[0].size(), 6u);
  EXPECT_EQ(bad.load(), steps.load()) << "the plain model got M-RoPE positions";
  steps = 0;
  bad = 0;
  EXPECT_EQ(run(vl_dir()), want);
  EXPECT_GT(steps.load(), 0);
  EXPECT_EQ(bad.load(), 0) << "the engine gave the Qwen3-VL model batches without three equal position rows";
}

// The demo checkpoint's vision tower serves images (the README's main job): Qwen3-VL's token ids, 1536-value
// patches, the processor file beside it; a different picture changes the output.
TEST_F(ModelVl, EngineServesImagesOnTheDemoCheckpoint) {
  ASSERT_TRUE(fs::exists(vl_dir() / "preprocessor_config.json"));
  const json pre = json::parse(slurp(vl_dir() / "preprocessor_config.json"));
  EXPECT_EQ(pre["patch_size"], 16);
  EXPECT_EQ(pre["merge_size"], 2);
  EngineOptions o = test::small_opts(1024, 16, 16);
  o.model_dir = vl_dir().string();
  o.device = "cpu";
  auto engine = Engine::create(o);
  auto image = [](uint32_t seed) {  // 64 x 96 pixels: 4 x 6 patches, 6 image tokens
    vision::ImagePatches img;
    img.grid_t = 1, img.grid_h = 4, img.grid_w = 6, img.patch_dim = 1536;
    uint32_t rng = seed;
    for (int i = 0; i < 24 * 1536; ++i)
      img.values.push_back(float((rng = rng * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f);
    img.content_hash = {seed, seed * 3ull};
    return img;
  };
  std::vector<int32_t> p = {151644, 872, 198, 151652};  // <|im_start|>user\n<|vision_start|>
  p.insert(p.end(), 6, 151655);
  p.insert(p.end(), {151653, 3838, 374, 419, 30});
  std::vector<std::vector<float>> lp;
  for (uint32_t seed : {1u, 2u}) {
    Request r = test::greedy(p, 5);
    r.images = {image(seed)};
    r.sampling.return_logprob = true;
    test::Sink sink;
    const RequestId id = engine->submit(r, sink.cb());
    sink.wait_finished(1);
    ASSERT_EQ(sink.last(id).finish_reason, "length") << sink.last(id).error;
    EXPECT_EQ(sink.tokens(id).size(), 5u);
    lp.push_back(sink.events[id].front().logprobs);
  }
  EXPECT_NE(lp[0], lp[1]) << "the picture must change the output";
  test::expect_pool_clean(*engine);
}

}  // namespace
}  // namespace kiln
