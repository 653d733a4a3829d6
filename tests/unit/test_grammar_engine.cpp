// The grammar engine against its own oracle: at every step of seeded random walks the mask equals the set of
// tokens accept_token takes; rollback restores; EOS only where complete; compile-time refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "grammar_test_util.h"

namespace kiln::grammar {
namespace {

using testing::accepts_bytes;
using testing::random_walk;
using testing::small_vocab;

std::shared_ptr<const CompiledGrammar> build(GrammarKind k, const std::string& src, CompileOptions o = {}) {
  return compile(k, src, small_vocab(), o);
}

TEST(GrammarEngine, MaskEqualsAcceptOnWalks) {
  const std::vector<std::pair<GrammarKind, std::string>> cases = {
      {GrammarKind::regex, "[a-c]{1,3}(x|yz)*"},
      {GrammarKind::regex, "\\d+(\\.\\d+)?"},
      {GrammarKind::ebnf, "root ::= \"(\" root \")\" root | \"\"\n"},
      {GrammarKind::ebnf, "root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"[\" root \"]\"\n"},
      {GrammarKind::any_json, ""},
      {GrammarKind::json_schema,
       R"({"type":"object","properties":{"name":{"type":"string"},"id":{"type":"integer"},
           "tags":{"type":"array","items":{"enum":["a","b","abc"]},"maxItems":3}},"required":["name"]})"},
      {GrammarKind::json_schema,
       R"({"anyOf":[{"type":"string","maxLength":2},{"type":"number"},{"type":"null"}]})"},
      {GrammarKind::json_schema, R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},
           "additionalProperties":false}},"$ref":"#/$defs/n"})"},
  };
  for (const auto& [kind, src] : cases) {
    CompileOptions o;
    o.max_whitespace = 3;
    auto g = build(kind, src, o);
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      random_walk(g, seed, 40, true);
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << src << " seed " << seed;
    }
  }
}

TEST(GrammarEngine, PrecomputedCacheGivesTheSameMasks) {
  CompileOptions lazy, eager;
  lazy.max_whitespace = eager.max_whitespace = 2;
  eager.precompute = true;
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"boolean"}}})";
  auto g1 = build(GrammarKind::json_schema, schema, lazy);
  auto g2 = build(GrammarKind::json_schema, schema, eager);
  EXPECT_GT(g2->num_keys_computed(), 0u);
  for (uint64_t seed = 1; seed <= 4; ++seed)
    EXPECT_EQ(random_walk(g1, seed, 30, false), random_walk(g2, seed, 30, false));
}

TEST(GrammarEngine, SampledJsonParses) {
  CompileOptions o;
  o.max_whitespace = 2;
  auto g = build(
      GrammarKind::json_schema,
      R"({"type":"object","properties":{"x":{"type":"integer","minimum":-50,"maximum":1000},"s":{"type":"string"}},
                     "required":["x","s"],"additionalProperties":false})",
      o);
  int ended_count = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    bool ended = false;
    const std::string text = random_walk(g, seed, 400, false, &ended);
    if (!ended) continue;
    ++ended_count;
    const auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object() && j.size() == 2 && j["x"].is_number_integer() && j["x"].get<int>() >= -50 &&
                j["x"].get<int>() <= 1000 && j["s"].is_string())
        << text;
  }
  EXPECT_GT(ended_count, 10);
}

TEST(GrammarEngine, RollbackRestoresState) {
  auto g = build(GrammarKind::regex, "ab|ac");
  Matcher m(g);
  ASSERT_TRUE(m.accept_token('a'));
  ASSERT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.is_complete());
  m.rollback(1);
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.accept_token('c'));
  EXPECT_TRUE(m.is_complete());
  const int32_t eos = int32_t(vocab_size(g->vocab()) - 1);
  EXPECT_TRUE(m.accept_token(eos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token('a'));
  m.rollback(1);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_THROW(m.rollback(5), Error);
}

TEST(GrammarEngine, EosOnlyWhereComplete) {
  auto g = build(GrammarKind::regex, "a+");
  Matcher m(g);
  const int32_t eos = int32_t(vocab_size(g->vocab()) - 1);
  EXPECT_FALSE(m.accept_token(eos));
  ASSERT_TRUE(m.accept_token('a'));
  std::vector<uint32_t> mask(mask_words(g->vocab()));
  m.fill_next_token_bitmask(mask.data(), mask.size());
  EXPECT_TRUE(testing::bit(mask, eos));
  EXPECT_TRUE(testing::bit(mask, 'a'));
  EXPECT_FALSE(testing::bit(mask, 'b'));
}

TEST(GrammarEngine, RefusesGrammarsThatCannotFinish) {
  EXPECT_THROW(build(GrammarKind::ebnf, "root ::= \"a\" root\n"), Error);
  EXPECT_THROW(build(GrammarKind::json_schema, "false"), Error);
  EXPECT_THROW(build(GrammarKind::json_schema, R"({"type":"array","minItems":3,"maxItems":2})"), Error);
  EXPECT_THROW(build(GrammarKind::ebnf, "root ::= root \"a\" | \"b\"\n"), Error);  // left recursion
  EXPECT_THROW(build(GrammarKind::ebnf, "root ::= x\n"), Error);                   // undefined rule
}

TEST(GrammarEngine, DeepRecursionIsBounded) {
  CompileOptions o;
  o.max_depth = 20;
  auto g = build(GrammarKind::ebnf, "root ::= \"[\" root \"]\" | \"x\"\n", o);
  EXPECT_TRUE(accepts_bytes(g, std::string(10, '[') + "x" + std::string(10, ']')));
  EXPECT_FALSE(accepts_bytes(g, std::string(40, '[') + "x" + std::string(40, ']')));
  auto any = build(GrammarKind::any_json, "", o);
  EXPECT_FALSE(accepts_bytes(any, std::string(100, '[') + std::string(100, ']')));
  EXPECT_TRUE(accepts_bytes(any, "[[[]]]"));
}

TEST(GrammarEngine, MatchersOnThreadsShareOneGrammar) {
  // The lazy mask cache fills from several threads at once; every thread must see the walks a lone thread
  // sees.
  CompileOptions o;
  o.max_whitespace = 2;
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"string","maxLength":4},
      "b":{"type":"array","items":{"type":"integer","minimum":-5}}},"required":["a"]})";
  std::vector<std::string> expected;
  {
    auto g = build(GrammarKind::json_schema, schema, o);
    for (uint64_t seed = 0; seed < 8; ++seed) expected.push_back(random_walk(g, seed, 60, false));
  }
  auto shared = build(GrammarKind::json_schema, schema, o);
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (uint64_t seed = 0; seed < 8; ++seed)
    threads.emplace_back([&, seed] { got[seed] = random_walk(shared, seed, 60, false); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, expected);
}

TEST(GrammarEngine, CacheSharesCompiledGrammars) {
  GrammarCache cache(small_vocab());
  auto a = cache.get(GrammarKind::regex, "a+");
  auto b = cache.get(GrammarKind::regex, "a+");
  auto c = cache.get(GrammarKind::regex, "b+");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace kiln::grammar
