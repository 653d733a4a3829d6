// Each front end's language, checked text by text (byte tokens of the small vocabulary): JSON Schema per
// keyword, regex, EBNF; unicode and escapes in strings; refusals that name the keyword.
#include <gtest/gtest.h>

#include "grammar/front_ends.h"
#include "grammar_test_util.h"

namespace kiln::grammar {
namespace {

using testing::accepts_bytes;

struct Case {
  const char* schema;
  std::vector<std::string> accept, reject;
};

void check(GrammarKind kind, const Case& c, CompileOptions o = {}) {
  auto g = compile(kind, c.schema, testing::small_vocab(), o);
  for (const auto& t : c.accept) EXPECT_TRUE(accepts_bytes(g, t)) << c.schema << " should accept: " << t;
  for (const auto& t : c.reject) EXPECT_FALSE(accepts_bytes(g, t)) << c.schema << " should reject: " << t;
}

TEST(GrammarJsonSchema, Keywords) {
  const std::vector<Case> cases = {
      {R"({"type":"integer"})", {"0", "-12", "42"}, {"1.5", "01", "\"1\"", "", "1e3"}},
      {R"({"type":"number"})", {"0", "-1.5", "2e10", "3.25E-2"}, {".5", "1.", "--1", "NaN"}},
      {R"({"type":["string","null"]})", {"null", "\"x\""}, {"1", "true"}},
      {R"({"type":"boolean"})", {"true", "false"}, {"null", "True"}},
      {R"({"type":"integer","minimum":-3,"maximum":120})", {"-3", "0", "99", "120"}, {"-4", "121", "1000"}},
      {R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9"}, {"0", "10", "-1"}},
      {R"({"type":"integer","minimum":5})", {"5", "10", "123456"}, {"4", "-5", "0"}},
      {R"({"type":"number","minimum":0,"maximum":2})",
       {"0", "1.5", "2", "2.0", "0.001"},
       {"-0.5", "2.5", "2.01", "3"}},
      {R"({"type":"number","exclusiveMinimum":0})", {"0.1", "5", "1000.5"}, {"0", "-1", "0.0"}},
      {R"({"type":"number","minimum":1.1,"maximum":2.25})",
       {"1.1", "1.10", "1.5", "2", "2.25", "2.2"},
       {"1", "1.09", "2.26", "2.3", "3", "-1.5"}},
      {R"({"type":"number","exclusiveMinimum":-2.5,"exclusiveMaximum":-0.5})",
       {"-2.4", "-1", "-0.51", "-2.49"},
       {"-2.5", "-0.5", "0", "-3", "-2.51"}},
      {R"({"type":"number","maximum":-1.5})", {"-1.5", "-2", "-100.25"}, {"-1.4", "0", "1"}},
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {"\"ab\"", "\"abc\"", "\"\\n\\t\"", "\"\xC3\xA9\xC3\xA9\""},
       {"\"a\"", "\"abcd\"", "\"\xC3\xA9\""}},
      {R"({"type":"string","pattern":"^[a-z]+[0-9]?$"})",
       {"\"abc\"", "\"ab1\""},
       {"\"1a\"", "\"ab12\"", "\"\""}},
      {R"({"type":"string","pattern":"b+"})", {"\"abbc\"", "\"b\""}, {"\"ac\""}},
      {R"({"type":"string","pattern":"^a\"b\\\\c$"})", {"\"a\\\"b\\\\c\""}, {"\"a\"b\\c\""}},
      {R"({"type":"string","format":"date"})", {"\"2024-02-29\""}, {"\"2024-13-01\"", "\"24-01-01\""}},
      {R"({"type":"string","format":"date-time"})",
       {"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T03:04:05.5+01:00\""},
       {"\"2024-01-02 03:04\""}},
      {R"({"type":"string","format":"uuid"})",
       {"\"123e4567-e89b-12d3-a456-426614174000\""},
       {"\"123e4567\""}},
      {R"({"type":"string","format":"ipv4"})", {"\"192.168.0.1\""}, {"\"256.1.1.1\"", "\"1.2.3\""}},
      {R"({"type":"string","format":"email"})", {"\"a.b@example.com\""}, {"\"a@\"", "\"@b.com\""}},
      {R"({"enum":["a","b c",1,null,{"k":[1]}]})",
       {"\"a\"", "\"b c\"", "1", "null", "{\"k\": [1]}", "{ \"k\":[ 1 ] }"},
       {"\"c\"", "2", "{\"k\":[2]}"}},
      {R"({"const":"x"})", {"\"x\""}, {"\"y\"", "x"}},
      {R"({"const":3})", {"3", "3.0"}, {"4"}},
      {R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})",
       {"1", "\"a\""},
       {"\"ab\"", "true"}},
      {R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"0"}},
      {R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                    {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
       {"{\"a\":1,\"b\":\"x\"}"},
       {"{\"a\":1}", "{\"b\":\"x\"}"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"}},"required":["b"],
           "additionalProperties":false})",
       {"{\"b\":true}", "{\"a\":1,\"b\":false}", "{ \"a\" : 1 ,\n  \"b\" : true }"},
       {"{}", "{\"a\":1}", "{\"b\":true,\"c\":1}", "{\"b\":1}", "{\"b\":true,}"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"}}})",
       {"{}", "{\"a\":1}", "{\"a\":1,\"zz\":[true,{}]}", "{\"q\":null}"},
       {"{\"a\":\"x\"}", "{\"a\":1,\"a\":2}"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", "{\"x\":1,\"y\":2}"},
       {"{\"x\":\"1\"}"}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
       {"[1]", "[1,2,3]", "[ 1 , 2 ]"},
       {"[]", "[1,2,3,4]", "[\"a\"]", "[1,]"}},
      {R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
       {"[\"a\",1]", "[\"a\"]", "[]"},
       {"[1,\"a\"]", "[\"a\",1,2]"}},
      {R"({"type":"array","items":[{"type":"integer"}],"additionalItems":{"type":"string"}})",
       {"[1,\"a\",\"b\"]"},
       {"[1,2]"}},
      {R"({"$defs":{"t":{"type":"object","properties":{"c":{"type":"array","items":{"$ref":"#/$defs/t"}}},
           "additionalProperties":false}},"$ref":"#/$defs/t"})",
       {"{}", "{\"c\":[]}", "{\"c\":[{\"c\":[{}]}]}"},
       {"{\"c\":[1]}", "{\"d\":1}"}},
      {R"({"definitions":{"n":{"type":"integer"}},"type":"array","items":{"$ref":"#/definitions/n"}})",
       {"[1,2]"},
       {"[\"x\"]"}},
      {R"(true)", {"1", "\"s\"", "[{\"a\":null}]", "{}"}, {"", "{", "tru"}},
      {R"({"type":"string"})",
       {"\"\xE4\xB8\xAD\xE6\x96\x87\"", "\"\xF0\x9F\x98\x80\"", "\"\\u00e9\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        "\"\""},
       {"\"\\x\"", "\"\\u12\"", "\"a\nb\"", "\"\xC3\"", "\"\xED\xA0\x80\"", "\"\xC0\xAF\""}},
  };
  for (const auto& c : cases) check(GrammarKind::json_schema, c);
}

