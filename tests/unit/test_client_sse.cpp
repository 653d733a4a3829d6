// SSE parsing on split chunks, stream accounting for both request shapes, and exact-accounting rejection.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "client/request.h"
#include "client/sse.h"
#include "kiln/error.h"

using namespace kiln::client;

namespace {

std::vector<SseEvent> parse_in_pieces(const std::string& s, const std::vector<size_t>& cuts) {
  std::vector<SseEvent> out;
  SseParser p([&](const SseEvent& e) { out.push_back(e); });
  size_t prev = 0;
  for (size_t c : cuts) {
    p.feed(std::string_view(s).substr(prev, c - prev));
    prev = c;
  }
  p.feed(std::string_view(s).substr(prev));
  p.finish();
  return out;
}

const std::string kStream =
    ": keep-alive comment\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "event: update\n"
    "data:first line\n"
    "data: second line\n\n"
    "id: 7\r"
    "data: [DONE]\r\r";

void expect_reference_events(const std::vector<SseEvent>& ev, const std::string& where) {
  ASSERT_EQ(ev.size(), 3u) << where;
  EXPECT_EQ(ev[0].data, "{\"a\":1}") << where;
  EXPECT_EQ(ev[0].event, "") << where;
  EXPECT_EQ(ev[1].event, "update") << where;
  EXPECT_EQ(ev[1].data, "first line\nsecond line") << where;
  EXPECT_EQ(ev[2].data, "[DONE]") << where;
}

}  // namespace

TEST(ClientSse, WholeStream) {
  expect_reference_events(parse_in_pieces(kStream, {}), "whole");
}

TEST(ClientSse, EverySplitPointGivesTheSameEvents) {
  for (size_t cut = 1; cut < kStream.size(); ++cut)
    expect_reference_events(parse_in_pieces(kStream, {cut}), "cut at " + std::to_string(cut));
  for (size_t a = 1; a < kStream.size(); a += 3)
    for (size_t b = a + 1; b < kStream.size(); b += 5)
      expect_reference_events(parse_in_pieces(kStream, {a, b}),
                              "cuts " + std::to_string(a) + "," + std::to_string(b));
}

TEST(ClientSse, ByteByByte) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < kStream.size(); ++i) cuts.push_back(i);
  expect_reference_events(parse_in_pieces(kStream, cuts), "byte by byte");
}

TEST(ClientSse, CrlfSplitBetweenCrAndLfIsOneLineEnd) {
  // "\r" ends one piece and "\n" starts the next: still a single line end, so no spurious blank line
  // dispatches the event early.
  const std::string s = "data: a\r\ndata: b\r\n\r\n";
  const auto ev = parse_in_pieces(s, {8, 9, 17});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "a\nb");
}

TEST(ClientSse, FinalEventWithoutBlankLineIsFlushedAtEnd) {
  const auto ev = parse_in_pieces("data: x\n\ndata: y", {});
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1].data, "y");
  EXPECT_TRUE(parse_in_pieces(": only a comment\n\n", {}).empty());
}

TEST(ClientStream, GenerateCountsCumulativeMetaInfo) {
  StreamAccumulator acc(Api::generate);
  auto chunk = [](int ct) {
    return nlohmann::json{{"text", "x"}, {"meta_info", {{"prompt_tokens", 5}, {"completion_tokens", ct}}}}
        .dump();
  };
  acc.on_data(chunk(1), 0.10);
  acc.on_data(chunk(3), 0.13);  // two tokens in one chunk: one gap
  acc.on_data(chunk(3), 0.14);  // a final chunk that adds no token is not an output chunk
  acc.on_data(chunk(4), 0.20);
  acc.on_data("[DONE]", 0.21);
  RequestResult r;
  acc.finish(0.25, r);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.prompt_tokens, 5);
  EXPECT_EQ(r.completion_tokens, 4);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.10);
  ASSERT_EQ(r.itl_s.size(), 2u);
  EXPECT_NEAR(r.itl_s[0], 0.03, 1e-12);
  EXPECT_NEAR(r.itl_s[1], 0.07, 1e-12);
  EXPECT_EQ(r.output_chunks, 3);
  EXPECT_DOUBLE_EQ(r.e2e_s, 0.25);
}

TEST(ClientStream, CompletionsTakeCountsFromUsage) {
  StreamAccumulator acc(Api::completions);
  acc.on_data(R"({"choices":[{"index":0,"text":"","finish_reason":null}],"usage":null})", 0.01);  // no output
  acc.on_data(R"({"choices":[{"index":0,"text":"Hi","finish_reason":null}],"usage":null})", 0.05);
  acc.on_data(R"({"choices":[{"index":0,"text":" there","finish_reason":"length"}],"usage":null})", 0.08);
  acc.on_data(R"({"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}})", 0.09);
  acc.on_data("[DONE]", 0.09);
  RequestResult r;
  acc.finish(0.1, r);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.prompt_tokens, 9);
  EXPECT_EQ(r.completion_tokens, 2);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.05);
  ASSERT_EQ(r.itl_s.size(), 1u);
}

