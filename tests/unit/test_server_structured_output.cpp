// Structured output in the server: every request spelling parsed into one grammar and every bad one a 400
// naming its field; tool_choice grammars; the compile service (cache, refused keywords, --grammar-lenient);
// and over HTTP, the real engine on the FakeRunner (byte vocabulary, near-uniform logits at temperature 1:
// garbage without a grammar) answering response_format / SGLang / vLLM / Responses requests with text that
// parses, and tool_choice "required" / named with tool_calls whose arguments follow the tool's schema.
#include <gtest/gtest.h>
#include <httplib.h>

#include <regex>
#include <thread>

#include "runtime/fake_runner.h"
#include "server/api_error.h"
#include "server/backend_engine.h"
#include "server/server.h"
#include "server/structured_output.h"
#include "test_server_fakes.h"

using namespace kiln;
using namespace kiln::server;
// Ordered, as a client writes JSON: the schemas' property order is part of what is tested.
using json = nlohmann::ordered_json;

namespace {

using grammar::GrammarKind;

std::pair<int, std::string> error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, ""};
}
using P = std::pair<int, std::string>;

TEST(ServerStructuredOutput, EverySpellingParsesIntoOneGrammar) {
  const json schema = {{"type", "object"}};
  auto one = [](const json& body, bool openai = true) {
    return parse_structured_output(body, openai).value();
  };
  GrammarRequest g = one({{"response_format", {{"type", "json_object"}}}});
  EXPECT_EQ(g.kind, GrammarKind::any_json);
  EXPECT_EQ(g.field, "response_format");
  g = one(
      {{"response_format",
        {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}, {"strict", true}}}}}});
  EXPECT_EQ(g.kind, GrammarKind::json_schema);
  EXPECT_EQ(json::parse(g.text), schema);
  EXPECT_TRUE(g.strict);
  g = one({{"json_schema", schema.dump()}});  // SGLang: JSON text
  EXPECT_EQ(json::parse(g.text), schema);
  EXPECT_EQ(g.field, "json_schema");
  EXPECT_EQ(one({{"regex", "a+"}}).kind, GrammarKind::regex);
  EXPECT_EQ(one({{"ebnf", "root ::= \"a\""}}).kind, GrammarKind::ebnf);
  EXPECT_EQ(one({{"guided_json", schema}}).field, "guided_json");
  EXPECT_EQ(one({{"guided_regex", "a"}}).kind, GrammarKind::regex);
  EXPECT_EQ(one({{"guided_grammar", "root ::= \"a\""}}).kind, GrammarKind::ebnf);
  g = one({{"guided_choice", {"yes", "no \"x\"\n"}}});
  EXPECT_EQ(g.kind, GrammarKind::ebnf);
  EXPECT_EQ(g.text, R"(root ::= "yes" | "no \x22x\x22\x0A")");
  g = one({{"structured_outputs", {{"json", schema}, {"disable_additional_properties", true}}}});
  EXPECT_EQ(g.field, "structured_outputs.json");
  EXPECT_TRUE(g.strict);
  EXPECT_EQ(one({{"structured_outputs", {{"choice", {"a"}}}}}).field, "structured_outputs.choice");
  EXPECT_EQ(one({{"structured_outputs", {{"json_object", true}}}}).kind, GrammarKind::any_json);
  EXPECT_EQ(one({{"regex", "a"}}, false).kind, GrammarKind::regex);  // /generate's sampling_params
  // Nothing asked: text format, nulls, a backend name.
  EXPECT_FALSE(parse_structured_output({{"response_format", {{"type", "text"}}}}, true));
  EXPECT_FALSE(parse_structured_output({{"regex", nullptr}, {"guided_decoding_backend", "xgrammar"}}, true));
  // response_format is an OpenAI body field only.
  EXPECT_FALSE(parse_structured_output({{"response_format", {{"type", "json_object"}}}}, false));
}

