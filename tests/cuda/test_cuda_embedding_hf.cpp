// Qwen3-Embedding fixtures (tests/fixtures/make_hf_embedding_fixture.py) on the GPU: the engine on cuda
// against sentence-transformers' vectors, with common/hf_embedding.h's bounds (cosine >= 0.999, norms,
// dimensions). Skips without a GPU, or (saying how to make them) while the fixtures are absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/hf_embedding.h"
#include "test_util_cuda.h"

namespace fs = std::filesystem;

namespace {

void check_fixture(const std::string& name, bool normalize) {
  const fs::path dir = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf" / name;
  nlohmann::json ref;
  KILN_SKIP_WITHOUT_EMBEDDING_FIXTURE(dir, ref);
  kiln::test_support::check_hf_embeddings(dir, ref, "cuda", normalize);
}

}  // namespace

TEST(CudaHfEmbedding, HubLayoutQwen3ForCausalLM) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_embedding_hub", true);
}
TEST(CudaHfEmbedding, SentenceTransformersQwen3Model) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_embedding_st", true);
}
TEST(CudaHfEmbedding, MeanPoolingWithoutNormalize) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_embedding_mean", false);
}
// Issue 41 point 8's family (see tests/unit/test_server_embedding_hf.cpp); the second has Qwen3-Embedding-
// 0.6B's odd vocabulary, which stopped `kiln serve --device cuda` while tuning an LM head it never runs.
TEST(CudaHfEmbedding, Qwen3TokenizerOneKvHeadScale02) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_embedding_qwen3tok", true);
}
TEST(CudaHfEmbedding, OddVocabulary151669) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_embedding_vocab151669", true);
}
