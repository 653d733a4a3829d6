// Streaming parser for Qwen3's chat output: splits the generated text into content, reasoning (the text
// between <think> and </think>) and tool calls (<tool_call>{"name": ..., "arguments": {...}}</tool_call>
// blocks), as SGLang's `--reasoning-parser qwen3` and `--tool-call-parser qwen25` do.
//
// Contract:
// - feed() takes decoded text in pieces of any size (a tag may straddle any number of pieces, and a piece
//   may end inside a UTF-8 character: the parser works on bytes and only ever cuts at tag boundaries, so
//   what it releases re-joins into the input exactly, less the tags and the whitespace named below).
// - It holds back only what could still become a tag (a suffix that is a proper prefix of a tag it is
//   looking for), the inside of an unfinished <tool_call> block, and whitespace whose role is not yet
//   known. finish() releases all of that at the end of the output.
// - Feeding a text in one piece or in any split gives the same concatenated content, reasoning and calls
//   (so the non-streaming reply and the streamed deltas agree).
//
// Reasoning (ParserOptions::reasoning): a <think> that opens the output (after optional whitespace)
// starts reasoning, as does start_in_reasoning (the prompt already opened <think>). Reasoning ends at
// the first </think>; an output that ends before it is all reasoning (SGLang's "truncated reasoning").
// Reasoning is stripped of surrounding whitespace, and the content after </think> of its leading
// whitespace. An output that does not open with <think> (and start_in_reasoning false) is all content.
//
// Tool calls (ParserOptions::tools), looked for in content only (never inside reasoning): each block whose
// inside is a JSON object with a string "name" and an object "arguments" (absent means {}) becomes a
// ToolCall; any other block, and an unclosed one at the end, stays in content verbatim, tags included.
// Once a call has been parsed, whitespace-only content between and after calls is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

struct ParserOptions {
  bool reasoning = false;           // split <think>...</think> into reasoning
  bool start_in_reasoning = false;  // the prompt ends inside <think>: the output starts as reasoning
  bool tools = false;               // parse <tool_call> blocks
  std::string id_prefix = "call_";  // tool call i gets id id_prefix + i
  int max_calls = 0;  // > 0: calls past this many are dropped (vLLM's parallel_tool_calls false)
};

struct ToolCall {
  int index = 0;          // 0, 1, ... in order of appearance
  std::string id;         // id_prefix + index
  std::string name;       // function name
  std::string arguments;  // the arguments object as compact JSON text (keys in the model's order)
};

struct ParsedDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;  // calls completed by this piece
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(ParsedDelta&& o);
};

class OutputParser {
 public:
  explicit OutputParser(ParserOptions o);

  ParsedDelta feed(std::string_view text);
  // End of output: releases everything held back. Call once; feed() must not follow.
  ParsedDelta finish();

  int tool_call_count() const { return calls_; }

 private:
  enum class State { start, reasoning, content, tool_call };

  void run(ParsedDelta& out, bool final);
  bool step_start(ParsedDelta& out, bool final);
  bool step_reasoning(ParsedDelta& out, bool final);
  bool step_content(ParsedDelta& out, bool final);
  bool step_tool_call(ParsedDelta& out, bool final);
  void emit_content(ParsedDelta& out, std::string_view s);
  void emit_reasoning(ParsedDelta& out, std::string_view s, bool final);

  ParserOptions opt_;
  State state_;
  std::string buf_;                 // bytes not yet classified
  std::string reasoning_ws_;        // reasoning whitespace held until non-whitespace follows
  bool reasoning_started_ = false;  // a non-whitespace reasoning byte was emitted
  bool strip_content_ws_ = false;   // drop leading content whitespace (after </think>)
  std::string pre_call_ws_;  // content_ws_ when a block opened: content again if the block is not a call
  std::string content_ws_;   // whitespace after a tool call, held until we know it is content
  int calls_ = 0;
};

}  // namespace kiln::server
