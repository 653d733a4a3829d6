// Hostile requests against the real server over loopback (fake engine and byte tokenizer): JSON nested past
// the depth limit in every field a walk reaches, Transfer-Encodings other than chunked (request smuggling),
// probes past the connection cap, the Bearer scheme in any case, source locations kept out of error bodies,
// one long tokenized embedding input. Each was a crash or a wrong answer before (issue 41).
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "kiln/json_depth.h"
#include "scale_client.h"
#include "server/api_error.h"
#include "test_server_harness.h"

using namespace kiln;
using namespace kiln::server;
using namespace kiln::test::scale;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

class Harness : public fake::ServerHarness {
 public:
  explicit Harness(ServerOptions o = {}) : ServerHarness("Hello world!", 2, o, 4) {}
  httplib::Result post_raw(const std::string& path, const std::string& body, httplib::Headers h = {}) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c.Post(path.c_str(), h, body, "application/json");
  }
  int health() const {
    int status = 0;
    timed_get(port, "/health", &status);
    return status;
  }
};

std::string nested(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// A chat request with `deep` spliced in where `at` says (a JSON text with the placeholder "@").
std::string chat_with(const std::string& at, const std::string& deep) {
  std::string body =
      R"({"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], )" + at + "}";
  body.replace(body.find('@'), 1, deep);
  return body;
}

