// The tool-call front end: Qwen3's `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` blocks, each
// call object a JSON Schema (one alternative per tool, its parameters as the arguments' schema), wrapped in
// the literal text around it. The spec is JSON (README.md, "Front ends"); the JSON pieces come from the
// JSON Schema front end and are imported rule by rule.
#include <nlohmann/json.hpp>

#include "grammar/front_ends.h"
#include "kiln/error.h"

namespace kiln::grammar {
namespace {

// Ordered: the call object lists "name" before "arguments", as Qwen3 writes it, and each tool's
// parameters keep the order they came in.
using json = nlohmann::ordered_json;

// Copies g's rules and lexemes into b; returns the id g's root has there.
uint32_t import_grammar(GrammarBuilder& b, const Grammar& g) {
  const uint32_t base = uint32_t(b.num_rules());
  for (const Rule& r : g.rules) b.new_rule(r.name);
  for (size_t i = 0; i < g.rules.size(); ++i)
    for (const std::vector<Element>& alt : g.rules[i].alts) {
      std::vector<Element> seq;
      seq.reserve(alt.size());
      for (const Element& e : alt)
        seq.push_back(e.kind == Element::Kind::rule ? b.call(base + e.id) : b.lexeme(g.lexemes[e.id]));
      b.add_alt(base + uint32_t(i), std::move(seq));
    }
  return base + g.root;
}

// One or more UTF-8 characters with no `marker` among them: the free text a call may follow.
Dfa text_without(std::string_view marker) {
  CharSet all;
  all.add(0, 0x10FFFF);
  const Re any = re_repeat(re_chars(all), 0, -1);
  const Dfa text = compile_re(re_repeat(re_chars(all), 1, -1));
  const Dfa containing = compile_re(re_concat({any, re_bytes(marker), any}));
  return dfa_difference(text, containing);
}

}  // namespace

Grammar tool_call_grammar(std::string_view spec_json, const CompileOptions& options) {
  json spec;
  try {
    spec = json::parse(spec_json);
  } catch (const json::exception& e) {
    KILN_FAIL("tool calls: the spec is not valid JSON: ", e.what());
  }
  KILN_CHECK(spec.is_object() && spec.contains("tools") && spec["tools"].is_array() && !spec["tools"].empty(),
             "tool calls: the spec needs a non-empty 'tools' list");
  json alts = json::array();
  for (const json& t : spec["tools"]) {
    KILN_CHECK(t.is_object() && t.contains("name") && t["name"].is_string(),
               "tool calls: a tool needs a name");
    json params = t.value("parameters", json::object());
    if (params.is_null()) params = json::object();
    alts.push_back({{"type", "object"},
                    {"properties", {{"name", {{"const", t["name"]}}}, {"arguments", params}}},
                    {"required", {"name", "arguments"}},
                    {"additionalProperties", false}});
  }
  const json call_schema = alts.size() == 1 ? alts[0] : json{{"anyOf", alts}};
  const int min_calls = spec.value("min_calls", 1);
  const int max_calls = spec.value("max_calls", 0);  // 0: no limit
  const bool free_text = spec.value("free_text", false);
  KILN_CHECK(min_calls >= 0 && min_calls <= 1 && max_calls >= 0 && (max_calls == 0 || max_calls >= min_calls),
             "tool calls: min_calls must be 0 or 1 and max_calls 0 (no limit) or >= min_calls");
  const std::string begin = spec.value("begin", std::string("<tool_call>\n"));
  const std::string end = spec.value("end", std::string("\n</tool_call>"));
  const std::string sep = spec.value("separator", std::string("\n"));

  GrammarBuilder b;
  const uint32_t root = b.new_rule("root");
  const uint32_t obj = import_grammar(b, json_schema_grammar(call_schema.dump(), options));
  const uint32_t call = b.new_rule("tool_call");
  b.add_alt(call, {b.literal(begin), b.call(obj), b.literal(end)});
  // calls ::= call (sep calls)? : right recursion, a tail call (no stack growth per call).
  const uint32_t calls = b.new_rule("tool_calls");
  b.add_alt(calls, {b.call(call)});
  if (max_calls != 1) b.add_alt(calls, {b.call(call), b.literal(sep), b.call(calls)});
  if (free_text) {
    const Element text = b.lexeme(text_without(begin.substr(0, begin.find('\n'))));
    b.add_alt(root, {text});
    b.add_alt(root, {text, b.call(calls)});
  }
  if (min_calls == 0 && !free_text) KILN_FAIL("tool calls: min_calls 0 needs free_text");
  b.add_alt(root, {b.call(calls)});
  return b.finish(root);
}

}  // namespace kiln::grammar