TEST(ClientStream, ErrorsAreReportedNotThrown) {
  {
    StreamAccumulator acc(Api::completions);
    acc.on_data(R"({"choices":[{"text":"a"}]})", 0.1);
    acc.on_data("[DONE]", 0.2);
    RequestResult r;
    acc.finish(0.2, r);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("usage"), std::string::npos) << r.error;
  }
  {
    StreamAccumulator acc(Api::generate);
    acc.on_data(R"({"meta_info":{"prompt_tokens":1,"completion_tokens":1}})", 0.1);
    RequestResult r;
    acc.finish(0.2, r);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("[DONE]"), std::string::npos) << r.error;
  }
  {
    StreamAccumulator acc(Api::generate);
    acc.on_data("{not json", 0.1);
    acc.on_data("[DONE]", 0.2);
    RequestResult r;
    acc.finish(0.2, r);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("malformed"), std::string::npos) << r.error;
  }
  {
    StreamAccumulator acc(Api::completions);
    acc.on_data(R"({"error":{"message":"out of memory","code":500}})", 0.1);
    RequestResult r;
    acc.finish(0.2, r);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("out of memory"), std::string::npos) << r.error;
  }
}

TEST(ClientStream, ExactAccountingRejectsOtherCounts) {
  RequestSpec spec;
  spec.input_ids = {1, 2, 3};
  spec.expected_input = 3;
  spec.output_len = 4;
  RequestResult r;
  r.ok = true;
  r.prompt_tokens = 3;
  r.completion_tokens = 4;
  EXPECT_EQ(check_accounting(spec, r), "");
  r.completion_tokens = 3;  // stopped early (EOS honoured, or a max_tokens off by one)
  EXPECT_NE(check_accounting(spec, r).find("completion_tokens 3 != asked 4"), std::string::npos);
  r.completion_tokens = 4;
  r.prompt_tokens = 4;  // the server added a BOS or re-tokenised the ids
  EXPECT_NE(check_accounting(spec, r).find("prompt_tokens 4 != asked 3"), std::string::npos);
  spec.expected_input = -1;  // text prompt of unknown length: only the output is checked
  EXPECT_EQ(check_accounting(spec, r), "");
  r.ok = false;
  r.error = "HTTP 500: boom";
  EXPECT_EQ(check_accounting(spec, r), "HTTP 500: boom");
}

TEST(ClientStream, RequestBodies) {
  RequestSpec spec;
  spec.input_ids = {5, 6};
  spec.output_len = 7;
  const auto g = nlohmann::json::parse(build_stream_body(spec, {Api::generate, ""}));
  EXPECT_EQ(g["input_ids"], nlohmann::json({5, 6}));
  EXPECT_EQ(g["sampling_params"]["max_new_tokens"], 7);
  EXPECT_EQ(g["sampling_params"]["ignore_eos"], true);
  EXPECT_EQ(g["sampling_params"]["temperature"], 0);
  EXPECT_EQ(g["stream"], true);
  const auto c = nlohmann::json::parse(build_stream_body(spec, {Api::completions, "m"}));
  EXPECT_EQ(c["prompt"], nlohmann::json({5, 6}));
  EXPECT_EQ(c["model"], "m");
  EXPECT_EQ(c["max_tokens"], 7);
  EXPECT_EQ(c["ignore_eos"], true);
  EXPECT_EQ(c["stream_options"]["include_usage"], true);
  EXPECT_FALSE(g["sampling_params"].contains("json_schema"));
  EXPECT_FALSE(c.contains("response_format"));
  // --json-schema: SGLang's sampling_params.json_schema (text) and OpenAI's response_format (the schema).
  const std::string schema = R"({"type": "array", "items": {"type": "integer"}})";
  const auto gs = nlohmann::json::parse(build_stream_body(spec, {Api::generate, "", schema}));
  EXPECT_EQ(gs["sampling_params"]["json_schema"], schema);
  const auto cs = nlohmann::json::parse(build_stream_body(spec, {Api::completions, "m", schema}));
  EXPECT_EQ(cs["response_format"]["type"], "json_schema");
  EXPECT_EQ(cs["response_format"]["json_schema"]["schema"], nlohmann::json::parse(schema));
  EXPECT_THROW(parse_api("chat"), kiln::Error);
}
