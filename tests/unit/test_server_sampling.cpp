// Sampling requests over HTTP against the fake engine: penalties, logit_bias and min_tokens reach the
// engine as given; n choices are n engine requests (seeds seed, seed+1, ...; the later ones wait for
// the first one's prefill) answered as one response: choices[].index, streaming chunks with their index,
// usage with the prompt counted once, /generate as a list.
#include <gtest/gtest.h>
#include <httplib.h>

#include <mutex>
#include <set>

#include "test_server_harness.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;

namespace {

class Harness : public fake::ServerHarness {
 public:
  Harness() : ServerHarness("unused", 1, ServerOptions{}, 8) {
    // Each request replies with its seed's digit repeated (seed % 10 + '0'), 3 tokens, then EOS.
    engine.script = [this](const Request& r) {
      std::lock_guard<std::mutex> lk(mu);
      seen.push_back(r);
      return std::vector<int32_t>(3, int32_t('0' + (r.sampling.seed >= 0 ? r.sampling.seed % 10 : 9)));
    };
  }
  httplib::Result post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lk(mu);
    return seen;
  }
  std::mutex mu;
  std::vector<Request> seen;
};

json chat(json extra) {
  json b = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 10}};
  b.update(extra);
  return b;
}

std::vector<json> sse_json(const std::string& body, int* done) {
  std::vector<json> out;
  *done = 0;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string p = body.substr(pos + 6, end - pos - 6);
    if (p == "[DONE]")
      ++*done;
    else
      out.push_back(json::parse(p));
    pos = end;
  }
  return out;
}

}  // namespace

TEST(ServerSampling, PenaltiesBiasAndMinTokensReachTheEngine) {
  Harness h;
  auto r = h.post("/v1/chat/completions", chat({{"presence_penalty", 0.5},
                                                {"frequency_penalty", -0.25},
                                                {"repetition_penalty", 1.2},
                                                {"logit_bias", {{"65", 5}, {"66", -100}}},
                                                {"min_tokens", 2},
                                                {"stop_token_ids", {70}}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto reqs = h.requests();
  ASSERT_EQ(reqs.size(), 1u);
  const SamplingParams& s = reqs[0].sampling;
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.25f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.2f);
  EXPECT_EQ(s.logit_bias.size(), 2u);
  EXPECT_EQ(s.min_new_tokens, 2);
  EXPECT_EQ(s.stop_token_ids, std::vector<int32_t>{70});
  EXPECT_EQ(reqs[0].after_prefill_of, 0u);
  // SGLang's names inside sampling_params.
  r = h.post("/generate", {{"text", "hi"},
                           {"sampling_params",
                            {{"repetition_penalty", 1.5}, {"min_new_tokens", 1}, {"presence_penalty", 1}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FLOAT_EQ(h.requests().back().sampling.repetition_penalty, 1.5f);
  EXPECT_EQ(h.requests().back().sampling.min_new_tokens, 1);
  // Out of range: 400 naming the field, nothing submitted.
  for (const json& bad : {json{{"n", 17}}, json{{"presence_penalty", 3}}, json{{"repetition_penalty", -1}},
                          json{{"logit_bias", {{"5", 200}}}}, json{{"min_tokens", 11}}}) {
    r = h.post("/v1/chat/completions", chat(bad));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad.dump();
  }
  EXPECT_EQ(h.requests().size(), 2u);
}

TEST(ServerSampling, ChatWithNChoices) {
  Harness h;
  auto r = h.post("/v1/chat/completions", chat({{"n", 3}, {"seed", 4}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], std::string(3, char('4' + i)));
    EXPECT_EQ(j["choices"][i]["finish_reason"], "stop");
  }
  const int prompt = int(h.codec.encode("user: hi\nassistant:").size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt);     // once
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * 4);  // every choice's (3 + EOS each)
  EXPECT_EQ(j["usage"]["total_tokens"], prompt + 12);
  const auto reqs = h.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].after_prefill_of, 0u);
  EXPECT_NE(reqs[1].after_prefill_of, 0u);
  EXPECT_EQ(reqs[1].after_prefill_of, reqs[2].after_prefill_of);
  EXPECT_EQ(reqs[2].sampling.seed, 6);
  // Streaming: each choice's deltas and finish under its index, one usage chunk, one [DONE].
  r = h.post("/v1/chat/completions",
             chat({{"n", 2}, {"seed", 7}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(r->status, 200);
  int done = 0;
  const auto chunks = sse_json(r->body, &done);
  EXPECT_EQ(done, 1);
  std::string text[2];
  int finishes[2] = {0, 0}, usage_chunks = 0;
  for (const json& c : chunks) {
    if (c["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(c["usage"]["completion_tokens"], 8);
      EXPECT_EQ(c["usage"]["prompt_tokens"], prompt);
      continue;
    }
    const int i = c["choices"][0]["index"];
    ASSERT_TRUE(i == 0 || i == 1);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) text[i] += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) ++finishes[i];
  }
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_EQ(text[0], "777");
  EXPECT_EQ(text[1], "888");
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
}

TEST(ServerSampling, CompletionsAndGenerateWithN) {
  Harness h;
  auto r = h.post("/v1/completions", {{"prompt", "ab"}, {"n", 2}, {"seed", 1}, {"stop", "2"}});
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], "111");
  EXPECT_EQ(j["choices"][1]["text"], "");  // its stop string came first
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  r = h.post("/generate", {{"text", "ab"}, {"sampling_params", {{"n", 3}, {"sampling_seed", 0}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j[i]["index"], i);
    texts.insert(j[i]["text"].get<std::string>());
  }
  EXPECT_EQ(texts.size(), 3u);
  r = h.post("/generate",
             {{"text", "ab"}, {"stream", true}, {"sampling_params", {{"n", 2}, {"sampling_seed", 5}}}});
  ASSERT_EQ(r->status, 200);
  int done = 0;
  std::set<int> indices;
  for (const json& f : sse_json(r->body, &done)) indices.insert(f["index"].get<int>());
  EXPECT_EQ(indices, (std::set<int>{0, 1}));
  EXPECT_EQ(done, 1);
}
