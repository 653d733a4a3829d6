// The HTTP server end to end over loopback, against the fake engine and byte tokenizer: SSE framing,
// usage, stop strings, logprob shapes, error shapes and statuses, auth, queue limit, disconnects,
// drain, and the accounting invariant (every accepted request ends exactly once, counted).
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <thread>

#include "test_server_harness.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

using fake::sse_payloads;

const std::string kReply = "Hello world! This is kiln.";

class Harness : public fake::ServerHarness {
 public:
  explicit Harness(ServerOptions o = {}, int step_ms = 2, std::string reply = kReply)
      : ServerHarness(std::move(reply), step_ms, o, 16) {}
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body, httplib::Headers h = {}) const {
    return client().Post(path.c_str(), h, body.dump(), "application/json");
  }
  // Waits until the server has no request in flight and the engine none live.
  bool settle() const {
    for (int i = 0; i < 2000; ++i) {  // 10 s: generous for a loaded CI machine
      if (server->counters().active == 0 && engine.live() == 0) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  void expect_accounted() const {
    ASSERT_TRUE(settle());
    const auto& c = server->counters();
    EXPECT_EQ(c.accepted.load(), c.completed.load() + c.errored.load() + c.aborted.load());
  }
};

json chat_body(json extra = json::object()) {
  json b = {{"model", "demo"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 100}};
  b.update(extra);
  return b;
}

void expect_error_shape(const httplib::Result& r, int status, const std::string& param = "") {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body);
  ASSERT_TRUE(j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param") && j["error"].contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r->body;
  }
}

}  // namespace

TEST(ServerHttp, ChatNonStreaming) {
  Harness h;
  auto r = h.post("/v1/chat/completions", chat_body());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "demo");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], kReply);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const int prompt = int(h.codec.encode("user: hi\nassistant:").size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt);
  EXPECT_EQ(j["usage"]["completion_tokens"], int(kReply.size()) + 1);  // + EOS
  EXPECT_EQ(j["usage"]["total_tokens"], prompt + int(kReply.size()) + 1);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], prompt / 4);
  h.expect_accounted();
}

TEST(ServerHttp, ChatStreamingFramingAndUsage) {
  Harness h;
  auto r = h.post("/v1/chat/completions",
                  chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  const auto frames = sse_payloads(r->body);
  ASSERT_GE(frames.size(), 4u);
  EXPECT_EQ(frames.back(), "[DONE]");
  std::string content;
  int finish_chunks = 0;
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    const json c = json::parse(frames[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    ASSERT_TRUE(c.contains("usage"));  // include_usage: null on every chunk but the last
    if (i + 2 == frames.size()) {
      EXPECT_TRUE(c["choices"].empty());
      EXPECT_EQ(c["usage"]["completion_tokens"], int(kReply.size()) + 1);
      continue;
    }
    EXPECT_TRUE(c["usage"].is_null());
    const json& ch = c["choices"][0];
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
    }
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) {
      ++finish_chunks;
      EXPECT_EQ(ch["finish_reason"], "stop");
    }
  }
  EXPECT_EQ(content, kReply);
  EXPECT_EQ(finish_chunks, 1);
  h.expect_accounted();
}

TEST(ServerHttp, StopStringSpanningTokensAbortsTheEngineRequest) {
  Harness h({}, 5);
  auto r = h.post("/v1/chat/completions", chat_body({{"stop", {"world", "zzz"}}, {"stream", true}}));
  ASSERT_TRUE(r);
  std::string content;
  std::string finish;
  for (const auto& f : sse_payloads(r->body)) {
    if (f == "[DONE]") continue;
    const json chunk = json::parse(f);
    const json& ch = chunk["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content, "Hello ");
  EXPECT_EQ(finish, "stop");
  h.expect_accounted();
  EXPECT_EQ(h.engine.stats().finished_abort, 1);  // the engine was told to stop
  // Non-streaming: usage counts the tokens up to the one completing the stop string.
  auto r2 = h.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 50}, {"stop", "rld"}});
  const json j = json::parse(r2->body);
  EXPECT_EQ(j["choices"][0]["text"], "Hello wo");
  EXPECT_EQ(j["usage"]["completion_tokens"], 11);
  h.expect_accounted();
}

