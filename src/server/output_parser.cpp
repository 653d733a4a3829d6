#include "server/output_parser.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "kiln/json_depth.h"

namespace kiln::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

bool is_ws(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
size_t first_non_ws(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}
size_t end_non_ws(std::string_view s) {  // one past the last non-whitespace byte (0 if none)
  size_t e = s.size();
  while (e > 0 && is_ws(s[e - 1])) --e;
  return e;
}
// Length of the longest suffix of s that is a proper prefix of tag: bytes that may still become the tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// The inside of a <tool_call> block as a call, or false when it is not one.
bool parse_call(std::string_view inner, ToolCall& call) {
  using ojson = nlohmann::ordered_json;
  // Too deep to dump safely (kiln/json_depth.h): the block stays text.
  if (json_nesting_depth(inner, kMaxJsonDepth) > kMaxJsonDepth) return false;
  const ojson j = ojson::parse(inner.begin(), inner.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  auto args = j.find("arguments");
  if (args != j.end() && !args->is_object() && !args->is_null()) return false;
  call.name = name->get<std::string>();
  call.arguments = args == j.end() || args->is_null() ? "{}" : args->dump();
  return true;
}

}  // namespace

void ParsedDelta::append(ParsedDelta&& o) {
  content += o.content;
  reasoning += o.reasoning;
  for (auto& c : o.tool_calls) tool_calls.push_back(std::move(c));
}

OutputParser::OutputParser(ParserOptions o)
    : opt_(std::move(o)), state_(opt_.reasoning ? State::start : State::content) {}

ParsedDelta OutputParser::feed(std::string_view text) {
  ParsedDelta out;
  buf_.append(text);
  run(out, false);
  return out;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  run(out, true);
  if (calls_ == 0) out.content += content_ws_;  // trailing whitespace is content unless calls were made
  content_ws_.clear();
  reasoning_ws_.clear();
  return out;
}

void OutputParser::run(ParsedDelta& out, bool final) {
  for (;;) {
    bool more = false;
    switch (state_) {
      case State::start:
        more = step_start(out, final);
        break;
      case State::reasoning:
        more = step_reasoning(out, final);
        break;
      case State::content:
        more = step_content(out, final);
        break;
      case State::tool_call:
        more = step_tool_call(out, final);
        break;
    }
    if (!more) return;
  }
}

bool OutputParser::step_start(ParsedDelta&, bool final) {
  const size_t p = first_non_ws(buf_);
  const std::string_view rest = std::string_view(buf_).substr(p);
  if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
    buf_.erase(0, p + kThinkOpen.size());
    state_ = State::reasoning;
    return true;
  }
  // Only whitespace so far, or a prefix of <think>: wait for more.
  if (!final && kThinkOpen.substr(0, rest.size()) == rest) return false;
  state_ = opt_.start_in_reasoning ? State::reasoning : State::content;
  return true;
}

bool OutputParser::step_reasoning(ParsedDelta& out, bool final) {
  const size_t pos = buf_.find(kThinkClose);
  if (pos != std::string::npos) {
    emit_reasoning(out, std::string_view(buf_).substr(0, pos), /*closing=*/true);
    buf_.erase(0, pos + kThinkClose.size());
    state_ = State::content;
    strip_content_ws_ = true;
    return true;
  }
  const size_t keep = final ? 0 : partial_tag(buf_, kThinkClose);
  emit_reasoning(out, std::string_view(buf_).substr(0, buf_.size() - keep), final);
  buf_.erase(0, buf_.size() - keep);
  return false;
}

bool OutputParser::step_content(ParsedDelta& out, bool final) {
  if (strip_content_ws_) {
    buf_.erase(0, first_non_ws(buf_));
    if (buf_.empty()) return false;
    strip_content_ws_ = false;
  }
  if (opt_.tools) {
    const size_t pos = buf_.find(kToolOpen);
    if (pos != std::string::npos) {
      emit_content(out, std::string_view(buf_).substr(0, pos));
      pre_call_ws_ = std::exchange(content_ws_, "");  // not content if the block is a call
      buf_.erase(0, pos + kToolOpen.size());
      state_ = State::tool_call;
      return true;
    }
  }
  const size_t keep = final || !opt_.tools ? 0 : partial_tag(buf_, kToolOpen);
  emit_content(out, std::string_view(buf_).substr(0, buf_.size() - keep));
  buf_.erase(0, buf_.size() - keep);
  return false;
}

bool OutputParser::step_tool_call(ParsedDelta& out, bool final) {
  const size_t pos = buf_.find(kToolClose);
  if (pos == std::string::npos) {
    if (!final) return false;
    // Unclosed at the end: the block is content, verbatim.
    emit_content(out, pre_call_ws_ + std::string(kToolOpen) + buf_);
    buf_.clear();
    state_ = State::content;
    return false;
  }
  ToolCall call;
  const std::string_view inner = std::string_view(buf_).substr(0, pos);
  if (parse_call(inner, call)) {
    if (opt_.max_calls > 0 && calls_ >= opt_.max_calls) {  // dropped, block and all
      buf_.erase(0, pos + kToolClose.size());
      state_ = State::content;
      return true;
    }
    call.index = calls_++;
    call.id = opt_.id_prefix + std::to_string(call.index);
    out.tool_calls.push_back(std::move(call));
  } else {
    emit_content(out, pre_call_ws_ + std::string(kToolOpen) + std::string(inner) + std::string(kToolClose));
  }
  buf_.erase(0, pos + kToolClose.size());
  state_ = State::content;
  return true;
}

void OutputParser::emit_content(ParsedDelta& out, std::string_view s) {
  if (!opt_.tools) {
    out.content += s;
    return;
  }
  // With tools, trailing whitespace waits: it is dropped if a call follows (or was made), else released.
  std::string t = std::move(content_ws_) + std::string(s);
  const size_t e = end_non_ws(t);
  content_ws_ = t.substr(e);
  t.resize(e);
  out.content += t;
}

void OutputParser::emit_reasoning(ParsedDelta& out, std::string_view s, bool closing) {
  std::string t = std::move(reasoning_ws_) + std::string(s);
  reasoning_ws_.clear();
  if (!reasoning_started_) t.erase(0, first_non_ws(t));
  const size_t e = end_non_ws(t);
  if (!closing) reasoning_ws_ = t.substr(e);
  t.resize(e);
  if (!t.empty()) {
    out.reasoning += t;
    reasoning_started_ = true;
  }
}

}  // namespace kiln::server
