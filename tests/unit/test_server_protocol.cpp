// Server pieces without HTTP: stop strings across tokens, output tracking, request validation, metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "server/stop_matcher.h"
#include "test_server_fakes.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;

namespace {

// Feeds `text` one byte at a time; returns everything released and whether a stop matched.
std::pair<std::string, bool> feed_bytes(StopMatcher& m, const std::string& text) {
  std::string out;
  for (char c : text) {
    auto r = m.push(std::string(1, c));
    out += r.text;
    if (r.matched) return {out, true};
  }
  return {out + m.finish(), false};
}

ApiLimits limits() {
  ApiLimits l;
  l.vocab_size = fake::kVocab;
  l.max_context_len = 64;
  l.hidden_size = 8;
  l.served_model_name = "demo";
  return l;
}

// The ApiError a parse throws (status, param), or status 0 when it did not throw.
template <typename Fn>
std::pair<int, std::string> error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, ""};
}

}  // namespace

TEST(ServerStop, MatchSpanningTokensIsTrimmedAndHeldBack) {
  StopMatcher m({"END"});
  auto r = m.push("abc E");
  EXPECT_EQ(r.text, "abc ");  // "E" could start "END": held back
  EXPECT_FALSE(r.matched);
  r = m.push("N");
  EXPECT_EQ(r.text, "");
  r = m.push("Dxyz");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.stop, "END");
  EXPECT_EQ(m.push("more").text, "");  // nothing after a match
}

TEST(ServerStop, FalseStartIsReleased) {
  StopMatcher m({"END"});
  auto [out, matched] = feed_bytes(m, "the ENgine ENds");
  EXPECT_FALSE(matched);
  EXPECT_EQ(out, "the ENgine ENds");
}

TEST(ServerStop, EarliestOfSeveralWins) {
  StopMatcher m({"world", "lo w", "\n\n"});
  auto [out, matched] = feed_bytes(m, "hello world\n\n");
  EXPECT_TRUE(matched);
  EXPECT_EQ(out, "hel");
  StopMatcher m2({"b", "abc"});  // both complete in one push: earliest position wins
  auto r = m2.push("xabc");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.stop, "abc");
}

TEST(ServerStop, Utf8StopAndNoStops) {
  StopMatcher m({"é!"});
  auto [out, matched] = feed_bytes(m, "café! ok");
  EXPECT_TRUE(matched);
  EXPECT_EQ(out, "caf");
  StopMatcher none({});
  EXPECT_EQ(none.push("abc").text, "abc");
}

TEST(ServerTracker, HoldsBackSplitUtf8AndCountsStopToken) {
  fake::ByteCodec codec;
  GenSpec spec;
  spec.prompt = {1, 2, 3};
  spec.logprobs = true;
  OutputTracker t(codec, spec);
  TokenEvent e;
  e.ids = {0xc3};  // first byte of "é"
  e.logprobs = {-1.0f};
  e.prompt_tokens = 3;
  EXPECT_EQ(t.consume(e).text, "");
  e.ids = {0xa9, 'x'};
  e.logprobs = {-2.0f, -3.0f};
  EXPECT_EQ(t.consume(e).text, "\xc3\xa9x");
  e.ids = {fake::kEos};
  e.logprobs = {-0.5f};
  e.finished = true;
  e.finish_reason = "stop";
  e.matched_stop = fake::kEos;
  e.completion_tokens = 4;
  EXPECT_EQ(t.consume(e).text, "");
  EXPECT_TRUE(t.finished());
  EXPECT_EQ(t.finish_reason(), "stop");
  EXPECT_EQ(t.matched(), json(fake::kEos));
  EXPECT_EQ(t.completion_tokens(), 4);
  EXPECT_EQ(t.text(), "\xc3\xa9x");
  ASSERT_EQ(t.tokens().size(), 4u);
  EXPECT_FLOAT_EQ(t.tokens()[1].logprob, -2.0f);
}

