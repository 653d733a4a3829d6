// The Jinja interpreter's contract beyond the oracle goldens (test_chat_template_oracles): error messages
// with lines, the sandbox, where a checkpoint's template is found, the variables transformers passes,
// concurrent renders, and the render-time budget (<= 1 ms for a 100-turn conversation with tools).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/test_support.h"
#include "template/template.h"
#include "tokenizer/chat_template.h"

namespace {

using kiln::test_support::error_of;
using kiln::test_support::expect_contains;
using kiln::tmpl::Template;
using ojson = nlohmann::ordered_json;

std::string render(const std::string& src, const ojson& vars = ojson::object()) {
  return Template(src).render(vars);
}

TEST(TemplateEngine, SyntaxErrorsNameTheLine) {
  expect_contains(error_of([] { Template("a\n{{ x "); }), {"template syntax error (line 2)", "'}}'"});
  expect_contains(error_of([] { Template("{% for x in y %}\n\n{% endif %}"); }), {"(line 3)", "endfor"});
  expect_contains(error_of([] { Template("{% frobnicate %}"); }),
                  {"unknown or unsupported tag 'frobnicate'"});
  expect_contains(error_of([] { Template("{{ 'abc }}"); }), {"unterminated string"});
  expect_contains(error_of([] { Template("{% if x %}"); }), {"unexpected end of template", "endif"});
  expect_contains(error_of([] { Template("{{ a b }}"); }), {"expected '}}'"});
  expect_contains(error_of([] { Template("{% extends 'base' %}"); }), {"unsupported tag 'extends'"});
  // Escapes take exactly their hex digits (a fuzzer's find: these used to escape as std::invalid_argument).
  expect_contains(error_of([] { Template("{{ '\\xzz' }}"); }), {"bad \\x escape"});
  expect_contains(error_of([] { Template("{{ '\\u12g4' }}"); }), {"bad \\u escape"});
  expect_contains(error_of([] { Template("{{ '\\U-0000001' }}"); }), {"bad \\U escape"});
  expect_contains(error_of([] { Template("{{ '\\UFFFFFFFF' }}"); }), {"out of range"});
  EXPECT_EQ(render("{{ '\\x41\\u00e9\\U0001F600' }}"), "A\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(TemplateEngine, RenderErrorsNameTheLineAndCause) {
  expect_contains(error_of([] { render("x\n{{ foo.bar }}"); }), {"(line 2)", "'foo' is undefined"});
  expect_contains(error_of([] { render("{{ raise_exception('no system role') }}"); }),
                  {"raise_exception: no system role"});
  expect_contains(error_of([] { render("{{ 1 + 'a' }}"); }), {"unsupported operand", "'int' and 'str'"});
  expect_contains(error_of([] { render("{{ 1 // 0 }}"); }), {"division or modulo by zero"});
  expect_contains(error_of([] { render("{{ x | nosuchfilter }}"); }), {"no filter named 'nosuchfilter'"});
  expect_contains(error_of([] { render("{% for x in none %}{% endfor %}"); }), {"not iterable"});
  // ImmutableSandboxedEnvironment: no mutation of lists and dicts.
  expect_contains(error_of([] { render("{{ xs.append(1) }}", {{"xs", ojson::array()}}); }), {"unsafe"});
  expect_contains(error_of([] { render("{{ d.update({}) }}", {{"d", ojson::object()}}); }), {"unsafe"});
  // Undefined is lenient where Jinja's default Undefined is: printing, truth, iteration, default, length.
  EXPECT_EQ(
      render("[{{ nope }}]{{ nope is defined }}{% for x in nope %}x{% endfor %}{{ nope | default('d') }}"
             "{{ nope | length }}{{ {}.missing }}"),
      "[]Falsed0");
}

// Recursion the parser's bounds do not see (issue 41): a macro calling itself from the bottom of a deep
// expression, values a template nests by itself, a namespace holding itself, and request JSON nested past
// the limit. Each overflowed the stack before.
TEST(TemplateEngine, DeepEvaluationAndDeepValuesFailCleanly) {
  std::string deep_call = "{% macro f() %}{{ 'a'";
  for (int i = 0; i < 190; ++i) deep_call += " ~ ('a'";
  deep_call += " ~ f()" + std::string(190, ')') + " }}{% endmacro %}{{ f() }}";
  expect_contains(error_of([&] { render(deep_call); }),
                  {"template evaluation nested deeper than 2000 levels"});
  const std::string chain =
      "{% set ns = namespace(x=none) %}{% for i in range(1000) %}{% for j in range(300) %}"
      "{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}";
  EXPECT_EQ(render(chain + "built"), "built");  // and freed without one stack frame per level
  for (const char* use :
       {"{{ ns.x }}", "{{ ns.x | tojson }}", "{{ ns.x == ns.x | list }}", "{{ ns.x < ns.x }}"})
    expect_contains(error_of([&] { render(chain + use); }), {"value nested deeper than 512 levels"});
  expect_contains(error_of([] { render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"); }),
                  {"value nested deeper than 512 levels"});
  // Values as deep as request JSON may be still work.
  std::string ok =
      "{% set ns = namespace(x=1) %}{% for i in range(200) %}{% set ns.x = [ns.x] %}{% endfor %}";
  EXPECT_EQ(render(ok + "{{ ns.x | tojson }}"), std::string(200, '[') + "1" + std::string(200, ']'));
  const auto ct = kiln::tok::ChatTemplate::load("", "{{ messages[0].x | tojson }}", "");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_contains(error_of([&] { ct->render(R"({"messages": [{"role": "user", "x": )" + deep + "}]}"); }),
                  {"chat request nests deeper than 128 levels"});
}

// A hostile or broken template fails cleanly instead of exhausting the stack or memory.
TEST(TemplateEngine, LimitsInsteadOfCrashes) {
  expect_contains(error_of([] { render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); }),
                  {"maximum macro recursion depth"});
  expect_contains(
      error_of([] { Template("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"); }),
      {"nested too deeply"});
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  expect_contains(error_of([&] { Template(chain + " }}"); }), {"nested too deeply"});
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  expect_contains(error_of([&] { Template{blocks}; }), {"nested too deeply"});
  expect_contains(error_of([] { render("{{ 'x' * 1000000000000 }}"); }), {"too large"});
  EXPECT_EQ(render("{{ 2 ** 100 }}"), "1.2676506002282294e+30");  // Python: the exact integer
  // A macro defined in a loop and called after it (kept in a namespace) sees what it saw when defined
  // (Jinja2 prints its internal "missing" sentinel here; either way nothing dangles).
  EXPECT_EQ(render("{% set ns = namespace(m=none) %}{% for i in [1, 2] %}{% macro f() %}{{ i }}{% endmacro %}"
                   "{% set ns.m = f %}{% endfor %}{{ ns.m() }}"),
            "2");
}

// Integers are 64-bit where Python's are unbounded: what fits matches Python, what would overflow is an
// error, and every width, indent and precision a template supplies is bounded (fuzzer finds: each of these
// used to be undefined behaviour, a trap or an allocation of gigabytes).
TEST(TemplateEngine, IntegerEdgesAndWidthsAreErrorsNotCrashes) {
  const std::string min = "(-9223372036854775807 - 1)";
  for (const std::string& expr :
       std::vector<std::string>{"9223372036854775807 + 1", min + " - 1", "9223372036854775807 * 3", "-" + min,
                                min + " // -1", min + " | abs", "[9223372036854775807, 1] | sum"})
    expect_contains(error_of([&] { render("{{ " + expr + " }}"); }), {"integer overflow"});
  EXPECT_EQ(render("{{ " + min + " % -1 }} {{ 7 // -1 }} {{ " + min + " is divisibleby(-1) }}"), "0 -7 True");
  EXPECT_EQ(render("{{ 3 ** 39 }} {{ 3 ** 40 }}"), "4052555153018976267 1.2157665459056929e+19");
  expect_contains(error_of([] { render("{{ 1e300 | int }}"); }), {"cannot convert float 1e+300"});
  expect_contains(error_of([] { render("{{ '1e300' | int }}"); }), {"cannot convert float"});
  expect_contains(error_of([] { render("{{ '%d' | format(1e300) }}"); }), {"cannot convert float"});
  EXPECT_EQ(render("{{ 'nan' | float | int }} {{ -2.7 | int }} {{ ' 12 ' | int }} {{ '+7' | int }} {{ "
                   "'2.5e1' | int }}"),
            "0 -2 12 7 25");
  EXPECT_EQ(render("{{ 11e3003 }} {{ 1e-400 }} {{ '1e999' | float }} {{ 'x' | float(default=1.5) }}"),
            "inf 0.0 inf 1.5");
  EXPECT_EQ(render("{{ ([[1]] | map(attribute='99999999999999999999') | first) is defined }}"), "False");
  EXPECT_EQ(render("{{ range(0, 9223372036854775807, 4611686018427387904) | list }}"),
            "[0, 4611686018427387904]");
  EXPECT_EQ(render("{{ [1, 2, 3][1::9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}"), "[2]c");
  EXPECT_EQ(
      render("[{{ '%5.2s' | format('abc') }}|{{ '%-4s' | format('\u00e9') }}|{{ '%05.1f' | format(2.25) }}]"),
      "[   ab|\u00e9   |002.2]");
  expect_contains(error_of([] { render("{{ '%2000d' | format(1) }}"); }), {"format field"});
  expect_contains(error_of([] { render("{{ '%.99999999999f' | format(1) }}"); }), {"format field"});
  EXPECT_EQ(render("{{ 'a\nb' | indent(-1) }}|{{ 'a\nb' | indent(2) }}"), "a\nb|a\n  b");
  expect_contains(error_of([] { render("{{ 'a\nb' | indent(100000000) }}"); }),
                  {"indent: width", "too large"});
  expect_contains(error_of([] { render("{{ 'a\nb\nc' | indent('y' * 40000000) }}"); }), {"too large"});
  expect_contains(error_of([] { render("{{ {'a': 1} | tojson(indent=5000) }}"); }),
                  {"indent 5000 is too large"});
}

TEST(TemplateEngine, VariablesAsTransformersPassesThem) {
  const std::string src =
      "{{ bos_token is defined }} {{ eos_token }} {{ tools is none }} {{ documents is none }} "
      "{{ add_generation_prompt }} {{ enable_thinking | default('unset') }} {{ custom }} {{ pad_token }}";
  const ojson cfg = {{"chat_template", src},
                     {"bos_token", nullptr},
                     {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}}},
                     {"pad_token", "<pad>"}};
  const auto ct = kiln::tok::ChatTemplate::load(cfg.dump(), "", "");
  EXPECT_EQ(ct->render(R"({"messages": []})"), "False </s> True True False unset  <pad>");
  EXPECT_EQ(ct->render(R"({"messages": [], "enable_thinking": false, "custom": [1, "x"], "pad_token": "P",
                           "add_generation_prompt": true})"),
            "False </s> True True True False [1, 'x'] P");
}

