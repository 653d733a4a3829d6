// Qwen3-Embedding as the hub ships it, against sentence-transformers:
// tests/fixtures/make_hf_embedding_fixture.py (run on the device machine) saved tiny checkpoints in the hub
// layout (modules.json, 1_Pooling, 2_Normalize, unprefixed weights, no LM head, a TemplateProcessing
// post-processor appending <|endoftext|>) and SentenceTransformer.encode's vectors for fixed texts.
// Checked here, on the CPU: the config says embedding model with the fixture's pooling and normalisation;
// /v1/embeddings' parsing (TokenizerCodec + parse_embedding_request) gives sentence-transformers' token
// ids (so equal prompt-token counts); the engine's vectors pass common/hf_embedding.h (cosine >= 0.999,
// norms, dimensions). tests/cuda/test_cuda_embedding_hf.cpp checks the same on the GPU.
// Issue 41 point 8's family (qwen3_embedding_qwen3tok, qwen3_embedding_vocab151669: the real Qwen3 tokenizer,
// 2 query heads / 1 KV head of head_dim 64 over a smaller hidden size, weights N(0, 0.2^2), vocabularies
// 151,936 and 151,669) ships without its 11 MB tokenizer.json: the tokenizer is rebuilt from .deps' Qwen3
// tokenizer with the fixture's post-processor (the token-id check skips, saying so, where .deps is absent).
// Until the fixtures are generated and committed, each test SKIPS and says how to make them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/hf_embedding.h"
#include "kiln/config.h"
#include "kiln/tokenizer.h"
#include "runtime/engine.h"
#include "server/api_error.h"
#include "server/backend_engine.h"
#include "server/protocol.h"
#include "test_tokenizer_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kiln;

namespace {

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf";

// /v1/embeddings' parsing with `tok` gives the reference's token ids for its texts.
void check_token_ids(Tokenizer tok, const ModelConfig& cfg, const json& ref) {
  const server::TokenizerCodec codec(std::move(tok));
  server::ApiLimits lim;
  lim.vocab_size = cfg.vocab_size;
  lim.hidden_size = cfg.hidden_size;
  lim.max_context_len = cfg.max_context();
  const server::EmbedSpec spec = server::parse_embedding_request({{"input", ref["texts"]}}, codec, lim);
  const auto want_ids = ref["prompt_ids"].get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(spec.inputs.size(), want_ids.size());
  for (size_t i = 0; i < want_ids.size(); ++i)
    EXPECT_EQ(spec.inputs[i], want_ids[i])
        << "text " << i << " tokenizes differently from sentence-transformers";
}

void check_fixture(const std::string& name, EmbeddingPooling pooling, bool normalize) {
  const fs::path dir = kFixtures / name;
  json ref;
  KILN_SKIP_WITHOUT_EMBEDDING_FIXTURE(dir, ref);

  const ModelConfig cfg = load_model_config(dir.string());
  EXPECT_EQ(cfg.arch, ModelArch::qwen3_embedding);
  EXPECT_EQ(cfg.pooling, pooling);
  EXPECT_EQ(cfg.normalize_embeddings, normalize);
  EXPECT_EQ(cfg.embedding_source, "modules.json");

  // /v1/embeddings' parsing: the texts tokenize as sentence-transformers tokenized them (so the prompt-token
  // counts in usage are equal).
  std::optional<Tokenizer> tok;
  if (ref.value("tokenizer", "") == "qwen3-npm") {
    const std::string file = test::qwen3_tokenizer_dir() + "/tokenizer.json";
    if (std::ifstream(file).good()) {
      json t = json::parse(test::read_text(file));
      t["post_processor"] = ref["post_processor"];
      tok = Tokenizer::from_json(t.dump());
    } else {
      std::printf("  %s: %s is absent: token ids not checked\n", name.c_str(), file.c_str());
    }
  } else {
    tok = Tokenizer::load(dir.string());
  }
  if (tok) check_token_ids(std::move(*tok), cfg, ref);
  test_support::check_hf_embeddings(dir, ref, "cpu", normalize);
}

}  // namespace

TEST(HfEmbedding, HubLayoutQwen3ForCausalLM) {
  check_fixture("qwen3_embedding_hub", EmbeddingPooling::last_token, true);
}
TEST(HfEmbedding, SentenceTransformersQwen3Model) {
  check_fixture("qwen3_embedding_st", EmbeddingPooling::last_token, true);
}
TEST(HfEmbedding, MeanPoolingWithoutNormalize) {
  check_fixture("qwen3_embedding_mean", EmbeddingPooling::mean, false);
}
// Issue 41 point 8: the real Qwen3 tokenizer, GQA 2:1 with one KV head, heads x head_dim != hidden, weights
// of scale 0.2, a text of ~400 tokens.
TEST(HfEmbedding, Qwen3TokenizerOneKvHeadScale02) {
  check_fixture("qwen3_embedding_qwen3tok", EmbeddingPooling::last_token, true);
}
// The same family with Qwen3-Embedding-0.6B's odd vocabulary (151,669).
TEST(HfEmbedding, OddVocabulary151669) {
  check_fixture("qwen3_embedding_vocab151669", EmbeddingPooling::last_token, true);
}

// /v1/embeddings' text inputs go through the post-processor (the real Qwen3 tokenizer with Qwen3-Embedding's
// TemplateProcessing); token-id inputs do not; "" is a 400 although the template would make it one token.
TEST(HfEmbedding, TextInputsGetThePostProcessorTokens) {
  KILN_REQUIRE_QWEN3();
  json t = json::parse(test::read_text(test::qwen3_tokenizer_dir() + "/tokenizer.json"));
  t["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
    "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643], "tokens": ["<|endoftext|>"]}}})");
  const server::TokenizerCodec codec(Tokenizer::from_json(t.dump()));
  server::ApiLimits lim;
  lim.vocab_size = 151936;
  lim.hidden_size = 64;
  lim.max_context_len = 3;
  const server::EmbedSpec s = server::parse_embedding_request(
      {{"input", json::array({"Hello world", json::array({9707, 1879})})}}, codec, lim);
  ASSERT_EQ(s.inputs.size(), 2u);
  EXPECT_EQ(s.inputs[0], (std::vector<int32_t>{9707, 1879, 151643}));
  EXPECT_EQ(s.inputs[1], (std::vector<int32_t>{9707, 1879}));
  auto status = [&](const json& body) {
    try {
      server::parse_embedding_request(body, codec, lim);
    } catch (const server::ApiError& e) {
      return e.status();
    }
    return 200;
  };
  EXPECT_EQ(status({{"input", ""}}), 400);
  EXPECT_EQ(status({{"input", {"a", ""}}}), 400);
  EXPECT_EQ(status({{"input", "Hello world again"}}),
            400);  // 4 tokens with <|endoftext|>: over the context of 3
  EXPECT_EQ(status({{"input", "Hello world"}}), 200);
}
