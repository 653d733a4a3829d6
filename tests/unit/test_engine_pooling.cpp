// Embedding pooling in the engine (mean, CLS, last token; normalised or not), on a tiny random-weight
// sentence-transformers checkpoint: the engine's vector -- prompts split over chunked-prefill steps, the
// prefix cache on -- against the pooling done by hand on Qwen3Model::forward_hidden's rows for the whole
// prompt in one step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "engine_test_util.h"
#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "model/weights.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kiln;

namespace {

const char* kConfig = R"({"architectures": ["Qwen3Model"], "head_dim": 16, "hidden_size": 64,
  "intermediate_size": 128, "max_position_embeddings": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "rope_theta": 1000000, "tie_word_embeddings": true, "vocab_size": 512})";

fs::path write_checkpoint(const std::string& mode, bool normalize) {
  const fs::path d =
      test_support::process_scratch_dir("engine_pooling") / (mode + (normalize ? "_norm" : ""));
  fs::create_directories(d / "1_Pooling");
  std::ofstream(d / "config.json") << kConfig;
  json mods =
      json::array({{{"idx", 0}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
                   {{"idx", 1}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}}});
  if (normalize)
    mods.push_back({{"idx", 2}, {"path", "2_Normalize"}, {"type", "sentence_transformers.models.Normalize"}});
  std::ofstream(d / "modules.json") << mods.dump();
  std::ofstream(d / "1_Pooling/config.json") << json{
      {"pooling_mode_lasttoken", mode == "lasttoken"},
      {"pooling_mode_mean_tokens", mode == "mean"},
      {"pooling_mode_cls_token", mode == "cls"}}.dump();
  const ModelConfig cfg = parse_model_config(kConfig, "test config");
  const RandomWeights w = random_weights(qwen3_weight_specs(cfg), 7);
  write_safetensors((d / "model.safetensors").string(), w.tensors);
  return d;
}

// Final hidden states of every prompt row, the prompt in one step.
std::vector<std::vector<double>> all_rows(const fs::path& dir, const std::vector<int32_t>& prompt) {
  auto m = Qwen3Model::load(dir.string(), LoadOptions{});
  const int32_t n = int32_t(prompt.size()), ps = 16, pages = (n + ps - 1) / ps;
  KvCache cache(m->config(), pages + 1, ps, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  BatchDesc b;
  b.page_size = ps;
  b.pages_stride = pages;
  b.cu_q = {0, n};
  b.kv_lens = {n};
  for (int32_t t = 0; t < n; ++t) {
    b.tokens.push_back(prompt[size_t(t)]);
    b.positions.push_back(t);
    b.slot_mapping.push_back(int64_t(1 + t / ps) * ps + t % ps);  // page 0 is the null page
    b.logit_rows.push_back(t);
  }
  for (int32_t p = 0; p < pages; ++p) b.page_table.push_back(1 + p);
  const int64_t H = m->config().hidden_size;
  std::vector<float> h(size_t(n * H));
  m->forward_hidden(b, cache, Tensor(h.data(), DType::f32, {n, H}));
  std::vector<std::vector<double>> rows(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(H)));
  for (int32_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < H; ++j) rows[size_t(t)][size_t(j)] = h[size_t(t * H + j)];
  return rows;
}

void check_pooling(const std::string& mode, bool normalize) {
  SCOPED_TRACE(mode + (normalize ? ", normalised" : ", raw"));
  const fs::path dir = write_checkpoint(mode, normalize);
  const std::vector<int32_t> prompt = test::prompt_of(37, 3);
  const auto rows = all_rows(dir, prompt);
  const size_t H = rows[0].size();
  std::vector<double> want(H, 0.0);
  if (mode == "lasttoken") want = rows.back();
  if (mode == "cls") want = rows.front();
  if (mode == "mean")
    for (const auto& r : rows)
      for (size_t j = 0; j < H; ++j) want[j] += r[j] / double(rows.size());
  if (normalize) {
    double s = 0;
    for (double x : want) s += x * x;
    for (double& x : want) x /= std::sqrt(s);
  }

  EngineOptions o = test::small_opts(1024, /*page_size=*/4, /*chunk=*/8);  // 37 tokens: five chunks
  o.model_dir = dir.string();
  o.device = "cpu";
  auto engine = Engine::create(o);
  test::Sink sink;
  Request r;
  r.prompt = prompt;
  r.embedding = true;
  const RequestId a = engine->submit(r, sink.cb());
  sink.wait_finished(1);
  const RequestId b = engine->submit(r, sink.cb());  // again: a prefix-cache hit where pooling allows one
  sink.wait_finished(2);
  for (RequestId id : {a, b}) {
    const TokenEvent e = sink.last(id);
    ASSERT_EQ(e.finish_reason, "stop") << e.error;
    ASSERT_EQ(e.embedding.size(), H);
    double err = 0, ref = 0;
    for (size_t j = 0; j < H; ++j) {
      err += (double(e.embedding[j]) - want[j]) * (double(e.embedding[j]) - want[j]);
      ref += want[j] * want[j];
    }
    EXPECT_LE(std::sqrt(err / ref), 2e-3) << "request " << id;  // bf16 hidden states, other chunking
  }
  // A different prompt gives a different vector (the pooling reads the prompt).
  Request other = r;
  other.prompt[5] = (other.prompt[5] + 1) % 500;
  const RequestId c = engine->submit(other, sink.cb());
  sink.wait_finished(3);
  if (mode != "cls") {
    EXPECT_NE(sink.last(c).embedding, sink.last(a).embedding);
  }
  if (mode == "cls") {  // the first token's state: a later change cannot reach it (causal attention)
    other.prompt[0] = (other.prompt[0] + 1) % 500;
    const RequestId d = engine->submit(other, sink.cb());
    sink.wait_finished(4);
    EXPECT_NE(sink.last(d).embedding, sink.last(a).embedding);
    const std::vector<float> ec = sink.last(c).embedding, ea = sink.last(a).embedding;
    double diff = 0;
    for (size_t j = 0; j < H; ++j) diff = std::max(diff, std::fabs(double(ec[j]) - double(ea[j])));
    EXPECT_LE(diff, 1e-6);
  }
}

}  // namespace

TEST(EnginePooling, LastTokenNormalised) {
  check_pooling("lasttoken", true);
}
TEST(EnginePooling, MeanRaw) {
  check_pooling("mean", false);
}
TEST(EnginePooling, MeanNormalised) {
  check_pooling("mean", true);
}
TEST(EnginePooling, ClsNormalised) {
  check_pooling("cls", true);
}