TEST(TemplateEngine, TemplateFoundWhereTransformersLooks) {
  const std::string cfg = R"({"chat_template": "config"})";
  const std::string file_json = R"({"chat_template": "json-file"})";
  const std::string req = R"({"messages": []})";
  EXPECT_EQ(kiln::tok::ChatTemplate::load(cfg, "jinja-file", file_json)->render(req), "jinja-file");
  EXPECT_EQ(kiln::tok::ChatTemplate::load(cfg, "", file_json)->render(req), "json-file");
  EXPECT_EQ(kiln::tok::ChatTemplate::load(cfg, "", "")->render(req), "config");
  EXPECT_TRUE(kiln::tok::ChatTemplate::load("{}", "", "")->empty());
  // Named templates: "tool_use" when the request has tools, else "default".
  const std::string named =
      R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})";
  const auto ct = kiln::tok::ChatTemplate::load(named, "", "");
  EXPECT_EQ(ct->render(req), "D");
  EXPECT_EQ(ct->render(R"({"messages": [], "tools": []})"), "T");
  EXPECT_EQ(ct->render(R"({"messages": [], "tools": null})"), "D");
  const auto no_default = kiln::tok::ChatTemplate::load(R"({"chat_template": [{"name": "a", "template": "A"},
      {"name": "b", "template": "B"}]})",
                                                        "", "");
  expect_contains(error_of([&] { no_default->render(req); }), {"none is named \"default\""});
  expect_contains(
      error_of([] { kiln::tok::ChatTemplate::load("{}", "", "")->render(R"({"messages": []})"); }),
      {"no chat template"});
  expect_contains(
      error_of([] { kiln::tok::ChatTemplate::load("{}", "x", "")->render(R"({"messages": 3})"); }),
      {"\"messages\" list"});
}

