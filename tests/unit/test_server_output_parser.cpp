// The chat output parser (server/output_parser.h): reasoning and tool-call blocks, checked on the whole
// text and on every way of feeding it -- cut at every byte (so every tag and every UTF-8 character is
// split at every position), byte by byte, and in pieces of 3 -- which must all give the same result.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/output_parser.h"

using namespace kiln::server;

namespace {

struct Result {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

Result feed_pieces(const ParserOptions& o, const std::vector<std::string>& pieces) {
  OutputParser p(o);
  ParsedDelta all;
  for (const auto& s : pieces) all.append(p.feed(s));
  all.append(p.finish());
  EXPECT_EQ(p.tool_call_count(), int(all.tool_calls.size()));
  return {all.content, all.reasoning, all.tool_calls};
}

void expect_same(const Result& got, const Result& want, const std::string& how) {
  EXPECT_EQ(got.content, want.content) << how;
  EXPECT_EQ(got.reasoning, want.reasoning) << how;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << how;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].index, int(i)) << how;
    EXPECT_EQ(got.calls[i].id, "call_x_" + std::to_string(i)) << how;
    EXPECT_EQ(got.calls[i].name, want.calls[i].name) << how;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].arguments) << how;
  }
}

// Checks `text` gives `want` fed whole, cut once at every byte, byte by byte, and in 3-byte pieces.
void check_all_splits(ParserOptions o, const std::string& text, const Result& want) {
  o.id_prefix = "call_x_";
  expect_same(feed_pieces(o, {text}), want, "whole");
  for (size_t k = 0; k <= text.size(); ++k)
    expect_same(feed_pieces(o, {text.substr(0, k), text.substr(k)}), want, "cut at " + std::to_string(k));
  std::vector<std::string> bytes, threes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  for (size_t i = 0; i < text.size(); i += 3) threes.push_back(text.substr(i, 3));
  expect_same(feed_pieces(o, bytes), want, "byte by byte");
  expect_same(feed_pieces(o, threes), want, "3-byte pieces");
}

ToolCall call(std::string name, std::string args) {
  ToolCall c;
  c.name = std::move(name);
  c.arguments = std::move(args);
  return c;
}

const ParserOptions kReasoning{.reasoning = true};
const ParserOptions kTools{.tools = true};
const ParserOptions kBoth{.reasoning = true, .tools = true};

}  // namespace

TEST(OutputParser, ReasoningIsSplitFromContentAtEveryByteBoundary) {
  // Multi-byte text on both sides of both tags: é (2 bytes), 中 (3), 😀 (4).
  check_all_splits(kReasoning, "<think>\nLet me think: é中😀.\n\n</think>\n\nThe answer is 42 😀.",
                   {"The answer is 42 😀.", "Let me think: é中😀.", {}});
  // Inner newlines of the reasoning are kept; only its ends are stripped.
  check_all_splits(kReasoning, "  <think>a\n\nb </think>c\n", {"c\n", "a\n\nb", {}});
}

TEST(OutputParser, OutputThatDoesNotOpenWithThinkIsContent) {
  check_all_splits(kReasoning, "Hello <think>not reasoning</think> world",
                   {"Hello <think>not reasoning</think> world", "", {}});
  check_all_splits(kReasoning, "<thinking> is not the tag", {"<thinking> is not the tag", "", {}});
  check_all_splits(kReasoning, "  \n", {"  \n", "", {}});    // whitespace only: content
  check_all_splits(kReasoning, "<thin", {"<thin", "", {}});  // a tag prefix at the end is released
  check_all_splits(kReasoning, "", {"", "", {}});
}

TEST(OutputParser, UnclosedReasoningIsReasoningAndStartInReasoningNeedsNoOpenTag) {
  check_all_splits(kReasoning, "<think>\nstill going é", {"", "still going é", {}});
  ParserOptions o = kReasoning;
  o.start_in_reasoning = true;
  check_all_splits(o, "\ndeep thought\n</think>\n\nanswer", {"answer", "deep thought", {}});
  check_all_splits(o, "<think>x</think>y", {"y", "x", {}});  // a redundant open tag is dropped
}

