// sentence-transformers checkpoints: modules.json + 1_Pooling/config.json (+ Normalize) -> ModelConfig's
// embedding head, as load_model_config reads a checkpoint directory; --is-embedding (force_embedding); and
// every malformed layout a clear error naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "kiln/config.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kiln;
using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

namespace {

const char* kConfig = R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 16, "hidden_size": 64,
  "intermediate_size": 128, "max_position_embeddings": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "rope_theta": 1000000, "tie_word_embeddings": true, "vocab_size": 512})";

json modules(bool normalize) {
  json m = json::array(
      {{{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
       {{"idx", 1}, {"name", "1"}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}}});
  if (normalize)
    m.push_back({{"idx", 2},
                 {"name", "2"},
                 {"path", "2_Normalize"},
                 {"type", "sentence_transformers.models.Normalize"}});
  return m;
}

json pooling(const std::string& mode) {
  return {{"word_embedding_dimension", 64},
          {"pooling_mode_cls_token", mode == "cls"},
          {"pooling_mode_mean_tokens", mode == "mean"},
          {"pooling_mode_max_tokens", mode == "max"},
          {"pooling_mode_mean_sqrt_len_tokens", false},
          {"pooling_mode_weightedmean_tokens", false},
          {"pooling_mode_lasttoken", mode == "lasttoken"},
          {"include_prompt", true}};
}

// A checkpoint folder of this process with config.json and, when given, modules.json and the pooling config.
fs::path checkpoint(const std::string& name, const json* mods, const json* pool) {
  const fs::path d = test_support::process_scratch_dir("st") / name;
  fs::remove_all(d);
  fs::create_directories(d / "1_Pooling");
  std::ofstream(d / "config.json") << kConfig;
  if (mods) std::ofstream(d / "modules.json") << mods->dump();
  if (pool) std::ofstream(d / "1_Pooling/config.json") << pool->dump();
  return d;
}

}  // namespace

TEST(SentenceTransformers, Qwen3EmbeddingAsShipped) {
  const json m = modules(true), p = pooling("lasttoken");
  const ModelConfig c = load_model_config(checkpoint("hub", &m, &p).string());
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.arch, ModelArch::qwen3_embedding);  // modules.json says so, whatever architectures says
  EXPECT_EQ(c.pooling, EmbeddingPooling::last_token);
  EXPECT_TRUE(c.normalize_embeddings);
  EXPECT_EQ(c.embedding_source, "modules.json");
}

TEST(SentenceTransformers, MeanAndClsPoolingWithOrWithoutNormalize) {
  const json m = modules(false), mean = pooling("mean"), cls = pooling("cls");
  ModelConfig c = load_model_config(checkpoint("mean", &m, &mean).string());
  EXPECT_EQ(c.pooling, EmbeddingPooling::mean);
  EXPECT_FALSE(c.normalize_embeddings);
  c = load_model_config(checkpoint("cls", &m, &cls).string());
  EXPECT_EQ(c.pooling, EmbeddingPooling::cls);
}

TEST(SentenceTransformers, WithoutModulesJsonNothingChanges) {
  const ModelConfig c = load_model_config(checkpoint("plain", nullptr, nullptr).string());
  EXPECT_EQ(c.arch, ModelArch::qwen3);
  EXPECT_EQ(c.embedding_source, "");
  // Qwen3Model without modules.json: last token, normalised (Qwen3-Embedding's head).
  json j = json::parse(kConfig);
  j["architectures"] = {"Qwen3Model"};
  const ModelConfig e = parse_model_config(j.dump(), "x/config.json");
  EXPECT_EQ(e.arch, ModelArch::qwen3_embedding);
  EXPECT_EQ(e.pooling, EmbeddingPooling::last_token);
  EXPECT_TRUE(e.normalize_embeddings);
  EXPECT_EQ(e.embedding_source, "architectures");
}