TEST(TemplateEngine, DescribeSaysWhereAndHow) {
  EXPECT_EQ(kiln::tok::ChatTemplate::load("{}", "", "")->describe(), "none");
  EXPECT_EQ(kiln::tok::ChatTemplate::load("{}", "{{ x }}", "")->describe(),
            "'default' from chat_template.jinja: Jinja, interpreted");
  expect_contains(kiln::tok::ChatTemplate::load(R"({"chat_template": "{% if %}"})", "", "")->describe(),
                  {"from tokenizer_config.json: does not parse: template syntax error (line 1)"});
}

const ojson& goldens() {
  static const ojson g = [] {
    std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/chat_templates/goldens.json");
    return ojson::parse(f);
  }();
  return g;
}

// 100 turns: user, assistant calling a tool, the tool's result, the assistant's answer; 4 tools.
ojson long_conversation(bool with_tools) {
  ojson msgs = ojson::array();
  msgs.push_back({{"role", "system"}, {"content", "You are a helpful assistant with tools."}});
  for (int i = 0; i < 25; ++i) {
    msgs.push_back({{"role", "user"},
                    {"content", "Question " + std::to_string(i) + ": what is the weather in city " +
                                    std::to_string(i) + " and how should I dress for it today?"}});
    if (with_tools) {
      msgs.push_back(
          {{"role", "assistant"},
           {"content", ""},
           {"tool_calls",
            {{{"type", "function"},
              {"function",
               {{"name", "get_weather"}, {"arguments", {{"city", "city " + std::to_string(i)}}}}}}}}});
      msgs.push_back({{"role", "tool"}, {"content", R"({"temp": 21.5, "sky": "clear", "wind": "5 km/h"})"}});
    } else {
      msgs.push_back({{"role", "assistant"}, {"content", "Let me think about it."}});
      msgs.push_back({{"role", "user"}, {"content", "Take your time."}});
    }
    msgs.push_back({{"role", "assistant"},
                    {"content", "It is 21.5 degrees and clear in city " + std::to_string(i) +
                                    ": a light jacket is enough, and sunglasses help."}});
  }
  ojson req = {{"messages", msgs}, {"add_generation_prompt", true}};
  if (with_tools) {
    ojson tools = ojson::array();
    for (const char* n : {"get_weather", "search", "calculator", "translate"})
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", n},
                         {"description", std::string("The ") + n + " tool."},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}, {"description", "City name"}}}}},
                           {"required", {"city"}}}}}}});
    req["tools"] = tools;
  }
  return req;
}

