// The reranker's request and reply shapes (server/rerank.h), the three prompt-logprob shapes
// (server/prompt_logprobs.h) and the ignored-field lists (server/request_fields.h), without a model.
#include <gtest/gtest.h>

#include <cmath>

#include "server/api_error.h"
#include "server/prompt_logprobs.h"
#include "server/request_fields.h"
#include "server/rerank.h"
#include "test_server_fakes.h"

namespace kiln::server {
namespace {

using fake::ByteCodec;
using nlohmann::json;

// Bytes, except that "yes" and "no" are one token each (as in Qwen3's vocabulary).
class YesNoCodec : public ByteCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    if (text == "yes") return {1000};
    if (text == "no") return {1001};
    return ByteCodec::encode(text);
  }
};

int param_error(const std::function<void()>& fn, std::string* param) {
  try {
    fn();
  } catch (const ApiError& e) {
    *param = e.param();
    return e.status();
  }
  return 200;
}

TEST(Rerank, SetupNeedsOneTokenYesAndNo) {
  try {
    make_rerank_setup(ByteCodec());
    FAIL() << "a codec spelling yes in three tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"yes\" as 3 tokens"), std::string::npos) << e.what();
  }
  const RerankSetup s = make_rerank_setup(YesNoCodec());
  EXPECT_EQ(s.yes_id, 1000);
  EXPECT_EQ(s.no_id, 1001);
}

TEST(Rerank, PromptIsTheModelCardTemplate) {
  const YesNoCodec codec;
  const RerankSetup s = make_rerank_setup(codec);
  const std::vector<int32_t> ids = rerank_prompt(s, codec, "Find it", "q?", "doc.");
  EXPECT_EQ(
      codec.decode(ids),
      "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
      "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
      "<Instruct>: Find it\n<Query>: q?\n<Document>: doc.<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
      "</think>\n\n");
  // A query the client formatted itself: query + document as they are.
  EXPECT_EQ(codec.decode(rerank_prompt(s, codec, "ignored", "<|im_start|>mine ", "doc")),
            "<|im_start|>mine doc");
}

TEST(Rerank, RequestsPairAndRefuseNamingTheField) {
  RerankSpec r = parse_rerank_request(
      json::parse(
          R"({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": false})"),
      false, "m");
  EXPECT_EQ(r.documents, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.queries, (std::vector<std::string>{"q", "q"}));
  EXPECT_EQ(r.top_n, 1u);
  EXPECT_FALSE(r.return_documents);
  r = parse_rerank_request(json::parse(R"({"text_1": "q", "text_2": ["a", "b", "c"]})"), true, "m");
  EXPECT_EQ(r.queries.size(), 3u);
  r = parse_rerank_request(json::parse(R"({"text_1": ["q1", "q2"], "text_2": ["a", "b"]})"), true, "m");
  EXPECT_EQ(r.queries, (std::vector<std::string>{"q1", "q2"}));
  std::string param;
  auto bad = [&](const char* body, bool score) {
    return param_error([&] { parse_rerank_request(json::parse(body), score, "m"); }, &param);
  };
  EXPECT_EQ(bad(R"({"text_1": ["q1", "q2"], "text_2": ["a", "b", "c"]})", true), 400);
  EXPECT_EQ(param, "text_2");
  EXPECT_EQ(bad(R"({"documents": ["a"]})", false), 400);
  EXPECT_EQ(param, "query");
  EXPECT_EQ(bad(R"({"query": "q", "documents": [3]})", false), 400);
  EXPECT_EQ(param, "documents[0]");
  EXPECT_EQ(bad(R"({"query": "q", "documents": ["a"], "top_n": -1})", false), 400);
  EXPECT_EQ(param, "top_n");
  json many = {{"query", "q"}, {"documents", json::array()}};
  for (size_t i = 0; i <= kMaxRerankDocuments; ++i) many["documents"].push_back("d");
  EXPECT_EQ(param_error([&] { parse_rerank_request(many, false, "m"); }, &param), 400);
  EXPECT_EQ(param, "documents");
}

