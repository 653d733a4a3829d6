// Qwen3-Embedding as the hub ships it, against sentence-transformers:
// tests/fixtures/make_hf_embedding_fixture.py (run on the device machine) saved tiny checkpoints in the hub
// layout (modules.json, 1_Pooling, 2_Normalize, unprefixed weights, no LM head, a TemplateProcessing
// post-processor appending <|endoftext|>) and SentenceTransformer.encode's vectors for fixed texts. Checked
// here, on the CPU, through the same pieces /v1/embeddings uses (TokenizerCodec + parse_embedding_request ->
// Engine -> shape_embedding):
//   the config says embedding model with the fixture's pooling and normalisation; the token ids (so the
//   prompt-token counts) equal sentence-transformers'; every vector has cosine >= 0.999 with the float32
//   reference and the reference's norm (1 when normalised); `dimensions` truncates and re-normalises.
// Until the fixtures are generated and committed, each test SKIPS and says how to make them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "kiln/config.h"
#include "kiln/tokenizer.h"
#include "runtime/engine.h"
#include "server/api_error.h"
#include "server/backend_engine.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "test_tokenizer_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kiln;

namespace {

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf";

double cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

double norm(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += double(x) * x;
  return std::sqrt(s);
}

void check_fixture(const std::string& name, EmbeddingPooling pooling, bool normalize) {
  const fs::path dir = kFixtures / name;
  if (!fs::exists(dir / "embedding_reference.json"))
    GTEST_SKIP() << "fixture " << dir.string()
                 << " is absent: generate it on the device machine with `python3 "
                    "tests/fixtures/make_hf_embedding_fixture.py --out tests/fixtures/hf` and commit it";
  std::ifstream in(dir / "embedding_reference.json");
  const json ref = json::parse(in);

  const ModelConfig cfg = load_model_config(dir.string());
  EXPECT_EQ(cfg.arch, ModelArch::qwen3_embedding);
  EXPECT_EQ(cfg.pooling, pooling);
  EXPECT_EQ(cfg.normalize_embeddings, normalize);
  EXPECT_EQ(cfg.embedding_source, "modules.json");

  const Tokenizer tok = Tokenizer::load(dir.string());
  const server::TokenizerCodec codec(tok);
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

  EngineOptions o;
  o.model_dir = dir.string();
  o.device = "cpu";
  o.max_total_tokens = 4096;
  o.page_size = 16;
  o.chunked_prefill_size = 64;  // the long input goes in several chunks
  auto engine = Engine::create(o);
  test::Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : spec.inputs) {
    Request r;
    r.prompt = p;
    r.embedding = true;
    ids.push_back(engine->submit(r, sink.cb()));
  }
  // The first input again, as token ids.
  Request again;
  again.prompt = spec.inputs[0];
  again.embedding = true;
  const RequestId again_id = engine->submit(again, sink.cb());
  sink.wait_finished(int(ids.size()) + 1);

  const auto want = ref["embeddings"].get<std::vector<std::vector<double>>>();
  double worst = 1;
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenEvent e = sink.last(ids[i]);
    ASSERT_EQ(e.finish_reason, "stop") << e.error;
    ASSERT_EQ(e.embedding.size(), size_t(ref["dim"].get<int64_t>()));
    const double c = cosine(e.embedding, want[i]);
    worst = std::min(worst, c);
    EXPECT_GE(c, 0.999) << "text " << i << ": " << ref["texts"][i];
    double wn = 0;
    for (double x : want[i]) wn += x * x;
    EXPECT_NEAR(norm(e.embedding), std::sqrt(wn), 0.01 * std::sqrt(wn)) << "text " << i;
    if (normalize) {
      EXPECT_NEAR(norm(e.embedding), 1.0, 1e-5);
    }
    // dimensions = 16: the first 16 components, re-normalised (Matryoshka).
    const std::vector<float> cut = server::shape_embedding(e.embedding, 16);
    ASSERT_EQ(cut.size(), 16u);
    EXPECT_NEAR(norm(cut), 1.0, 1e-5);
    EXPECT_GE(cosine(cut, std::vector<double>(want[i].begin(), want[i].begin() + 16)), 0.999) << "text " << i;
  }
  {  // served from the prefix cache where the pooling allows it: the same vector up to rounding
    const std::vector<float> a = sink.last(again_id).embedding, b = sink.last(ids[0]).embedding;
    EXPECT_GE(cosine(a, std::vector<double>(b.begin(), b.end())), 0.99999);
  }
  std::printf("  %s: %zu texts, min cosine to sentence-transformers (fp32) %.6f (its own bf16: %.6f)\n",
              name.c_str(), ids.size(), worst, ref["bf16_min_cosine"].get<double>());
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