TEST(ServerStructuredOutput, BadFieldsAndTwoConstraintsAreNamed) {
  auto err = [](const json& body) { return error_of([&] { parse_structured_output(body, true); }); };
  EXPECT_EQ(err({{"response_format", {{"type", "yaml"}}}}), P(400, "response_format"));
  EXPECT_EQ(err({{"response_format", "json"}}), P(400, "response_format"));
  EXPECT_EQ(err({{"response_format", {{"type", "json_schema"}}}}), P(400, "response_format.json_schema"));
  EXPECT_EQ(err({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}),
            P(400, "response_format.json_schema.schema"));
  EXPECT_EQ(
      err({{"response_format",
            {{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}, {"strict", "yes"}}}}}}),
      P(400, "response_format.json_schema.strict"));
  EXPECT_EQ(err({{"json_schema", "{oops"}}), P(400, "json_schema"));
  EXPECT_EQ(err({{"json_schema", 3}}), P(400, "json_schema"));
  EXPECT_EQ(err({{"regex", ""}}), P(400, "regex"));
  EXPECT_EQ(err({{"guided_choice", json::array()}}), P(400, "guided_choice"));
  EXPECT_EQ(err({{"guided_choice", {"a", 1}}}), P(400, "guided_choice"));
  EXPECT_EQ(err({{"structured_outputs", {{"whitespace_pattern", " "}}}}),
            P(400, "structured_outputs.whitespace_pattern"));
  EXPECT_EQ(err({{"structured_outputs", 1}}), P(400, "structured_outputs"));
  EXPECT_EQ(err({{"structural_tag", "{}"}}), P(400, "structural_tag"));
  EXPECT_EQ(err({{"guided_whitespace_pattern", " "}}), P(400, "guided_whitespace_pattern"));
  // Two constraints: a 400 naming both (param: the first).
  try {
    parse_structured_output({{"response_format", {{"type", "json_object"}}}, {"regex", "a"}}, true);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "response_format");
    EXPECT_NE(std::string(e.what()).find("'regex'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(err({{"guided_json", json::object()}, {"structured_outputs", {{"regex", "a"}}}}),
            P(400, "guided_json"));
}

const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties",
                                       {{"city", {{"enum", {"Paris", "Oslo"}}}},
                                        {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}}}}},
                                      {"required", {"city", "days"}},
                                      {"additionalProperties", false}}}}}},
                                 {{"type", "function"},
                                  {"function",
                                   {{"name", "get_time"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"tz", {{"enum", {"CET", "UTC"}}}}}},
                                      {"required", {"tz"}},
                                      {"additionalProperties", false}}}}}}});

TEST(ServerStructuredOutput, SchemasKeepTheClientsPropertyOrder) {
  // As the server holds a body (sorted keys), then the raw body re-read.
  const std::string raw =
      R"({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": )"
      R"({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}}}}}})";
  const GrammarRequest sorted =
      *parse_structured_output(structured_output_fields(nlohmann::json::parse(raw)), true);
  EXPECT_LT(sorted.text.find("alpha"), sorted.text.find("zeta"));
  const GrammarRequest g = with_body_order(sorted, raw, BodyShape::openai);
  EXPECT_LT(g.text.find("zeta"), g.text.find("alpha")) << g.text;
  EXPECT_EQ(g.field, "response_format");
  const std::string gen =
      R"({"text": "x", "sampling_params": {"json_schema": "{\"properties\": {\"b\": {}, \"a\": {}}}"}})";
  const GrammarRequest gs = *parse_structured_output(
      structured_output_fields(nlohmann::json::parse(gen)["sampling_params"]), false);
  EXPECT_LT(gs.text.find("\"b\""), gs.text.find("\"a\"")) << gs.text;  // JSON text keeps its order as it is
  const std::string resp =
      R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"properties": {"b": {}, "a": {}}}}}})";
  const GrammarRequest gr =
      with_body_order({GrammarKind::json_schema, "{}", false, "response_format"}, resp, BodyShape::responses);
  EXPECT_LT(gr.text.find("\"b\""), gr.text.find("\"a\"")) << gr.text;
}