TEST(ServerHttp, LengthLimitAndCompletionLogprobs) {
  Harness h;
  auto r = h.post("/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"logprobs", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"H", "e", "l", "l", "o"}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3, 4}));
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0]["b"].get<float>(), -2.0f);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  // Chat logprobs shape.
  auto c =
      h.post("/v1/chat/completions", chat_body({{"max_tokens", 2}, {"logprobs", true}, {"top_logprobs", 1}}));
  const json cj = json::parse(c->body);
  const json& content = cj["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "H");
  EXPECT_EQ(content[0]["bytes"], json({72}));
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "a");
  h.expect_accounted();
}

TEST(ServerHttp, StreamIntervalSendsFewerLargerChunksWithTheSameOutput) {
  ServerOptions o;
  o.stream_interval = 4;
  Harness h(o, 4);
  // /v1/completions with logprobs: the events of one wake become one chunk (text, tokens, offsets merged).
  auto r = h.post("/v1/completions",
                  {{"prompt", {1, 2, 3}}, {"max_tokens", 100}, {"logprobs", 1}, {"stream", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto frames = sse_payloads(r->body);
  ASSERT_GE(frames.size(), 3u);
  EXPECT_EQ(frames.back(), "[DONE]");
  std::string text;
  json tokens = json::array(), offsets = json::array();
  size_t content_chunks = 0;
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    const json c = json::parse(frames[i]);
    const json& ch = c["choices"][0];
    const std::string t = ch["text"].get<std::string>();
    if (!ch["logprobs"].is_null()) {
      for (const auto& x : ch["logprobs"]["tokens"]) tokens.push_back(x);
      for (const auto& x : ch["logprobs"]["text_offset"]) offsets.push_back(x);
    }
    if (t.empty()) continue;
    ++content_chunks;
    text += t;
  }
  EXPECT_EQ(text, kReply);
  ASSERT_EQ(tokens.size(), kReply.size() + 1);  // and EOS
  for (size_t i = 0; i < kReply.size(); ++i) {
    EXPECT_EQ(tokens[i], std::string(1, kReply[i]));
    EXPECT_EQ(offsets[i], int(i));
  }
  // 27 tokens (26 bytes and EOS): the first alone, then at most one chunk every 4 (one a token without the
  // interval, the engine stepping every 4 ms).
  EXPECT_LE(content_chunks, 1 + (kReply.size() + 1 + 3) / 4) << r->body;
  // /generate streams cumulative frames: the last text and ids are the whole reply.
  auto g =
      h.post("/generate",
             {{"input_ids", {1, 2, 3}}, {"sampling_params", {{"max_new_tokens", 100}}}, {"stream", true}});
  ASSERT_TRUE(g);
  ASSERT_EQ(g->status, 200) << g->body;
  const auto gf = sse_payloads(g->body);
  ASSERT_GE(gf.size(), 2u);
  EXPECT_LE(gf.size(), 2 + (kReply.size() + 1 + 3) / 4);
  const json last = json::parse(gf[gf.size() - 2]);
  EXPECT_EQ(last["text"], kReply);
  EXPECT_EQ(last["meta_info"]["completion_tokens"], int(kReply.size()) + 1);
  h.expect_accounted();
}

TEST(ServerHttp, SglangGenerate) {
  Harness h;
  auto r = h.post("/generate", {{"text", "ab"},
                                {"sampling_params", {{"max_new_tokens", 3}, {"temperature", 0}}},
                                {"return_logprob", true},
                                {"return_hidden_states", true}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["text"], "Hel");
  EXPECT_EQ(j["output_ids"], json({72, 101, 108}));
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(j["meta_info"]["prompt_tokens"], 2);
  EXPECT_EQ(j["meta_info"]["completion_tokens"], 3);
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"].size(), 3u);
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"][0][1], 72);
  EXPECT_EQ(j["meta_info"]["hidden_states"], json({{1.0, 2.0}}));
  // Streaming: cumulative text, a final frame with the finish reason, then [DONE].
  auto s = h.post("/generate", {{"input_ids", {1, 2}},
                                {"sampling_params", {{"max_new_tokens", 4}, {"stop_token_ids", {108}}}},
                                {"stream", true}});
  const auto frames = sse_payloads(s->body);
  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames.back(), "[DONE]");
  const json last = json::parse(frames[frames.size() - 2]);
  EXPECT_EQ(last["text"], "He");  // the stop token's text is not shown
  EXPECT_EQ(last["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(last["meta_info"]["finish_reason"]["matched"], 108);
  EXPECT_EQ(last["meta_info"]["completion_tokens"], 3);
  h.expect_accounted();
}

TEST(ServerHttp, BadInputsGetOpenAIErrorsAndTheServerGoesOn) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  Harness h(o);
  auto cli = h.client();
  expect_error_shape(cli.Post("/v1/chat/completions", "{\"messages\": [", "application/json"), 400);
  expect_error_shape(cli.Post("/v1/chat/completions", "\"just a string\"", "application/json"), 400);
  expect_error_shape(cli.Post("/v1/completions", "{\"prompt\": \"\xc3\x28\"}", "application/json"), 400);
  expect_error_shape(h.post("/v1/chat/completions", chat_body({{"temperature", "hot"}})), 400, "temperature");
  expect_error_shape(h.post("/v1/chat/completions", chat_body({{"n", 17}})), 400, "n");
  expect_error_shape(h.post("/v1/completions", {{"prompt", {1, 100000}}}), 400, "prompt");
  expect_error_shape(h.post("/v1/completions", {{"prompt", ""}}), 400, "prompt");
  expect_error_shape(h.post("/v1/chat/completions", chat_body({{"model", "gpt-9"}})), 404, "model");
  expect_error_shape(cli.Post("/v1/completions", std::string(5000, ' '), "application/json"), 413);
  expect_error_shape(cli.Get("/v1/nothing"), 404);
  expect_error_shape(h.post("/v1/embeddings", {{"input", "a"}}), 400, "model");  // not an embedding model
  // Nothing was submitted, and the server still serves.
  EXPECT_EQ(h.server->counters().accepted, 0);
  EXPECT_GE(h.server->counters().rejected_invalid, 10);
  auto ok = h.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}});
  EXPECT_EQ(ok->status, 200);
  h.expect_accounted();
}