TEST(SentenceTransformers, IsEmbeddingForcesTheMode) {
  ModelConfig c = load_model_config(checkpoint("forced", nullptr, nullptr).string());
  force_embedding(c);
  EXPECT_EQ(c.arch, ModelArch::qwen3_embedding);
  EXPECT_EQ(c.pooling, EmbeddingPooling::last_token);
  EXPECT_TRUE(c.normalize_embeddings);
  EXPECT_EQ(c.embedding_source, "--is-embedding");
  // A sentence-transformers checkpoint keeps its own head.
  const json m = modules(false), p = pooling("mean");
  ModelConfig s = load_model_config(checkpoint("forced_st", &m, &p).string());
  force_embedding(s);
  EXPECT_EQ(s.pooling, EmbeddingPooling::mean);
  EXPECT_EQ(s.embedding_source, "modules.json");
}

TEST(SentenceTransformers, PoolingConfigAsSentenceTransformers6WritesIt) {
  // 6.x writes embedding_dimension and a pooling_mode string instead of one boolean per mode.
  const json m = modules(false);
  for (const auto& [mode, want] :
       std::vector<std::pair<std::string, EmbeddingPooling>>{{"lasttoken", EmbeddingPooling::last_token},
                                                             {"mean", EmbeddingPooling::mean},
                                                             {"cls", EmbeddingPooling::cls}}) {
    const json pool = {{"embedding_dimension", 64}, {"pooling_mode", mode}, {"include_prompt", true}};
    const ModelConfig c = load_model_config(checkpoint("st6_" + mode, &m, &pool).string());
    EXPECT_EQ(c.arch, ModelArch::qwen3_embedding) << mode;
    EXPECT_EQ(c.pooling, want) << mode;
  }
  const json max_pool = {{"embedding_dimension", 64}, {"pooling_mode", "max"}};
  expect_contains(error_of([&] { load_model_config(checkpoint("st6_max", &m, &max_pool).string()); }),
                  {"1_Pooling/config.json", "pooling_mode", "max"});
  const json wide = {{"embedding_dimension", 1024}, {"pooling_mode", "lasttoken"}};
  expect_contains(error_of([&] { load_model_config(checkpoint("st6_wide", &m, &wide).string()); }),
                  {"embedding_dimension", "1024", "64"});
}

TEST(SentenceTransformers, MalformedLayoutsAreClearErrors) {
  const json p = pooling("lasttoken");
  struct Case {
    json mods;
    json pool;
    std::vector<std::string> want;
  };
  json dense = modules(true);
  dense.push_back(
      {{"idx", 3}, {"name", "3"}, {"path", "3_Dense"}, {"type", "sentence_transformers.models.Dense"}});
  json no_pool = json::array({modules(false)[0]});
  json norm_first = json::array({modules(true)[0], modules(true)[2], modules(true)[1]});
  json two_modes = pooling("lasttoken");
  two_modes["pooling_mode_mean_tokens"] = true;
  json wrong_dim = pooling("lasttoken");
  wrong_dim["word_embedding_dimension"] = 1024;
  const std::vector<Case> cases = {
      {dense, p, {"modules.json", "module 3", "Dense"}},
      {no_pool, p, {"modules.json", "no Pooling module"}},
      {norm_first, p, {"modules.json", "Normalize before Pooling"}},
      {modules(true), pooling("max"), {"1_Pooling/config.json", "pooling_mode_max_tokens"}},
      {modules(true), two_modes, {"1_Pooling/config.json", "exactly one"}},
      {modules(true), wrong_dim, {"1_Pooling/config.json", "word_embedding_dimension", "1024", "64"}},
      {json::object(), p, {"modules.json", "non-empty list"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const fs::path d = checkpoint("bad" + std::to_string(i), &cases[i].mods, &cases[i].pool);
    const std::string msg = error_of([&] { load_model_config(d.string()); });
    for (const auto& w : cases[i].want) expect_contains(msg, {w});
  }
  // The Pooling module's config missing: names the file.
  const json m = modules(true);
  const fs::path d = checkpoint("nopoolcfg", &m, nullptr);
  expect_contains(error_of([&] { load_model_config(d.string()); }), {"1_Pooling/config.json", "cannot open"});
}
