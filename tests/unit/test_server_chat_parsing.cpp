// Reasoning and tool-call parsing through the real HTTP server and SSE path, with the fake engine
// "generating" Qwen3-shaped output byte by byte (so every tag is split across tokens): the JSON shapes of
// message.reasoning_content / tool_calls and of the streamed deltas, finish_reason "tool_calls", the
// request switches (tool_choice, enable_thinking, separate_reasoning) and the server's --reasoning-parser.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "test_server_harness.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string kThinkAndCalls =
    "<think>\nThe user wants weather, é中.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": "
    "\"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
    "\"get_time\", "
    "\"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";

struct Harness : fake::ServerHarness {
  explicit Harness(std::string reply, ServerOptions o = {}) : ServerHarness(std::move(reply), 1, o, 8) {}
  httplib::Result post(const json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c.Post("/v1/chat/completions", body.dump(), "application/json");
  }
};

const json kTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "get_weather"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}},
     {{"type", "function"}, {"function", {{"name", "get_time"}}}}});

json body(json extra = json::object()) {
  json b = {{"messages", {{{"role", "user"}, {"content", "weather?"}}}}, {"max_tokens", 400}};
  b.update(extra);
  return b;
}

json ok_json(const httplib::Result& r) {
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, 200) << r->body;
  return json::parse(r->body);
}

// What a streaming client assembles from the deltas.
struct Streamed {
  std::string content, reasoning;
  json calls = json::array();  // by index: {id, type, function: {name, arguments}}
  std::string finish_reason;
  int finish_chunks = 0;
};

Streamed read_stream(const httplib::Result& r) {
  Streamed s;
  EXPECT_TRUE(r);
  if (!r) return s;
  EXPECT_EQ(r->status, 200) << r->body;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") break;
    const json c = json::parse(payload);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const json& ch = c["choices"][0];
    const json& d = ch["delta"];
    if (d.contains("content")) s.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const auto& tc : d["tool_calls"]) {
        const size_t i = tc["index"].get<size_t>();
        EXPECT_EQ(i, s.calls.size());  // each call arrives whole, in order
        s.calls.push_back({{"id", tc["id"]}, {"type", tc["type"]}, {"function", tc["function"]}});
      }
    if (!ch["finish_reason"].is_null()) {
      ++s.finish_chunks;
      s.finish_reason = ch["finish_reason"].get<std::string>();
    }
  }
  return s;
}

void expect_two_calls(const json& calls) {
  ASSERT_EQ(calls.size(), 2u) << calls.dump();
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}, {"unit", "°C"}}));
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(calls[1]["function"]["arguments"], R"({"tz":"CET"})");
  const std::string id0 = calls[0]["id"], id1 = calls[1]["id"];
  EXPECT_EQ(id0.rfind("call_", 0), 0u);
  EXPECT_NE(id0, id1);
}

}  // namespace

TEST(ServerChatParsing, ReasoningAndToolCallsNonStreaming) {
  Harness h(kThinkAndCalls);
  const json j = ok_json(h.post(body({{"tools", kTools}})));
  const json& m = j["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["reasoning_content"], "The user wants weather, é中.");
  EXPECT_EQ(m["content"], "Let me check.");
  expect_two_calls(m["tool_calls"]);
  EXPECT_FALSE(m["tool_calls"][0].contains("index"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["usage"]["completion_tokens"], int(kThinkAndCalls.size()) + 1);
}

TEST(ServerChatParsing, ReasoningAndToolCallsStreaming) {
  Harness h(kThinkAndCalls);
  const Streamed s = read_stream(h.post(body({{"tools", kTools}, {"stream", true}})));
  EXPECT_EQ(s.reasoning, "The user wants weather, é中.");
  EXPECT_EQ(s.content, "Let me check.");
  expect_two_calls(s.calls);
  EXPECT_EQ(s.finish_chunks, 1);
  EXPECT_EQ(s.finish_reason, "tool_calls");
}

TEST(ServerChatParsing, OnlyACallGivesNullContent) {
  Harness h("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>");
  const json j = ok_json(h.post(body({{"tools", kTools}})));
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null()) << j.dump();
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ServerChatParsing, ToolChoiceNoneAndNoToolsLeaveTagsInContent) {
  Harness h(kThinkAndCalls);
  const std::string after_think = kThinkAndCalls.substr(kThinkAndCalls.find("Let me"));
  for (const json& extra : {json({{"tools", kTools}, {"tool_choice", "none"}}), json::object()}) {
    const json j = ok_json(h.post(body(extra)));
    EXPECT_EQ(j["choices"][0]["message"]["content"], after_think) << extra.dump();
    EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "The user wants weather, é中.");
    EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    json sb = body(extra);
    sb["stream"] = true;
    const Streamed s = read_stream(h.post(sb));
    EXPECT_EQ(s.content, after_think);
    EXPECT_EQ(s.reasoning, "The user wants weather, é中.");
    EXPECT_TRUE(s.calls.empty());
    EXPECT_EQ(s.finish_reason, "stop");
  }
}