TEST(ServerHttp, ApiKeyAndOpenRoutes) {
  ServerOptions o;
  o.api_key = "sekret";
  Harness h(o);
  expect_error_shape(h.post("/v1/completions", {{"prompt", "a"}}), 401);
  expect_error_shape(h.post("/v1/completions", {{"prompt", "a"}}, {{"Authorization", "Bearer wrong"}}), 401);
  auto ok =
      h.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}}, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(h.client().Get("/health")->status, 200);
  EXPECT_EQ(h.client().Get("/metrics")->status, 200);
  EXPECT_EQ(h.client().Get("/v1/models")->status, 401);
  h.expect_accounted();
}

TEST(ServerHttp, PortInUseIsAnError) {
  Harness h;
  fake::ByteCodec codec;
  fake::FakeEngine engine;
  ServerOptions o;
  o.port = h.port;
  ApiServer second(engine, codec, o);
  EXPECT_THROW(second.bind(), kiln::Error);
}

TEST(ServerHttp, QueueFullIs503WithRetryAfter) {
  Harness h;
  h.engine.max_active = 0;
  auto r = h.post("/v1/completions", {{"prompt", "a"}});
  expect_error_shape(r, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(h.server->counters().rejected_busy, 1);
}

TEST(ServerHttp, ClientDisconnectAbortsTheRequest) {
  Harness h({}, 20, std::string(400, 'z'));
  auto cli = h.client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = chat_body({{"stream", true}, {"max_tokens", 300}}).dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto r = cli.send(req);  // the receiver gives up after 3 chunks: the client closes the socket
  EXPECT_GE(chunks, 3);
  ASSERT_TRUE(h.settle()) << "engine still has " << h.engine.live() << " live requests";
  EXPECT_EQ(h.server->counters().aborted, 1);
  EXPECT_EQ(h.engine.stats().finished_abort, 1);
  EXPECT_LT(h.engine.stats().generation_tokens_total, 100);  // stopped early, not run to 300
  // Non-streaming requests are watched the same way.
  {
    httplib::Client c2("127.0.0.1", h.port);
    c2.set_read_timeout(0, 200000);  // gives up after 200 ms, long before 300 tokens at 20 ms each
    auto r2 = c2.Post("/v1/chat/completions", chat_body({{"max_tokens", 300}}).dump(), "application/json");
    EXPECT_FALSE(r2);
  }
  ASSERT_TRUE(h.settle());
  EXPECT_EQ(h.server->counters().aborted, 2);
  h.expect_accounted();
}

TEST(ServerHttp, EngineErrorIsReportedAndCounted) {
  Harness h;
  h.engine.fail_requests = true;
  auto s = h.post("/v1/chat/completions", chat_body({{"stream", true}}));
  const auto frames = sse_payloads(s->body);
  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames.back(), "[DONE]");
  EXPECT_TRUE(json::parse(frames[frames.size() - 2]).contains("error"));
  auto r = h.post("/v1/completions", {{"prompt", "a"}});
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  h.expect_accounted();
  EXPECT_EQ(h.server->counters().errored, 2);
}