TEST(ServerTracker, StopStringEndsEarlyAndCountsConsumedTokens) {
  fake::ByteCodec codec;
  GenSpec spec;
  spec.prompt = {1};
  spec.stop = {"lo w"};
  OutputTracker t(codec, spec);
  TokenEvent e;
  e.ids = codec.encode("hello world");  // one event carrying many tokens
  const Delta d = t.consume(e);
  EXPECT_TRUE(t.finished());
  EXPECT_TRUE(t.stopped_by_string());
  EXPECT_EQ(d.text, "hel");
  EXPECT_EQ(t.matched(), json("lo w"));
  EXPECT_EQ(t.completion_tokens(), 7);  // "hello w": the token completing the match is counted
}

TEST(ServerTracker, StopStringsCountFromMinTokensOn) {
  fake::ByteCodec codec;
  GenSpec spec;
  spec.prompt = {1};
  spec.stop = {"a"};
  spec.sampling.min_new_tokens = 3;
  OutputTracker t(codec, spec);
  TokenEvent e;
  e.ids = codec.encode("aaxa");  // tokens 1 and 2 come before min_tokens: their "a" does not stop it
  const Delta d = t.consume(e);
  EXPECT_TRUE(t.stopped_by_string());
  EXPECT_EQ(d.text, "aax");
  EXPECT_EQ(t.completion_tokens(), 4);
}

TEST(ServerTracker, HeldBackTextIsReleasedAtLength) {
  fake::ByteCodec codec;
  GenSpec spec;
  spec.prompt = {1};
  spec.stop = {"abc"};
  OutputTracker t(codec, spec);
  TokenEvent e;
  e.ids = codec.encode("xyzab");
  EXPECT_EQ(t.consume(e).text, "xyz");
  e.ids = {};
  e.finished = true;
  e.finish_reason = "length";
  e.completion_tokens = 5;
  EXPECT_EQ(t.consume(e).text, "ab");
  EXPECT_EQ(t.text(), "xyzab");
  EXPECT_EQ(t.finish_reason(), "length");
}

// The stream interval's wake policy: the first tokens at once, then every `every` tokens (an event may carry
// several), a finish or a token-less event always, and with every = 0 only those.
TEST(ServerEventQueue, WakesAtTheFirstTokenEveryNTokensAndTheEnd) {
  const auto tok = [](int n, bool finished = false) {
    TokenEvent e;
    e.id = 1;
    e.ids.assign(size_t(n), 7);
    e.finished = finished;
    return e;
  };
  EventQueue q4(4);
  std::vector<bool> wakes;
  for (const TokenEvent& e :
       {tok(0), tok(1), tok(1), tok(1), tok(1), tok(1), tok(2), tok(3), tok(1), tok(1, true)})
    wakes.push_back(q4.push(e));
  // token-less: wake; first tokens: wake; 1+1+1+1 = 4: wake; 1+2 = 3: not; +3 = 6: wake; 1: not; the finish.
  EXPECT_EQ(wakes, (std::vector<bool>{true, true, false, false, false, true, false, true, false, true}));
  std::vector<TokenEvent> taken;
  q4.take(taken);
  EXPECT_EQ(taken.size(), 10u);  // every event queued, woken or not
  EventQueue q1(1);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(q1.push(tok(1)));
  EventQueue whole(0);  // a response sent whole: woken only at its end
  EXPECT_FALSE(whole.push(tok(1)));
  EXPECT_FALSE(whole.push(tok(5)));
  EXPECT_TRUE(whole.push(tok(0)));
  EXPECT_TRUE(whole.push(tok(1, true)));
}