TEST(ServerStructuredOutput, ToolChoiceGrammars) {
  EXPECT_FALSE(tool_call_grammar(&kTools, nullptr, true));  // auto, no strict tool: free
  const json none = "none";
  EXPECT_FALSE(tool_call_grammar(&kTools, &none, true));
  const json req = "required";
  json spec = json::parse(tool_call_grammar(&kTools, &req, true)->text);
  EXPECT_EQ(spec["tools"].size(), 2u);
  EXPECT_EQ(spec["min_calls"], 1);
  EXPECT_EQ(spec["max_calls"], 0);
  EXPECT_EQ(json::parse(tool_call_grammar(&kTools, &req, false)->text)["max_calls"], 1);
  const json named = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  const GrammarRequest g = *tool_call_grammar(&kTools, &named, true);
  spec = json::parse(g.text);
  EXPECT_EQ(g.kind, GrammarKind::tool_calls);
  EXPECT_EQ(g.field, "tool_choice");
  ASSERT_EQ(spec["tools"].size(), 1u);
  EXPECT_EQ(spec["tools"][0]["name"], "get_time");
  EXPECT_EQ(spec["max_calls"], 1);
  const json missing = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  EXPECT_EQ(error_of([&] { tool_call_grammar(&kTools, &missing, true); }), P(400, "tool_choice"));
  json strict = kTools;
  for (json& t : strict) t["function"]["strict"] = true;
  const GrammarRequest s = *tool_call_grammar(&strict, nullptr, true);
  EXPECT_TRUE(s.strict);
  EXPECT_EQ(json::parse(s.text)["free_text"], true);
  EXPECT_EQ(json::parse(s.text)["min_calls"], 0);
}

// Whether the compiled grammar takes `text` (bytes) and then EOS.
bool accepts(const std::shared_ptr<const grammar::CompiledGrammar>& g, const std::string& text) {
  grammar::Matcher m(g);
  for (unsigned char c : text)
    if (!m.accept_token(c)) return false;
  return m.accept_token(fake::kEos);
}

TEST(ServerStructuredOutput, CompileServiceCachesRefusesAndDropsWhenLenient) {
  fake::ByteCodec codec;
  GrammarService svc(codec, fake::kVocab, {fake::kEos}, {});
  const GrammarRequest schema{GrammarKind::json_schema,
                              R"({"type":"object","properties":{"a":{"type":"integer"}}})", false,
                              "response_format"};
  auto g = svc.compile(schema);
  EXPECT_TRUE(accepts(g, R"({"a": 12})"));
  EXPECT_TRUE(accepts(g, R"({"a": 1, "b": "extra"})"));  // additionalProperties open by default
  EXPECT_FALSE(accepts(g, R"({"a": "x"})"));
  EXPECT_EQ(svc.compile(schema), g);  // cached by content
  EXPECT_EQ(svc.cached(), 1u);
  GrammarRequest strict = schema;
  strict.strict = true;
  EXPECT_FALSE(accepts(svc.compile(strict), R"({"a": 1, "b": "extra"})"));
  const GrammarRequest unsupported{GrammarKind::json_schema, R"({"type":"string","not":{"const":"x"}})",
                                   false, "guided_json"};
  try {
    svc.compile(unsupported);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "guided_json");
    EXPECT_NE(std::string(e.what()).find("'not'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_of([&] {
              svc.compile({GrammarKind::ebnf, "root ::= missing", false, "ebnf"});
            }),
            P(400, "ebnf"));
  EXPECT_EQ(error_of([&] { svc.compile({GrammarKind::regex, "(a", false, "regex"}); }), P(400, "regex"));
  // A choice with quotes, a backslash, a newline and UTF-8: each string exactly.
  const auto choice = svc.compile(*parse_structured_output({{"guided_choice", {"a\"b\\\n", "é{x}"}}}, true));
  EXPECT_TRUE(accepts(choice, "a\"b\\\n"));
  EXPECT_TRUE(accepts(choice, "é{x}"));
  EXPECT_FALSE(accepts(choice, "a\"b"));
  GrammarServiceOptions lenient;
  lenient.lenient = true;
  GrammarService svc2(codec, fake::kVocab, {fake::kEos}, lenient);
  EXPECT_TRUE(accepts(svc2.compile(unsupported), R"("anything")"));
}