TEST(Rerank, RepliesSortedWithTopN) {
  RerankSpec r =
      parse_rerank_request(json::parse(R"({"query": "q", "documents": ["a", "b", "c", "d"]})"), false, "m");
  const std::vector<double> scores = {0.2, 0.9, 0.2, 0.5};
  json j = rerank_response(r, scores, 40, "x", 7);
  ASSERT_EQ(j["results"].size(), 4u);
  std::vector<int> order;
  for (const auto& x : j["results"]) order.push_back(x["index"]);
  EXPECT_EQ(order, (std::vector<int>{1, 3, 0, 2}));  // ties by index
  EXPECT_EQ(j["results"][0]["document"]["text"], "b");
  EXPECT_EQ(j["usage"]["total_tokens"], 40);
  EXPECT_EQ(j["id"], "rerank-x");
  r.top_n = 2;
  r.return_documents = false;
  j = rerank_response(r, scores, 40, "x", 7);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_FALSE(j["results"][0].contains("document"));
  r.score_shape = true;
  j = rerank_response(r, scores, 40, "x", 7);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][1]["score"], 0.9);
  EXPECT_EQ(j["data"][1]["object"], "score");
  EXPECT_NEAR(rerank_score(-0.5f, -2.0f), 1.0 / (1.0 + std::exp(-1.5)), 1e-12);
}

std::vector<PromptTokenLogprob> fake_prompt_logprobs(int32_t from, int32_t n) {
  std::vector<PromptTokenLogprob> v;
  for (int32_t p = std::max(1, from); p < n; ++p)
    v.push_back({p, 'a' + p, -0.5f * float(p), p, {{'z', -0.25f}, {'a' + p, -0.5f * float(p)}}});
  return v;
}

TEST(PromptLogprobShapes, VllmEchoAndSglang) {
  const ByteCodec codec;
  const std::vector<int32_t> prompt = {'a', 'b', 'c', 'd'};
  const auto lp = fake_prompt_logprobs(1, 4);
  const json v = vllm_prompt_logprobs(prompt, lp, codec);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_TRUE(v[0].is_null());
  EXPECT_EQ(v[2]["99"]["logprob"], -1.0);
  EXPECT_EQ(v[2]["99"]["rank"], 2);
  EXPECT_EQ(v[2]["99"]["decoded_token"], "c");
  EXPECT_EQ(v[2]["122"]["rank"], 1);
  EXPECT_EQ(v[2].size(), 2u);

  json echo = {{"tokens", {"x"}},
               {"token_logprobs", {-3.0}},
               {"top_logprobs", {json::object()}},
               {"text_offset", {4}}};
  prepend_echo_logprobs(echo, prompt, lp, codec);
  EXPECT_EQ(echo["tokens"], json({"a", "b", "c", "d", "x"}));
  EXPECT_EQ(echo["token_logprobs"], json({nullptr, -0.5, -1.0, -1.5, -3.0}));
  EXPECT_TRUE(echo["top_logprobs"][0].is_null());
  EXPECT_EQ(echo["top_logprobs"][3], json({{"d", -1.5}, {"z", -0.25}}));
  EXPECT_EQ(echo["text_offset"], json({0, 1, 2, 3, 4}));
  EXPECT_EQ(prompt_text_offset(prompt, codec), 4u);

  GenSpec g;
  g.prompt = prompt;
  g.logprobs = true;
  g.top_logprobs = 1;
  parse_sglang_input_logprobs(json::parse(R"({"logprob_start_len": 1})"), g);
  EXPECT_EQ(engine_prompt_logprobs_from(g), 2);
  json meta = json::object();
  add_sglang_input_logprobs(meta, g, fake_prompt_logprobs(2, 4), codec);
  EXPECT_EQ(meta["input_token_logprobs"],
            json::parse("[[null, 98, null], [-1.0, 99, null], [-1.5, 100, null]]"));
  EXPECT_TRUE(meta["input_top_logprobs"][0].is_null());
  EXPECT_EQ(meta["input_top_logprobs"][1][0], json::parse("[-0.25, 122, null]"));
  g.sglang_logprob_start = -1;  // the default: the last prompt token only
  EXPECT_EQ(engine_prompt_logprobs_from(g), 4);
  g.sglang_logprob_start = 99;  // past the prompt: clamped to its last token
  EXPECT_EQ(engine_prompt_logprobs_from(g), 4);
}