double best_render_us(const kiln::tok::ChatTemplate& ct, const std::string& req, bool interpreted, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string out = interpreted ? ct.render_interpreted(req) : ct.render(req);
    const auto t1 = std::chrono::steady_clock::now();
    EXPECT_GT(out.size(), 1000u);
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return best;
}

std::shared_ptr<const kiln::tok::ChatTemplate> golden_template(const std::string& name) {
  ojson cfg = goldens()["templates"][name]["special_tokens"];
  cfg["chat_template"] = goldens()["templates"][name]["source"];
  return kiln::tok::ChatTemplate::load(cfg.dump(), "", "");
}

// The budget is the issue's: <= 1 ms for a long conversation. Best of 50, so a loaded CI machine does not
// make it flaky; the figures are printed for docs/PERF.md.
TEST(TemplateEngine, LongConversationRendersWithinOneMillisecond) {
  const std::string tools = long_conversation(true).dump(), plain = long_conversation(false).dump();
  struct Case {
    const char* name;
    const std::string* req;
    bool interpreted;
  } cases[] = {{"real/qwen3", &tools, true},        {"real/qwen3", &tools, false},
               {"feature/chat_full", &tools, true}, {"real/llama3_1", &plain, true},
               {"real/gemma3", &plain, true},       {"real/deepseek_v3", &plain, true}};
  for (const auto& c : cases) {
    const auto ct = golden_template(c.name);
    const double us = best_render_us(*ct, *c.req, c.interpreted, 50);
    std::printf("%-20s %-11s 100 turns%s: %.0f us\n", c.name, c.interpreted ? "interpreter" : "native",
                c.req == &tools ? " + 4 tools" : "", us);
    EXPECT_LE(us, 1000.0) << c.name;
  }
}

TEST(TemplateEngine, ConcurrentRendersAgree) {
  const auto ct = golden_template("real/qwen3");
  const std::string req = long_conversation(true).dump();
  const std::string want = ct->render_interpreted(req);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) ok[size_t(t)] += ct->render_interpreted(req) == want;
    });
  for (auto& th : threads) th.join();
  for (int n : ok) EXPECT_EQ(n, 20);
}

}  // namespace
