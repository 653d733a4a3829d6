// `kiln demo-model` and `kiln generate` as a user runs them: the binary as a subprocess, on a demo
// checkpoint written into a temp dir. Checks the JSON output against the model run in-process, seeded
// determinism, and that every kind of bad input gives exit code != 0 and one clear line on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/kiln_process.h"
#include "model/qwen3.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Result = kiln::test_support::KilnResult;
using kiln::test_support::kiln_bin;
using kiln::test_support::slurp;

fs::path tmp_root() {
  static const fs::path root = fs::temp_directory_path() / ("kiln_test_cli_" + std::to_string(::getpid()));
  return root;
}

Result run_kiln(const std::vector<std::string>& args) {
  return kiln::test_support::run_kiln(args, tmp_root());
}

fs::path demo_dir() {
  return tmp_root() / "demo";
}

class CliGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::create_directories(tmp_root());
    if (!fs::exists(kiln_bin())) return;  // SetUp skips each test and says why
    const Result r = run_kiln({"demo-model", demo_dir().string(), "--seed", "3"});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(tmp_root()); }
  void SetUp() override {
    if (!fs::exists(kiln_bin())) GTEST_SKIP() << "kiln binary not built at " << kiln_bin();
    ASSERT_TRUE(fs::exists(demo_dir() / "model.safetensors")) << "demo-model did not run";
  }

  // A model dir holding links to the demo's files except `replaced`, which gets `content`.
  static fs::path variant(const std::string& name, const std::string& replaced, const std::string& content) {
    const fs::path d = tmp_root() / name;
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(demo_dir())) {
      const fs::path target = d / e.path().filename();
      if (fs::exists(fs::symlink_status(target))) fs::remove(target);
      if (e.path().filename() == replaced) {
        std::ofstream(target, std::ios::binary) << content;
      } else {
        fs::create_symlink(e.path(), target);
      }
    }
    return d;
  }
};

json generate_json(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"generate", "--model", demo_dir().string(), "--json", "--device", "cpu"};
  args.insert(args.end(), extra.begin(), extra.end());
  const Result r = run_kiln(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? json::parse(r.out) : json{};
}

}  // namespace