// One raw request on a fresh connection; everything the server sent until it closed (or 5 s).
std::string roundtrip(int port, const std::string& request, bool* closed = nullptr) {
  Conn c;
  c.fd = dial(port);
  c.out = request;
  std::vector<Conn*> one{&c};
  const bool all = pump(one, Clock::now() + 5s);
  ::close(c.fd);
  if (closed) *closed = all;
  return c.in;
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(JsonDepth, CountsBracketsOutsideStringsOnly) {
  EXPECT_EQ(json_nesting_depth("1"), 0u);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4u);
  EXPECT_EQ(json_nesting_depth(R"(["[[[[", "\"[[[", "\\", {}])"), 2u);  // brackets in strings, escapes
  EXPECT_EQ(json_nesting_depth(nested(100000)), 100000u);
  EXPECT_EQ(json_nesting_depth(nested(100000), 128), 129u);  // stops counting past the limit
  EXPECT_NO_THROW(check_json_depth(nested(kMaxJsonDepth), "x"));
  try {
    check_json_depth(nested(kMaxJsonDepth + 1), "the request body");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "the request body nests deeper than 128 levels (kiln's limit for JSON inputs)");
  }
}

// Before: SIGSEGV in a recursive copy or dump of the body (ApiServer::Impl::route), 100,000 levels deep.
TEST(ServerHardening, DeepJsonIs400InEveryFieldAndTheServerGoesOn) {
  Harness h;
  const std::string deep = nested(100000);
  for (const std::string& at :
       {std::string(R"("x": @)"),
        std::string(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": @}}])"),
        std::string(R"("documents": @)"), std::string(R"("chat_template_kwargs": {"k": @})"),
        std::string(R"("logit_bias": {"1": @})")}) {
    const auto r = h.post_raw("/v1/chat/completions", chat_with(at, deep));
    ASSERT_TRUE(r) << at << ": no response (the server died?)";
    EXPECT_EQ(r->status, 400) << at;
    EXPECT_NE(r->body.find("nests deeper than 128 levels"), std::string::npos) << r->body;
  }
  // In a message, and on the other endpoints.
  std::string in_message =
      R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": @}}]}]})";
  in_message.replace(in_message.find('@'), 1, deep);
  EXPECT_EQ(h.post_raw("/v1/chat/completions", in_message)->status, 400);
  EXPECT_EQ(h.post_raw("/v1/completions", R"({"prompt": "a", "x": )" + deep + "}")->status, 400);
  EXPECT_EQ(h.post_raw("/generate", R"({"text": "a", "sampling_params": )" + deep + "}")->status, 400);
  // At the limit, depth is not the problem (the 'x' field is ignored).
  const auto ok = h.post_raw("/v1/chat/completions", chat_with(R"("x": @)", nested(kMaxJsonDepth - 1)));
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(h.health(), 200);
  EXPECT_EQ(h.server->counters().rejected_invalid, 8);
}

// Before: "gzip" (or "chunked, gzip") framed no body, and the body was served as the next request.
TEST(ServerHardening, TransferEncodingOtherThanChunkedIs400AndCloses) {
  Harness h;
  const std::string smuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  auto request = [&](const std::string& te_lines) {
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + te_lines +
           "\r\n" + smuggled;
  };
  for (const std::string te : {"Transfer-Encoding: gzip\r\n", "Transfer-Encoding: chunked, gzip\r\n",
                               "Transfer-Encoding: gzip, chunked\r\n", "Transfer-Encoding: identity\r\n",
                               "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                               "Transfer-Encoding: chunked\r\nContent-Length: 35\r\n"}) {
    bool closed = false;
    const std::string reply = roundtrip(h.port, request(te), &closed);
    EXPECT_EQ(status_of(reply), 400) << te << reply;
    EXPECT_EQ(count_of(reply, "HTTP/1.1 "), 1u) << te << ": the body was served as a request\n" << reply;
    EXPECT_TRUE(closed) << te;
    if (status_of(reply) == 400 && te.find("Content-Length") == std::string::npos) {
      EXPECT_NE(body_of(reply).find("Transfer-Encoding"), std::string::npos) << reply;
    }
  }
  // chunked in any case is the one accepted framing.
  const std::string body = R"({"prompt": "a", "max_tokens": 2})";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size());
  const std::string reply = roundtrip(h.port,
                                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      "Transfer-Encoding: Chunked\r\n\r\n" +
                                          std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n");
  EXPECT_EQ(status_of(reply), 200) << reply;
  EXPECT_EQ(h.health(), 200);
}

// Before: twenty idle connections at --max-connections 20 made /health and /metrics answer 503.
TEST(ServerHardening, ProbesAreAnsweredPastTheConnectionCap) {
  ServerOptions o;
  o.max_connections = 20;
  o.idle_timeout = 30s;
  Harness h(o);
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(dial(h.port));
  ASSERT_TRUE([&] {
    for (int i = 0; i < 1000 && h.server->counters().connections_open < 20; ++i)
      std::this_thread::sleep_for(5ms);
    return h.server->counters().connections_open == 20;
  }());
  for (const char* path : {"/health", "/metrics", "/v1/models"}) {
    int status = 0;
    std::string body;
    timed_get(h.port, path, &status, &body);
    EXPECT_EQ(status, 200) << path << ": " << body;
  }
  // Work past the cap is still refused, with the cap named.
  const std::string reply = roundtrip(h.port, post_request("/v1/completions", R"({"prompt": "a"})"));
  EXPECT_EQ(status_of(reply), 503) << reply;
  EXPECT_EQ(header_of(reply, "Retry-After"), "1");
  EXPECT_NE(reply.find("--max-connections 20"), std::string::npos) << reply;
  // One that sends nothing gets the 503 when its time is up, and is closed.
  Conn silent;
  silent.fd = dial(h.port);
  std::vector<Conn*> one{&silent};
  EXPECT_TRUE(pump(one, Clock::now() + 5s));
  ::close(silent.fd);
  EXPECT_EQ(status_of(silent.in), 503) << silent.in;
  EXPECT_EQ(h.server->counters().connections_open, 20);
  EXPECT_EQ(h.server->counters().connections_rejected, 2);  // the answered probes are not refusals
  for (int fd : idle) ::close(fd);
}

TEST(ServerHardening, BearerSchemeIsCaseInsensitive) {
  ServerOptions o;
  o.api_key = "sekrit";
  Harness h(o);
  const std::string body = R"({"prompt": "a", "max_tokens": 1})";
  for (const char* auth : {"Bearer sekrit", "bearer sekrit", "BEARER sekrit", "bEaReR sekrit"})
    EXPECT_EQ(h.post_raw("/v1/completions", body, {{"Authorization", auth}})->status, 200) << auth;
  for (const char* auth : {"Bearer wrong", "Bearersekrit", "Basic sekrit", "Bearer  sekrit", "sekrit", ""})
    EXPECT_EQ(h.post_raw("/v1/completions", body, {{"Authorization", auth}})->status, 401) << auth;
}

TEST(ServerHardening, ErrorBodiesCarryNoSourceLocations) {
  EXPECT_EQ(strip_source_locations("bad p [src/runtime/sampler.cpp:14]"), "bad p");
  EXPECT_EQ(strip_source_locations("a [src/x.cpp:1]: b [include/kiln/y.h:22] c"), "a: b c");
  EXPECT_EQ(strip_source_locations("keep [this] and [src/no line] and [1, 2]"),
            "keep [this] and [src/no line] and [1, 2]");
  EXPECT_EQ(strip_source_locations("ends with [tests/unit/a.cpp:9]"), "ends with");
  EXPECT_EQ(error_body(400, "x [src/a.cpp:3]")["error"]["message"], "x");
  Harness h;
  h.engine.fail_message = "sampler check failed [src/runtime/sampler.cpp:14]";
  h.engine.fail_requests = true;
  const auto r = h.post_raw("/v1/completions", R"({"prompt": "a"})");
  ASSERT_TRUE(r);  // a failure after acceptance: a 200 whose body is the error object (docs/SERVING.md)
  EXPECT_TRUE(json::parse(r->body).contains("error")) << r->body;
  EXPECT_EQ(r->body.find("src/"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("sampler check failed"), std::string::npos) << r->body;
}

// Before: a flat list of more than 256 ids was refused as "more than 256 items".
TEST(ServerHardening, OneTokenizedEmbeddingInputMayHoldMoreThan256Ids) {
  Harness h;
  h.engine.embedding_model = true;
  json ids = json::array();
  for (int i = 0; i < 400; ++i) ids.push_back(65 + i % 26);
  const auto r = h.post_raw("/v1/embeddings", json({{"input", ids}}).dump());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["data"].size(), 1u);
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], 400);
  // Past the context it is refused by length; the number of inputs stays capped at 256.
  json longer = json::array();
  for (int i = 0; i < 600; ++i) longer.push_back(65);
  const auto too_long = h.post_raw("/v1/embeddings", json({{"input", longer}}).dump());
  EXPECT_EQ(too_long->status, 400);
  EXPECT_NE(too_long->body.find("the maximum is 512"), std::string::npos) << too_long->body;
  const auto too_many =
      h.post_raw("/v1/embeddings", json({{"input", json(std::vector<std::string>(257, "a"))}}).dump());
  EXPECT_EQ(too_many->status, 400);
  EXPECT_NE(too_many->body.find("at most 256 inputs"), std::string::npos) << too_many->body;
}