TEST(ServerStructuredOutput, ToolCallGrammarTakesQwenBlocksOfTheNamedSchemas) {
  fake::ByteCodec codec;
  GrammarService svc(codec, fake::kVocab, {fake::kEos}, {});
  const json req = "required";
  auto g = svc.compile(*tool_call_grammar(&kTools, &req, true));
  const std::string call =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
  const std::string call2 =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": "
      "3}}\n</tool_call>";
  EXPECT_TRUE(accepts(g, call));
  EXPECT_TRUE(accepts(g, call + "\n" + call2));
  EXPECT_FALSE(accepts(g, "Sure! " + call));  // required: calls only
  EXPECT_FALSE(accepts(g, ""));               // at least one
  EXPECT_FALSE(
      accepts(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"PST\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
  auto single = svc.compile(*tool_call_grammar(&kTools, &req, false));
  EXPECT_TRUE(accepts(single, call));
  EXPECT_FALSE(accepts(single, call + "\n" + call2));
  EXPECT_FALSE(accepts(single, "\n" + call));
  json strict = kTools;
  for (json& t : strict) t["function"]["strict"] = true;
  auto aut = svc.compile(*tool_call_grammar(&strict, nullptr, true));
  EXPECT_TRUE(accepts(aut, "It is sunny."));
  EXPECT_TRUE(accepts(aut, "Let me check.\n\n" + call));
  EXPECT_TRUE(accepts(aut, call));
  EXPECT_FALSE(
      accepts(aut, "Let me check. <tool_call>\n{\"name\": \"nope\"}"));  // a call must be well-formed
}

// The real engine (FakeRunner: byte ids, 256 = EOS) behind the real server.
struct EngineHarness {
  explicit EngineHarness(ServerOptions o = {}) {
    auto model = std::make_unique<FakeRunner>(fake::kVocab, 8, fake::kEos);
    EngineOptions eo;
    eo.page_size = 8;
    eo.max_total_tokens = 1 << 15;
    engine = std::make_unique<Engine>(std::move(model), eo);
    api = std::make_unique<EngineAdapter>(*engine);
    codec.thinks = false;
    o.port = 0;
    o.served_model_name = "demo";
    server = std::make_unique<ApiServer>(*api, codec, o);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    for (int i = 0; i < 1000 && !server->running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~EngineHarness() {
    server->stop();
    thread.join();
    engine->shutdown(false);
  }
  json post(const std::string& path, const json& body, int want_status = 200) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  fake::ByteCodec codec;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineAdapter> api;
  std::unique_ptr<ApiServer> server;
  int port = 0;
  std::thread thread;
};

json chat(json extra) {
  json b = {{"messages", {{{"role", "user"}, {"content", "go"}}}}, {"max_tokens", 400}, {"temperature", 1.0}};
  b.update(extra);
  return b;
}

TEST(ServerStructuredOutput, HttpResponsesParseUnderEveryField) {
  EngineHarness h;
  const json schema = {
      {"type", "object"},
      {"properties",
       {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}}, {"c", {{"enum", {"red", "blue"}}}}}},
      {"required", {"n", "c"}},
      {"additionalProperties", false}};
  auto check_doc = [&](const std::string& text) {
    json d;
    ASSERT_NO_THROW(d = json::parse(text)) << text;
    ASSERT_TRUE(d.is_object()) << text;
    EXPECT_EQ(d.size(), 2u) << text;
    EXPECT_EQ(d.begin().key(), "n") << "the schema's property order, not alphabetical: " << text;
    EXPECT_TRUE(d["n"].is_number_integer() && d["n"] >= 0 && d["n"] <= 99) << text;
    EXPECT_TRUE(d["c"] == "red" || d["c"] == "blue") << text;
  };
  // OpenAI response_format, n = 4 seeded choices.
  json j =
      h.post("/v1/chat/completions",
             chat({{"n", 4},
                   {"seed", 7},
                   {"response_format",
                    {{"type", "json_schema"}, {"json_schema", {{"name", "doc"}, {"schema", schema}}}}}}));
  ASSERT_EQ(j["choices"].size(), 4u);
  for (const json& c : j["choices"]) {
    EXPECT_EQ(c["finish_reason"], "stop");
    check_doc(c["message"]["content"].get<std::string>());
  }
  // json_object: any JSON value... that parses.
  j = h.post("/v1/chat/completions", chat({{"seed", 3}, {"response_format", {{"type", "json_object"}}}}));
  EXPECT_TRUE(json::accept(j["choices"][0]["message"]["content"].get<std::string>())) << j.dump();
  // vLLM on completions: guided_choice and structured_outputs.regex.
  j = h.post(
      "/v1/completions",
      {{"prompt", "x"}, {"max_tokens", 50}, {"temperature", 1.0}, {"guided_choice", {"alpha", "beta"}}});
  const std::string t = j["choices"][0]["text"];
  EXPECT_TRUE(t == "alpha" || t == "beta") << t;
  j = h.post("/v1/completions", {{"prompt", "x"},
                                 {"max_tokens", 50},
                                 {"temperature", 1.0},
                                 {"structured_outputs", {{"regex", "[0-9]{3}-[a-z]{2}"}}}});
  EXPECT_TRUE(std::regex_match(j["choices"][0]["text"].get<std::string>(), std::regex("[0-9]{3}-[a-z]{2}")));
  // SGLang /generate: sampling_params.json_schema (JSON text).
  j = h.post(
      "/generate",
      {{"text", "x"},
       {"sampling_params", {{"max_new_tokens", 400}, {"temperature", 1.0}, {"json_schema", schema.dump()}}}});
  check_doc(j["text"].get<std::string>());
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "stop");
  // Responses API: text.format json_schema.
  j = h.post("/v1/responses",
             {{"input", "go"},
              {"max_output_tokens", 400},
              {"temperature", 1.0},
              {"text", {{"format", {{"type", "json_schema"}, {"name", "doc"}, {"schema", schema}}}}}});
  check_doc(j["output"][0]["content"][0]["text"].get<std::string>());
  // A refused keyword names its field; nothing was submitted for it.
  j = h.post("/v1/chat/completions",
             chat({{"response_format",
                    {{"type", "json_schema"},
                     {"json_schema", {{"schema", {{"type", "string"}, {"not", {{"const", "a"}}}}}}}}}}),
             400);
  EXPECT_EQ(j["error"]["param"], "response_format");
  j = h.post("/v1/responses", {{"input", "go"}, {"text", {{"format", {{"type", "json_schema"}}}}}}, 400);
  EXPECT_EQ(j["error"]["param"], "text.format");
}

TEST(ServerStructuredOutput, HttpForcedToolCallsParseAndFollowTheirSchemas) {
  EngineHarness h;
  // One call (parallel_tool_calls false): the output ends after it. (With several allowed, the random model
  // goes on calling until max_tokens.)
  for (int seed = 0; seed < 6; ++seed) {
    json j = h.post("/v1/chat/completions", chat({{"seed", seed},
                                                  {"tools", kTools},
                                                  {"tool_choice", "required"},
                                                  {"parallel_tool_calls", false}}));
    const json& m = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
    ASSERT_TRUE(m.contains("tool_calls")) << j.dump();
    ASSERT_EQ(m["tool_calls"].size(), 1u);
    EXPECT_TRUE(m["content"].is_null()) << j.dump();
    for (const json& c : m["tool_calls"]) {
      const std::string name = c["function"]["name"];
      const json args = json::parse(c["function"]["arguments"].get<std::string>());
      if (name == "get_time") {
        EXPECT_TRUE(args["tz"] == "CET" || args["tz"] == "UTC") << args;
      } else {
        EXPECT_EQ(name, "get_weather");
        EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << args;
        EXPECT_TRUE(args["days"].is_number_integer()) << args;
      }
    }
  }
  // Named, and only one call (parallel_tool_calls false is implied by a name).
  const json named = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  for (int seed = 0; seed < 4; ++seed) {
    json j =
        h.post("/v1/chat/completions", chat({{"seed", seed}, {"tools", kTools}, {"tool_choice", named}}));
    const json& calls = j["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), 1u) << j.dump();
    EXPECT_EQ(calls[0]["function"]["name"], "get_time");
  }
  // A constraint and a forced call together: 400 naming both.
  json e = h.post("/v1/chat/completions",
                  chat({{"tools", kTools}, {"tool_choice", "required"}, {"regex", "a"}}), 400);
  EXPECT_EQ(e["error"]["param"], "regex");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("tool_choice"), std::string::npos);
}

}  // namespace