TEST_F(CliGenerate, DemoCheckpointIsHuggingFaceShaped) {
  const json cfg = json::parse(slurp(demo_dir() / "config.json"));
  EXPECT_EQ(cfg["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(cfg["hidden_size"], 256);
  EXPECT_EQ(cfg["num_hidden_layers"], 4);
  EXPECT_EQ(cfg["vocab_size"], 151936);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_TRUE(fs::exists(demo_dir() / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(demo_dir() / "tokenizer_config.json"));
  // Deterministic: the same seed writes the same bytes.
  const fs::path again = tmp_root() / "demo_again";
  ASSERT_EQ(run_kiln({"demo-model", again.string(), "--seed", "3"}).code, 0);
  EXPECT_TRUE(slurp(again / "model.safetensors") == slurp(demo_dir() / "model.safetensors"));
  fs::remove_all(again);
}

TEST_F(CliGenerate, GreedyJsonMatchesTheModelInProcess) {
  const json j = generate_json({"--prompt-ids", "9707,11,1879", "--max-tokens", "5"});
  ASSERT_TRUE(j.contains("ids") && j.contains("logprobs") && j.contains("text"));
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  const auto lps = j["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(ids.size(), lps.size());
  ASSERT_EQ(ids.size(), 5u);  // this prompt does not hit EOS
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["prompt_tokens"], 3);
  EXPECT_TRUE(j["text"].is_string());

  // The same greedy steps in-process, through the model API with a one-page-per-token cache.
  auto m = kiln::Qwen3Model::load(demo_dir().string(), kiln::LoadOptions{});
  const int64_t V = m->config().vocab_size;
  kiln::KvCache cache(m->config(), 8, 1, kiln::ops::KvLayout::hnd, kiln::DType::bf16, kiln::Device::cpu());
  std::vector<int32_t> seq = {9707, 11, 1879};
  std::vector<float> logits(static_cast<size_t>(V));
  int32_t cached = 0;
  for (size_t step = 0; step < ids.size(); ++step) {
    kiln::BatchDesc b;
    b.page_size = 1;
    for (int32_t p = cached; p < int32_t(seq.size()); ++p) {
      b.tokens.push_back(seq[size_t(p)]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(p);
    }
    const int32_t n = int32_t(seq.size()) - cached;
    b.cu_q = {0, n};
    b.kv_lens = {int32_t(seq.size())};
    b.pages_stride = 8;
    b.page_table = {0, 1, 2, 3, 4, 5, 6, 7};
    b.logit_rows = {n - 1};
    m->forward(b, cache, kiln::Tensor(logits.data(), kiln::DType::f32, {1, V}));
    cached = int32_t(seq.size());
    const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_EQ(ids[step], best) << "step " << step;
    double mx = -1e300, sum = 0;
    for (float x : logits) mx = std::max(mx, double(x));
    for (float x : logits) sum += std::exp(double(x) - mx);
    EXPECT_NEAR(lps[step], double(logits[size_t(best)]) - mx - std::log(sum), 1e-4);
    seq.push_back(best);
  }
  // Twice gives the same answer.
  EXPECT_EQ(generate_json({"--prompt-ids", "9707,11,1879", "--max-tokens", "5"})["ids"], j["ids"]);
}

TEST_F(CliGenerate, TextPromptAndSeededSampling) {
  const json t = generate_json({"--prompt", "The capital of France is", "--max-tokens", "3"});
  EXPECT_GT(t["prompt_tokens"].get<int>(), 1);
  EXPECT_EQ(t["ids"].size(), 3u);
  auto sample = [](const std::string& seed) {
    return generate_json({"--prompt-ids", "1,2,3", "--max-tokens", "4", "--temperature", "1.0", "--top-p",
                          "0.9", "--seed", seed})["ids"];
  };
  EXPECT_EQ(sample("5"), sample("5"));
  EXPECT_NE(sample("5"), sample("6"));  // near-uniform logits over 151936 ids: distinct draws
  for (double lp :
       generate_json({"--prompt-ids", "7", "--max-tokens", "2", "--temperature", "0.5"})["logprobs"])
    EXPECT_TRUE(lp <= 0.0 && std::isfinite(lp));
}

TEST_F(CliGenerate, BadInputIsOneClearLine) {
  const std::string d = demo_dir().string();
  const fs::path empty = tmp_root() / "empty";
  fs::create_directories(empty);
  const std::string cfg = slurp(demo_dir() / "config.json");
  std::string f32cfg = cfg;
  f32cfg.replace(f32cfg.find("\"bfloat16\""), 10, "\"float32\"");
  const fs::path truncated =
      variant("truncated", "model.safetensors", slurp(demo_dir() / "model.safetensors").substr(0, 4096));
  const fs::path garbage = variant("garbage", "model.safetensors", "not a safetensors file at all");
  const fs::path bad_json = variant("bad_json", "config.json", "{\"hidden_size\": ");
  const fs::path wrong_dtype = variant("wrong_dtype", "config.json", f32cfg);
  const fs::path no_weights = variant("no_weights", "model.safetensors", "");
  fs::remove(no_weights / "model.safetensors");

  struct Case {
    std::vector<std::string> args;
    std::string expect;  // a fragment of the error line
  };
  const std::vector<Case> cases = {
      {{"--model", "/nonexistent/kiln-model", "--prompt-ids", "1"}, "does not exist"},
      {{"--model", empty.string(), "--prompt-ids", "1"}, "config.json"},
      {{"--model", bad_json.string(), "--prompt-ids", "1"}, "config.json"},
      {{"--model", truncated.string(), "--prompt-ids", "1"}, "model.safetensors"},
      {{"--model", garbage.string(), "--prompt-ids", "1"}, "model.safetensors"},
      {{"--model", no_weights.string(), "--prompt-ids", "1"}, "safetensors"},
      {{"--model", wrong_dtype.string(), "--prompt-ids", "1"}, "bf16"},
      {{"--model", d, "--prompt-ids", "151936"}, "outside the vocabulary"},
      {{"--model", d, "--prompt-ids", "5,-1"}, "outside the vocabulary"},
      {{"--model", d, "--prompt-ids", ""}, "prompt is empty"},
      {{"--model", d, "--prompt", ""}, "prompt is empty"},
      {{"--model", d, "--prompt-ids", "1,x"}, "comma-separated"},
      {{"--model", d, "--prompt-ids", "1,"}, "comma"},
      {{"--model", d, "--prompt-ids", "1", "--max-tokens", "0"}, "--max-tokens"},
      {{"--model", d, "--prompt-ids", "1", "--max-tokens", "-4"}, "--max-tokens"},
      {{"--model", d, "--prompt-ids", "1,2", "--max-tokens", "40960"}, "context"},
      {{"--model", d, "--prompt-ids", "1", "--temperature", "-1"}, "temperature"},
      {{"--model", d, "--prompt-ids", "1", "--top-p", "0"}, "top_p"},
      {{"--model", d, "--prompt-ids", "1", "--prompt", "hi"}, "exactly one"},
      {{"--model", d}, "exactly one"},
      {{"--prompt-ids", "1"}, "--model"},
      {{"--model", d, "--prompt-ids", "1", "--bogus", "1"}, "unknown flag"},
      {{"--model", d, "--prompt-ids", "1", "--device", "tpu"}, "--device"},
      {{"--model", d, "--prompt-ids", "1", "--kv-dtype", "int4"}, "--kv-dtype"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"generate"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const Result r = run_kiln(args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_NE(r.code, 0) << joined;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << joined << ": stderr was: " << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
  if (!kiln::cuda_available()) {
    const Result r = run_kiln({"generate", "--model", d, "--prompt-ids", "1", "--device", "cuda"});
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("CUDA"), std::string::npos) << r.err;
  }
  const Result r = run_kiln({"demo-model"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("usage"), std::string::npos) << r.err;
}

TEST_F(CliGenerate, CacheLayoutAndPageSizeDoNotChangeTheOutput) {
  const std::vector<std::string> base = {"--prompt-ids", "100,200,300,400", "--max-tokens", "4"};
  const json a = generate_json(base);
  std::vector<std::string> other = base;
  other.insert(other.end(), {"--kv-layout", "hnd", "--page-size", "1"});
  const json b = generate_json(other);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["logprobs"], b["logprobs"]);  // bitwise: the CPU path is layout- and page-invariant
  std::vector<std::string> fp8 = base;
  fp8.insert(fp8.end(), {"--kv-dtype", "fp8_e4m3"});
  const json c = generate_json(fp8);
  EXPECT_EQ(c["ids"].size(), 4u);
}