TEST(ServerProtocol, ChatRequestParses) {
  fake::ByteCodec codec;
  const json body = {{"model", "demo"},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 5},
                     {"temperature", 0},
                     {"top_p", 0.5},
                     {"top_k", 4},
                     {"seed", 7},
                     {"stop", "x"},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}},
                     {"logprobs", true},
                     {"top_logprobs", 2},
                     {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const GenSpec g = parse_chat_request(body, codec, limits());
  EXPECT_EQ(g.prompt, codec.encode("user: hi\nassistant: <no-think>"));
  EXPECT_EQ(g.sampling.max_new_tokens, 5);
  EXPECT_EQ(g.sampling.temperature, 0.0f);
  EXPECT_EQ(g.sampling.top_p, 0.5f);
  EXPECT_EQ(g.sampling.top_k, 4);
  EXPECT_EQ(g.sampling.seed, 7);
  EXPECT_EQ(g.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(g.stream && g.include_usage && g.logprobs);
  EXPECT_EQ(g.sampling.top_logprobs, 2);
  EXPECT_TRUE(g.sampling.return_logprob);
  // Text parts are joined; absent max_tokens means the rest of the context.
  const json parts = {
      {"messages",
       {{{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}};
  const GenSpec g2 = parse_chat_request(parts, codec, limits());
  EXPECT_EQ(g2.prompt, codec.encode("user: ab\nassistant:"));
  EXPECT_EQ(g2.sampling.max_new_tokens, 64 - int(g2.prompt.size()));
}

TEST(ServerProtocol, CompletionAndGenerateParse) {
  fake::ByteCodec codec;
  GenSpec g = parse_completion_request({{"prompt", {1, 2, 3}}, {"logprobs", 3}}, codec, limits());
  EXPECT_EQ(g.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(g.sampling.max_new_tokens, 16);
  EXPECT_EQ(g.top_logprobs, 3);
  g = parse_completion_request({{"prompt", {"ab"}}, {"max_tokens", 2.0}}, codec, limits());
  EXPECT_EQ(g.prompt, codec.encode("ab"));
  EXPECT_EQ(g.sampling.max_new_tokens, 2);
  g = parse_generate_request(
      {{"input_ids", {5, 6}},
       {"sampling_params",
        {{"max_new_tokens", 0}, {"stop_token_ids", {7}}, {"ignore_eos", true}, {"stop", {"a", "b"}}}},
       {"return_logprob", true},
       {"return_hidden_states", true}},
      codec, limits());
  EXPECT_EQ(g.sampling.max_new_tokens, 0);
  EXPECT_EQ(g.sampling.stop_token_ids, std::vector<int32_t>{7});
  EXPECT_TRUE(g.sampling.ignore_eos && g.return_hidden && g.logprobs);
  EXPECT_EQ(g.stop.size(), 2u);
  g = parse_generate_request({{"text", "hey"}}, codec, limits());
  EXPECT_EQ(g.sampling.max_new_tokens, 64 - 3);  // default 128 clamped to the context
}

TEST(ServerProtocol, PenaltiesBiasMinTokensAndNParse) {
  fake::ByteCodec codec;
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  GenSpec g = parse_chat_request({{"messages", msgs},
                                  {"presence_penalty", 0.5},
                                  {"frequency_penalty", -1.25},
                                  {"repetition_penalty", 1.3},
                                  {"logit_bias", {{"7", 100}, {"12", -100}, {"3", 0.5}}},
                                  {"min_tokens", 3},
                                  {"max_tokens", 6},
                                  {"n", 4}},
                                 codec, limits());
  EXPECT_FLOAT_EQ(g.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.frequency_penalty, -1.25f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.3f);
  auto bias = g.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{3, 0.5f}, {7, 100.0f}, {12, -100.0f}}));
  EXPECT_EQ(g.sampling.min_new_tokens, 3);
  EXPECT_EQ(g.n, 4);
  // Completions take the same names; /generate SGLang's (min_new_tokens, n inside sampling_params).
  g = parse_completion_request({{"prompt", "ab"}, {"n", 2}, {"min_tokens", 1}}, codec, limits());
  EXPECT_EQ(g.n, 2);
  EXPECT_EQ(g.sampling.min_new_tokens, 1);
  g = parse_generate_request({{"text", "ab"},
                              {"sampling_params",
                               {{"presence_penalty", 1},
                                {"frequency_penalty", 0.5},
                                {"repetition_penalty", 1.1},
                                {"min_new_tokens", 2},
                                {"stop_token_ids", {9}},
                                {"logit_bias", {{"4", 2}}},
                                {"n", 3}}}},
                             codec, limits());
  EXPECT_FLOAT_EQ(g.sampling.presence_penalty, 1.0f);
  EXPECT_FLOAT_EQ(g.sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(g.sampling.min_new_tokens, 2);
  EXPECT_EQ(g.sampling.stop_token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(g.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{4, 2.0f}}));
  EXPECT_EQ(g.n, 3);
  // Defaults: no penalty, one choice.
  g = parse_chat_request({{"messages", msgs}}, codec, limits());
  EXPECT_EQ(g.n, 1);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.0f);
  EXPECT_TRUE(g.sampling.logit_bias.empty());
}

TEST(ServerProtocol, BadInputsAreRejectedWithTheirParam) {
  fake::ByteCodec codec;
  const auto L = limits();
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  auto chat = [&](json extra) {
    json b = {{"messages", msgs}};
    b.update(extra);
    return error_of([&] { parse_chat_request(b, codec, L); });
  };
  using P = std::pair<int, std::string>;
  EXPECT_EQ(chat({{"temperature", "hot"}}), P(400, "temperature"));
  EXPECT_EQ(chat({{"temperature", -1}}), P(400, "temperature"));
  EXPECT_EQ(chat({{"temperature", 2.5}}), P(400, "temperature"));
  EXPECT_EQ(chat({{"top_p", 0}}), P(400, "top_p"));
  EXPECT_EQ(chat({{"top_p", 1.5}}), P(400, "top_p"));
  EXPECT_EQ(chat({{"top_k", -2}}), P(400, "top_k"));
  EXPECT_EQ(chat({{"max_tokens", 0}}), P(400, "max_tokens"));
  EXPECT_EQ(chat({{"max_tokens", 1.5}}), P(400, "max_tokens"));
  EXPECT_EQ(chat({{"max_tokens", 1000}}), P(400, "max_tokens"));  // prompt + 1000 > context 64
  EXPECT_EQ(chat({{"n", 17}}), P(400, "n"));
  // Structured output (its own tests: test_server_structured_output.cpp).
  EXPECT_EQ(chat({{"response_format", {{"type", "json_object"}}}}), P(0, ""));
  EXPECT_EQ(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", json::object()}}}}),
            P(400, "response_format.json_schema.schema"));
  EXPECT_EQ(chat({{"guided_json", 3}}), P(400, "guided_json"));
  EXPECT_EQ(chat({{"response_format", {{"type", "text"}}}}), P(0, ""));
  EXPECT_EQ(chat({{"n", 0}}), P(400, "n"));
  EXPECT_EQ(chat({{"stream", "yes"}}), P(400, "stream"));
  EXPECT_EQ(chat({{"stream_options", {{"include_usage", true}}}}), P(400, "stream_options"));
  EXPECT_EQ(chat({{"stop", {1, 2}}}), P(400, "stop"));
  EXPECT_EQ(chat({{"stop", ""}}), P(400, "stop"));
  EXPECT_EQ(chat({{"logit_bias", {{"5", 101}}}}), P(400, "logit_bias"));
  EXPECT_EQ(chat({{"logit_bias", {{"x5", 1}}}}), P(400, "logit_bias"));
  EXPECT_EQ(chat({{"logit_bias", {{"999", 1}}}}), P(400, "logit_bias"));  // outside the vocabulary
  EXPECT_EQ(chat({{"logit_bias", {{"-1", 1}}}}), P(400, "logit_bias"));
  EXPECT_EQ(chat({{"logit_bias", {5, 1}}}), P(400, "logit_bias"));
  EXPECT_EQ(chat({{"presence_penalty", 2.5}}), P(400, "presence_penalty"));
  EXPECT_EQ(chat({{"frequency_penalty", -3}}), P(400, "frequency_penalty"));
  EXPECT_EQ(chat({{"repetition_penalty", 0}}), P(400, "repetition_penalty"));
  EXPECT_EQ(chat({{"repetition_penalty", 2.5}}), P(400, "repetition_penalty"));
  EXPECT_EQ(chat({{"min_tokens", -1}}), P(400, "min_tokens"));
  EXPECT_EQ(chat({{"min_tokens", 9}, {"max_tokens", 8}}), P(400, "min_tokens"));
  EXPECT_EQ(chat({{"top_logprobs", 3}}), P(400, "top_logprobs"));  // without logprobs
  EXPECT_EQ(chat({{"model", "other"}}), P(404, "model"));
  EXPECT_EQ(chat({{"messages", json::array()}}), P(400, "messages"));
  EXPECT_EQ(chat({{"messages", "hi"}}), P(400, "messages"));
  EXPECT_EQ(chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), P(400, "messages[0].role"));
  EXPECT_EQ(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}), P(400, "messages[0].content"));
  EXPECT_EQ(chat({{"messages", {{{"role", "user"}, {"content", std::string(100, 'x')}}}}}),
            P(400, "messages"));
  EXPECT_EQ(chat({{"stop_token_ids", {999}}}), P(400, "stop_token_ids"));

  auto comp = [&](json b) { return error_of([&] { parse_completion_request(b, codec, L); }); };
  EXPECT_EQ(comp({{"prompt", ""}}), P(400, "prompt"));
  EXPECT_EQ(comp({{"prompt", {"a", 5}}}), P(400, "prompt"));  // a batch holds strings or token lists
  EXPECT_EQ(comp({{"prompt", {"a", ""}}}), P(400, "prompt"));
  EXPECT_EQ(parse_completion_request({{"prompt", {"a", "b"}}}, codec, L).more_prompts.size(), 1u);
  EXPECT_EQ(comp({{"prompt", {1, -1}}}), P(400, "prompt"));
  EXPECT_EQ(comp({{"prompt", {1, 300}}}), P(400, "prompt"));
  EXPECT_EQ(comp({{"prompt", 5}}), P(400, "prompt"));
  EXPECT_EQ(comp(json::object()), P(400, "prompt"));
  // echo + logprobs gives the prompt's logprobs (server/prompt_logprobs.h), but not streamed.
  EXPECT_EQ(comp({{"prompt", "a"}, {"echo", true}, {"logprobs", 1}}), P(0, ""));
  EXPECT_EQ(comp({{"prompt", "a"}, {"echo", true}, {"logprobs", 1}, {"stream", true}}), P(400, "echo"));
  EXPECT_EQ(comp({{"prompt", "a"}, {"prompt_logprobs", 1}, {"stream", true}}), P(400, "prompt_logprobs"));
  EXPECT_EQ(comp({{"prompt", "a"}, {"best_of", 3}}), P(400, "best_of"));
  EXPECT_EQ(comp({{"prompt", "a"}, {"logprobs", 21}}), P(400, "logprobs"));

  auto gen = [&](json b) { return error_of([&] { parse_generate_request(b, codec, L); }); };
  EXPECT_EQ(gen({{"text", "a"}, {"input_ids", {1}}}).first, 400);
  EXPECT_EQ(gen(json::object()).first, 400);
  EXPECT_EQ(gen({{"input_ids", json::array()}}), P(400, "input_ids"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"temperature", nullptr}, {"max_new_tokens", -1}}}}),
            P(400, "max_new_tokens"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", 3}}), P(400, "sampling_params"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"n", 20}}}}), P(400, "n"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"regex", "[0-9]+"}}}}), P(0, ""));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"ebnf", ""}}}}), P(400, "ebnf"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"json_schema", "{not json"}}}}), P(400, "json_schema"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"structural_tag", "{}"}}}}), P(400, "structural_tag"));
  EXPECT_EQ(gen({{"text", "a"}, {"sampling_params", {{"min_new_tokens", 5}, {"max_new_tokens", 2}}}}),
            P(400, "min_new_tokens"));

  auto emb = [&](json b) { return error_of([&] { parse_embedding_request(b, codec, L); }); };
  EXPECT_EQ(emb({{"input", ""}}), P(400, "input"));
  EXPECT_EQ(emb({{"input", {"a", 3}}}), P(400, "input"));
  EXPECT_EQ(emb({{"input", "a"}, {"encoding_format", "hex"}}), P(400, "encoding_format"));
  EXPECT_EQ(emb({{"input", "a"}, {"dimensions", 9}}), P(400, "dimensions"));

  // Malformed JSON, a non-object, and invalid UTF-8 inside a string.
  EXPECT_EQ(error_of([] { parse_body("{\"a\": "); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("[1]"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("{\"prompt\": \"\xff\xfe\"}"); }).first, 400);
  // Nulls mean "not given".
  EXPECT_EQ(chat({{"temperature", nullptr}, {"stop", nullptr}, {"seed", nullptr}}).first, 0);
}

TEST(ServerProtocol, ErrorShapeIsOpenAIs) {
  const json j = ApiError(400, "bad temperature", "temperature").to_json();
  EXPECT_EQ(j["error"]["message"], "bad temperature");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(error_body(503, "busy")["error"]["type"], "service_unavailable");
}

TEST(ServerResponses, EmbeddingShapingAndBase64) {
  const auto v = shape_embedding({3.0f, 4.0f, 12.0f}, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], 0.8f);
  EXPECT_EQ(base64_floats({1.0f}), "AACAPw==");  // 1.0f = 00 00 80 3f little-endian
  EXPECT_EQ(base64_floats({1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(valid_utf8("a\xff\xc3\xa9"), "a\xEF\xBF\xBD\xc3\xa9");
  EXPECT_EQ(valid_utf8("\xc3"), "\xEF\xBF\xBD");
}

TEST(ServerMetrics, PrometheusTextHasEverySeries) {
  EngineStats s;
  s.running = 2;
  s.kv_pages_total = 10;
  s.kv_pages_used = 5;
  s.ttft.bounds = {0.1, 1.0};
  s.ttft.counts = {1, 3};
  s.ttft.count = 4;
  s.ttft.sum = 2.5;
  ServerCounters c;
  c.accepted = 7;
  c.completed = 6;
  c.aborted = 1;
  const std::string m = render_metrics(s, c, "de\"mo");
  EXPECT_NE(m.find("kiln_num_running_requests{model_name=\"de\\\"mo\"} 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_kv_usage_ratio{model_name=\"de\\\"mo\"} 0.5\n"), std::string::npos);
  EXPECT_NE(m.find("kiln_time_to_first_token_seconds_bucket{model_name=\"de\\\"mo\",le=\"0.1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(m.find("kiln_time_to_first_token_seconds_bucket{model_name=\"de\\\"mo\",le=\"+Inf\"} 4\n"),
            std::string::npos);
  EXPECT_NE(m.find("kiln_server_requests_finished_total{model_name=\"de\\\"mo\",outcome=\"aborted\"} 1\n"),
            std::string::npos);
  EXPECT_NE(m.find("# TYPE kiln_e2e_request_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(m.find("# TYPE kiln_grammar_mask_seconds histogram"), std::string::npos);
  EXPECT_NE(m.find("kiln_grammar_masks_total{model_name=\"de\\\"mo\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_grammar_steps_not_overlapped_total{model_name=\"de\\\"mo\"} 0\n"), std::string::npos)
      << m;
}

// max_tokens: null is "not given" (OpenAI clients send null for unset fields), as in vLLM: a chat reply may
// then run to the end of the context, a completion gets 16 tokens (docs/SERVING.md, "Errors and robustness").
TEST(ServerValidation, NullMaxTokensMeansTheDefault) {
  fake::ByteCodec codec;
  const ApiLimits l = limits();
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  json chat_null = chat;
  chat_null["max_tokens"] = nullptr;
  chat_null["max_completion_tokens"] = nullptr;
  const GenSpec absent = parse_chat_request(chat, codec, l), null = parse_chat_request(chat_null, codec, l);
  EXPECT_EQ(null.sampling.max_new_tokens, absent.sampling.max_new_tokens);
  EXPECT_EQ(absent.sampling.max_new_tokens, l.max_context_len - int64_t(absent.prompt.size()));
  const GenSpec completion = parse_completion_request({{"prompt", "hi"}, {"max_tokens", nullptr}}, codec, l);
  EXPECT_EQ(completion.sampling.max_new_tokens, 16);
  const GenSpec generate =
      parse_generate_request({{"text", "hi"}, {"sampling_params", {{"max_new_tokens", nullptr}}}}, codec, l);
  EXPECT_EQ(generate.sampling.max_new_tokens, std::min<int64_t>(128, l.max_context_len - 2));
}