TEST(GrammarJsonSchema, DirectStringAutomatonEqualsTheRegexOne) {
  for (auto [lo, hi] :
       std::vector<std::pair<int, int>>{{0, -1}, {0, 0}, {2, 3}, {1, -1}, {3, -1}, {0, 5}, {4, 4}}) {
    const Dfa direct = json_string_dfa(lo, hi), via_regex = compile_re(json_string_re(lo, hi));
    EXPECT_EQ(dfa_difference(direct, via_regex).start, -1) << lo << "," << hi;
    EXPECT_EQ(dfa_difference(via_regex, direct).start, -1) << lo << "," << hi;
    EXPECT_GE(direct.start, 0);
  }
}

TEST(GrammarJsonSchema, StrictClosesObjects) {
  CompileOptions o;
  o.strict = true;
  check(GrammarKind::json_schema,
        {R"({"type":"object","properties":{"a":{"type":"integer"}}})", {"{\"a\":1}", "{}"}, {"{\"b\":1}"}},
        o);
}

TEST(GrammarJsonSchema, RefusesUnsupportedKeywordsByName) {
  for (const auto& [schema, keyword] : std::vector<std::pair<std::string, std::string>>{
           {R"({"not":{"type":"string"}})", "not"},
           {R"({"type":"integer","multipleOf":3})", "multipleOf"},
           {R"({"type":"object","patternProperties":{"^a":{}}})", "patternProperties"},
           {R"({"type":"string","format":"ipv6"})", "format"},
           {R"({"type":"number","minimum":1e300})", "minimum"},
           {R"({"type":"array","uniqueItems":true})", "uniqueItems"}}) {
    try {
      compile(GrammarKind::json_schema, schema, testing::small_vocab());
      ADD_FAILURE() << "accepted " << schema;
    } catch (const UnsupportedKeyword& e) {
      EXPECT_EQ(e.keyword(), keyword) << schema;
    }
  }
  CompileOptions lenient;
  lenient.lenient = true;
  check(GrammarKind::json_schema, {R"({"type":"integer","multipleOf":3,"not":{}})", {"4"}, {"\"4\""}},
        lenient);
  EXPECT_THROW(compile(GrammarKind::json_schema, "{\"type\":", testing::small_vocab()), Error);
  EXPECT_THROW(compile(GrammarKind::json_schema, R"({"$ref":"#/nope"})", testing::small_vocab()), Error);
  EXPECT_THROW(compile(GrammarKind::json_schema, R"({"$ref":"http://x/y"})", testing::small_vocab()), Error);
}

TEST(GrammarRegex, Dialect) {
  const std::vector<Case> cases = {
      {"a|bc", {"a", "bc"}, {"", "b", "abc"}},
      {"^(ab)+$", {"ab", "abab"}, {"", "aba"}},
      {"[^a-c]{2,3}", {"xy", "xyz", "\xC3\xA9z"}, {"a1", "x", "wxyz"}},
      {"\\d{3}-\\w\\s", {"123-_ ", "000-a\t"}, {"12-a ", "123--a"}},
      {"x{2,}y?", {"xx", "xxxxy"}, {"x", "xy"}},
      {"(?:a|b)*c", {"c", "ababc"}, {"ab"}},
      {".", {"a", "\xC3\xA9", "\xF0\x9F\x98\x80"}, {"\n", "ab", "\xC3"}},
      {"[\\u00e9-\\u00ea]", {"\xC3\xA9", "\xC3\xAA"}, {"e"}},
      {"(a?)*b", {"b", "aab"}, {"a"}},
      {"a{2}", {"aa"}, {"a", "aaa"}},
      {"\\.\\*\\[", {".*["}, {"a"}},
  };
  for (const auto& c : cases) check(GrammarKind::regex, c);
  for (const char* bad : {"(a", "a)", "*a", "\\1", "(?=a)", "a\\b", "[a", "a{3,1}", "\\p{L}", "a$b"})
    EXPECT_THROW(compile(GrammarKind::regex, bad, testing::small_vocab()), Error) << bad;
}

TEST(GrammarEbnf, Syntax) {
  const std::vector<Case> cases = {
      {"root ::= \"a\" | \"b\" root  # a comment\n", {"a", "ba", "bba"}, {"", "b", "ab"}},
      {"root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list\n",
       {"[]", "[1,22]", "[[1],[]]"},
       {"[", "[1,]", "[,]"}},
      {"root ::= [a-z]{2,3} \"\\n\" [^\\n]* \"!\"\n", {"ab\nxyz!", "abc\n!"}, {"a\n!", "ab\n"}},
      {"root ::= (\"x\" | \"y\")+ z?\nz ::= \"\\u00e9\"\n", {"x", "xyx\xC3\xA9"}, {"", "\xC3\xA9"}},
      {"root ::= a b\na ::= \"a\"*\nb ::= \"b\"\n", {"b", "aab"}, {"a"}},
      {"root ::=\n  \"p\"\n  | \"q\"\n", {"p", "q"}, {"pq"}},
  };
  for (const auto& c : cases) check(GrammarKind::ebnf, c);
  for (const char* bad : {"", "x ::= \"a\"\n", "root ::= \"a\n", "root ::= (\"a\"\n", "root ::= [a-\n",
                          "root ::= a\n", "root = \"a\"\n", "root ::= \"a\"\nroot ::= \"b\"\n"})
    EXPECT_THROW(compile(GrammarKind::ebnf, bad, testing::small_vocab()), Error) << bad;
}

TEST(GrammarAnyJson, Values) {
  check(GrammarKind::any_json,
        {"",
         {"{}", "[]", "{\"a\": [1, 2.5e3, \"x\", true, false, null, {}]}", "\"s\"", "-0", "  [ ]  "},
         {"{", "[1,]", "{\"a\"}", "{a:1}", "'x'", "[01]", "{\"a\":1,}"}});
}

}  // namespace
}  // namespace kiln::grammar