TEST(PromptLogprobShapes, RequestFieldsAndRefusals) {
  GenSpec g;
  g.prompt = {1, 2, 3};
  EXPECT_EQ(engine_prompt_logprobs_from(g), -1);
  parse_vllm_prompt_logprobs(json::parse(R"({"prompt_logprobs": 3})"), g);
  EXPECT_EQ(engine_prompt_logprobs_from(g), 1);
  EXPECT_EQ(g.prompt_top_logprobs, 3);
  std::string param;
  GenSpec s;
  s.stream = true;
  EXPECT_EQ(
      param_error([&] { parse_vllm_prompt_logprobs(json::parse(R"({"prompt_logprobs": 1})"), s); }, &param),
      400);
  EXPECT_EQ(param, "prompt_logprobs");
  EXPECT_EQ(param_error([&] { ask_echo_logprobs(s, 1); }, &param), 400);
  EXPECT_EQ(param, "echo");
  GenSpec t;
  EXPECT_EQ(
      param_error([&] { parse_vllm_prompt_logprobs(json::parse(R"({"prompt_logprobs": 21})"), t); }, &param),
      400);
  EXPECT_EQ(param_error([&] { parse_sglang_input_logprobs(json::parse(R"({"logprob_start_len": -2})"), t); },
                        &param),
            400);
  EXPECT_EQ(param, "logprob_start_len");
}

TEST(RequestFields, VllmOutputFieldsRefusedUnlessDefault) {
  std::string param;
  for (const char* body :
       {R"({"use_beam_search": true})", R"({"allowed_token_ids": [1]})", R"({"bad_words": ["x"]})",
        R"({"skip_special_tokens": false})", R"({"priority": 2})"}) {
    EXPECT_EQ(param_error([&] { refuse_vllm_output_fields(json::parse(body)); }, &param), 400) << body;
    EXPECT_EQ(json::parse(body).begin().key(), param);
  }
  EXPECT_EQ(
      param_error(
          [&] {
            refuse_vllm_output_fields(json::parse(
                R"({"use_beam_search": false, "allowed_token_ids": [], "bad_words": null, "skip_special_tokens": true, "priority": 0})"));
          },
          &param),
      200);
}

TEST(RequestFields, UnknownFieldsAreListed) {
  const json body =
      json::parse(R"({"prompt": "a", "max_tokens": 1, "user": "u", "foo": 1, "prompt_logprobs": 1})");
  EXPECT_EQ(unknown_request_fields("/v1/completions", body), (std::vector<std::string>{"foo", "user"}));
  EXPECT_EQ(unknown_request_fields("/v1/chat/completions", body),
            (std::vector<std::string>{"foo", "prompt", "user"}));
  EXPECT_TRUE(unknown_request_fields("/v1/responses", json::parse(R"({"input": "a", "user": "u"})")).empty());
  EXPECT_EQ(unknown_request_fields("/score", json::parse(R"({"text_1": "a", "text_2": "b", "queries": 1})")),
            (std::vector<std::string>{"queries"}));
  EXPECT_TRUE(unknown_request_fields("/health", body).empty());
  EXPECT_EQ(unknown_fields_log_line("/generate", R"({"text": "a", "bogus": true})"),
            "kiln server: debug: POST /generate: fields not read by kiln (ignored): bogus");
  EXPECT_EQ(unknown_fields_log_line("/generate", "not json"), "");
}

}  // namespace
}  // namespace kiln::server