TEST(ServerHttp, Embeddings) {
  Harness h;
  h.engine.embedding_model = true;
  auto r = h.post("/v1/embeddings", {{"model", "demo"}, {"input", {"ab", "abcd"}}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(j["data"][i]["index"], i);
    double ss = 0;
    for (const auto& x : j["data"][i]["embedding"]) ss += x.get<double>() * x.get<double>();
    EXPECT_NEAR(ss, 1.0, 1e-5);
  }
  EXPECT_NE(j["data"][0]["embedding"], j["data"][1]["embedding"]);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);
  auto b = h.post("/v1/embeddings", {{"input", "ab"}, {"encoding_format", "base64"}, {"dimensions", 4}});
  const std::string b64 = json::parse(b->body)["data"][0]["embedding"];
  EXPECT_EQ(b64.size(), 24u);  // 4 floats = 16 bytes -> 24 base64 chars
  expect_error_shape(h.post("/v1/chat/completions", chat_body()), 400);  // generation on an embedding model
  h.expect_accounted();
}

TEST(ServerHttp, DrainRefusesNewWorkAndMetricsAccountForAll) {
  Harness h;
  auto ok = h.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}});
  EXPECT_EQ(ok->status, 200);
  // The outcome is counted once the response has been handed to the socket, which can be just after the
  // client has read it: poll /metrics briefly rather than race the server's connection thread.
  const std::string completed =
      "kiln_server_requests_finished_total{model_name=\"demo\",outcome=\"completed\"} 1\n";
  auto m = h.client().Get("/metrics");
  for (int i = 0; i < 200 && m && m->body.find(completed) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = h.client().Get("/metrics");
  }
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("kiln_server_requests_accepted_total{model_name=\"demo\"} 1\n"), std::string::npos)
      << m->body;
  EXPECT_NE(
      m->body.find("kiln_server_requests_finished_total{model_name=\"demo\",outcome=\"completed\"} 1\n"),
      std::string::npos);
  auto models = json::parse(h.client().Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "demo");
  EXPECT_EQ(h.post("/flush_cache", json::object())->status, 200);
  EXPECT_EQ(h.engine.flushes, 1);
  h.server->begin_drain();
  expect_error_shape(h.post("/v1/completions", {{"prompt", "a"}}), 503);
  EXPECT_EQ(h.client().Get("/health")->status, 503);
  EXPECT_TRUE(h.server->wait_idle(1s));
}

TEST(ServerHttp, MutatedBodiesGet200Or4xxNever5xx) {
  Harness h;
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"/v1/chat/completions",
       chat_body({{"max_tokens", 3}, {"stop", {"x"}}, {"logprobs", true}, {"top_logprobs", 1}}).dump()},
      {"/v1/completions", json({{"prompt", {1, 2, 3}}, {"max_tokens", 2}, {"stream", true}}).dump()},
      {"/generate",
       json({{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 2}, {"top_k", 3}}}}).dump()},
      {"/v1/embeddings", json({{"input", {"a", "b"}}, {"encoding_format", "base64"}}).dump()}};
  uint64_t rng = 12345;
  auto next = [&] {
    return rng = rng * 6364136223846793005ull + 1442695040888963407ull, uint32_t(rng >> 33);
  };
  auto cli = h.client();
  int ok = 0, bad = 0;
  for (int i = 0; i < 300; ++i) {
    const auto& [path, seed] = seeds[size_t(i) % seeds.size()];
    std::string body = seed;
    switch (next() % 4) {
      case 0:
        body.resize(next() % body.size());
        break;  // truncated
      case 1:
        body[next() % body.size()] = char(next() % 256);
        break;  // one byte replaced
      case 2:
        body.insert(next() % body.size(), std::string(1, "{}[],:\"0-e\\"[next() % 11]));
        break;
      default:
        std::swap(body[next() % body.size()], body[next() % body.size()]);
        break;
    }
    auto r = cli.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r) << "no response for " << body;
    ASSERT_LT(r->status, 500) << path << " " << body << " -> " << r->body;
    (r->status == 200 ? ok : bad)++;
    if (r->status != 200) {
      ASSERT_TRUE(json::parse(r->body).contains("error")) << r->body;
    }
  }
  EXPECT_GT(bad, 100);  // most mutations break the request...
  EXPECT_GT(ok, 10);    // ...some still make a valid one
  h.expect_accounted();
}