TEST(ServerChatParsing, RequiredOrNamedToolChoiceIsParsedAndBadChoicesRefused) {
  // "required" and a named function are forced by a grammar (test_server_structured_output.cpp); the fake
  // engine's reply is fixed, so here only the parsing of what comes back is checked.
  Harness h(kThinkAndCalls);
  const json named = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  for (const json& tc : {json("required"), named}) {
    const json j = ok_json(h.post(body({{"tools", kTools}, {"tool_choice", tc}})));
    EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 2u) << tc.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  }
  const json unknown = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  for (const json& tc : {json("sometimes"), json(3), unknown}) {
    auto r = h.post(body({{"tools", kTools}, {"tool_choice", tc}}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << tc.dump();
    const json e = json::parse(r->body);
    EXPECT_EQ(e["error"]["param"], "tool_choice");
  }
  for (const json& tc : {json("auto"), json("required")}) {  // without tools
    auto r = h.post(body({{"tool_choice", tc}}));
    EXPECT_EQ(r->status, 400);
  }
  EXPECT_EQ(h.server->counters().accepted, 2);
}

TEST(ServerChatParsing, ThinkingOffOrNotSeparatedStaysInline) {
  Harness h(kThinkAndCalls);
  for (const json& extra : {json({{"chat_template_kwargs", {{"enable_thinking", false}}}}),
                            json({{"separate_reasoning", false}})}) {
    const json j = ok_json(h.post(body(extra)));
    EXPECT_EQ(j["choices"][0]["message"]["content"], kThinkAndCalls) << extra.dump();
    EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));
  }
}

TEST(ServerChatParsing, ServerFlagsTurnParsingOff) {
  ServerOptions o;
  o.reasoning_parser = "none";
  o.tool_call_parser = "none";
  Harness h(kThinkAndCalls, o);
  const json j = ok_json(h.post(body({{"tools", kTools}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], kThinkAndCalls);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const Streamed s = read_stream(h.post(body({{"tools", kTools}, {"stream", true}})));
  EXPECT_EQ(s.content, kThinkAndCalls);
  EXPECT_TRUE(s.reasoning.empty());
}

TEST(ServerChatParsing, AutoReasoningFollowsTheTemplate) {
  Harness h(kThinkAndCalls);
  h.codec.thinks = false;  // a template without <think>: --reasoning-parser auto is off
  const json j = ok_json(h.post(body()));
  EXPECT_EQ(j["choices"][0]["message"]["content"], kThinkAndCalls);
}

TEST(ServerChatParsing, MalformedCallStaysInContentAndTruncatedCallToo) {
  const std::string bad = "Sure.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {tz}}\n</tool_call>";
  Harness h(bad);
  const json j = ok_json(h.post(body({{"tools", kTools}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], bad);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const Streamed s = read_stream(h.post(body({{"tools", kTools}, {"stream", true}})));
  EXPECT_EQ(s.content, bad);
  // Cut by max_tokens inside the block: content, finish_reason length.
  const json t = ok_json(h.post(body({{"tools", kTools}, {"max_tokens", 20}})));
  EXPECT_EQ(t["choices"][0]["message"]["content"], bad.substr(0, 20));
  EXPECT_EQ(t["choices"][0]["finish_reason"], "length");
  const Streamed ts = read_stream(h.post(body({{"tools", kTools}, {"stream", true}, {"max_tokens", 20}})));
  EXPECT_EQ(ts.content, bad.substr(0, 20));
  EXPECT_EQ(ts.finish_reason, "length");
}

TEST(ServerChatParsing, ToolHistoryIsAccepted) {
  Harness h("It is 12:00.");
  const json msgs =
      json::array({{{"role", "user"}, {"content", "time?"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls",
                     {{{"id", "call_1"},
                       {"type", "function"},
                       {"function", {{"name", "get_time"}, {"arguments", "{\"tz\": \"CET\"}"}}}}}}},
                   {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "12:00"}}});
  const json j = ok_json(h.post(body({{"tools", kTools}, {"messages", msgs}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "It is 12:00.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}