TEST(OutputParser, ReasoningOffLeavesTagsInline) {
  const std::string t = "<think>\nr\n</think>\n\nc <tool_call>{\"name\": \"f\"}</tool_call>";
  check_all_splits(ParserOptions{}, t, {t, "", {}});
}

TEST(OutputParser, SeveralToolCallsAtEveryByteBoundary) {
  const std::string t =
      "Let me check é.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"°C\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>\n";
  check_all_splits(
      kTools, t,
      {"Let me check é.",
       "",
       {call("get_weather", R"({"city":"Paris","unit":"°C","days":[1,2]})"), call("get_time", "{}")}});
  // Arguments absent mean {}; key order is the model's.
  check_all_splits(kTools, "<tool_call>{\"arguments\": {\"z\": 1, \"a\": 2}, \"name\": \"f\"}</tool_call>",
                   {"", "", {call("f", R"({"z":1,"a":2})")}});
  check_all_splits(kTools, "<tool_call>{\"name\": \"g\"}</tool_call>", {"", "", {call("g", "{}")}});
}

TEST(OutputParser, ThinkingThenToolCalls) {
  const std::string t =
      "<think>\nI should call <tool_call>{\"name\": \"no\"}</tool_call> later.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"中\"}}\n</tool_call>";
  // A call inside reasoning is reasoning text, not a call.
  check_all_splits(
      kBoth, t,
      {"", "I should call <tool_call>{\"name\": \"no\"}</tool_call> later.", {call("f", R"({"q":"中"})")}});
}

TEST(OutputParser, MalformedAndUnclosedBlocksStayInContent) {
  const std::string bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>";
  check_all_splits(kTools, "Try: " + bad, {"Try: " + bad, "", {}});
  for (const std::string inner : {"[1, 2]", "{\"arguments\": {}}", "{\"name\": \"\"}", "{\"name\": 3}",
                                  "{\"name\": \"f\", \"arguments\": \"x\"}", ""}) {
    const std::string b = "<tool_call>" + inner + "</tool_call>";
    check_all_splits(kTools, b, {b, "", {}});
  }
  // A good call, then a bad one, then text: the bad one is content, with the whitespace before it.
  check_all_splits(kTools, "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{</tool_call> end",
                   {"\n<tool_call>{</tool_call> end", "", {call("a", "{}")}});
  // Unclosed at the end of output (e.g. max_tokens): verbatim.
  check_all_splits(kTools, "ok <tool_call>{\"name\": \"f\", \"argu",
                   {"ok <tool_call>{\"name\": \"f\", \"argu", "", {}});
  // Tag look-alikes are content.
  check_all_splits(kTools, "a <tool_calls> b <tool_cal", {"a <tool_calls> b <tool_cal", "", {}});
}

TEST(OutputParser, HoldsBackOnlyWhatCouldBeATag) {
  OutputParser p(kTools);
  EXPECT_EQ(p.feed("Hi<tool_c").content, "Hi");
  EXPECT_EQ(p.feed("x").content, "<tool_cx");  // not a tag after all
  EXPECT_EQ(p.feed(" and<").content, " and");
  const ParsedDelta d = p.feed("tool_call>{\"name\": \"f\"}");  // inside a block: nothing yet
  EXPECT_TRUE(d.empty());
  const ParsedDelta e = p.feed("</tool_call>");
  ASSERT_EQ(e.tool_calls.size(), 1u);
  EXPECT_EQ(e.tool_calls[0].name, "f");
  EXPECT_EQ(e.tool_calls[0].id, "call_0");
  EXPECT_TRUE(p.finish().empty());

  OutputParser r(kReasoning);
  EXPECT_TRUE(r.feed("<thi").empty());
  EXPECT_TRUE(r.feed("nk>\n").empty());
  EXPECT_EQ(r.feed("step one\n").reasoning, "step one");  // its trailing newline waits
  EXPECT_EQ(r.feed("step two</th").reasoning, "\nstep two");
  const ParsedDelta f = r.feed("ink>\n\nDone");
  EXPECT_EQ(f.reasoning, "");
  EXPECT_EQ(f.content, "Done");
}
