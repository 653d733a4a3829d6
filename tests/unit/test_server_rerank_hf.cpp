// The Qwen3-Reranker against transformers (tests/fixtures/hf/qwen3_reranker_tiny, made by
// scripts/make_reranker_fixture.py on the device machine): kiln's reranker prompt (server/rerank.h) gives the
// model card's token ids, and the engine's score sigmoid(logprob(yes) - logprob(no)) at the last row equals
// transformers' softmax over (no, yes), within the fixture's own bf16-vs-fp32 drift. Skipped (and said so)
// while the fixture or the npm Qwen3 tokenizer is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "engine_test_util.h"
#include "kiln/tokenizer.h"
#include "server/backend_engine.h"
#include "server/rerank.h"
#include "test_tokenizer_util.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(HfReranker, PromptIdsAndScoresEqualTransformers) {
  const fs::path src = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf/qwen3_reranker_tiny";
  if (!fs::exists(src / "reranker_reference.json"))
    GTEST_SKIP() << src
                 << " is absent: make it with scripts/make_reranker_fixture.py (torch and transformers)";
  const std::string tok_file = test::qwen3_tokenizer_dir() + "/tokenizer.json";
  if (!std::ifstream(tok_file).good())
    GTEST_SKIP() << tok_file << " is absent (scripts/bootstrap.sh installs it)";
  const json ref = json::parse(std::ifstream(src / "reranker_reference.json"));
  // The checkpoint as the hub ships it: the fixture's files and the tokenizer.json it was made with.
  const fs::path dir = test_support::process_scratch_dir("reranker_hf") / "ckpt";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src))
    fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  fs::copy_file(tok_file, dir / "tokenizer.json", fs::copy_options::overwrite_existing);

  const TokenizerCodec codec(Tokenizer::load(dir.string()));
  const RerankSetup setup = make_rerank_setup(codec);
  EXPECT_EQ(setup.yes_id, ref["yes_id"].get<int32_t>());
  EXPECT_EQ(setup.no_id, ref["no_id"].get<int32_t>());

  EngineOptions o;
  o.model_dir = dir.string();
  o.device = "cpu";
  o.max_total_tokens = 4096;
  o.page_size = 16;
  auto engine = Engine::create(o);
  test::Sink sink;
  std::vector<RequestId> ids;
  for (const json& p : ref["pairs"]) {
    const std::vector<int32_t> want = p["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(rerank_prompt(setup, codec, ref["instruction"], p["query"], p["document"]), want)
        << "prompt of " << p["query"] << " / " << p["document"];
    Request r = test::greedy(want, 0);
    r.score_ids = {setup.no_id, setup.yes_id};
    ids.push_back(engine->submit(r, sink.cb()));
  }
  sink.wait_finished(int(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& p = ref["pairs"][i];
    const TokenEvent e = sink.last(ids[i]);
    ASSERT_EQ(e.score_logprobs.size(), 2u) << e.error;
    const double got = rerank_score(e.score_logprobs[1], e.score_logprobs[0]);
    const double fp32 = p["score_fp32"], bf16 = p["score_bf16"];
    const double bound = 2 * std::fabs(bf16 - fp32) + 0.01;  // a bf16 engine's noise, from HF's own bf16 run
    EXPECT_NEAR(got, fp32, bound) << "pair " << i << " (HF bf16 " << bf16 << ")";
    const double diff = double(e.score_logprobs[1]) - double(e.score_logprobs[0]);
    const double ref_diff = p["logit_yes_fp32"].get<double>() - p["logit_no_fp32"].get<double>();
    const double ref_bf16 = p["logit_yes_bf16"].get<double>() - p["logit_no_bf16"].get<double>();
    EXPECT_NEAR(diff, ref_diff, 2 * std::fabs(ref_bf16 - ref_diff) + 0.1) << "pair " << i;
  }
}

}  // namespace
}  // namespace kiln::server
