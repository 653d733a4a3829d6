#include "server/responses.h"

#include "server/prompt_logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::server {

using nlohmann::json;

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = uint8_t(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (uint8_t(s[i + k]) & 0xc0) == 0x80;
    if (ok && len > 1) {  // reject overlong forms, surrogates and code points past U+10FFFF
      uint32_t cp = c & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3f);
      ok = cp >= (len == 2   ? 0x80u
                  : len == 3 ? 0x800u
                             : 0x10000u) &&
           cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

json usage_json(const OutputTracker& t) {
  return {{"prompt_tokens", t.prompt_tokens()},
          {"completion_tokens", t.completion_tokens()},
          {"total_tokens", t.prompt_tokens() + t.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", t.cached_tokens()}}}};
}

json usage_json(const std::vector<const OutputTracker*>& choices, int n) {
  json u = usage_json(*choices.at(0));
  int prompt = 0, cached = 0, completion = 0;
  for (size_t k = 0; k < choices.size(); ++k) {
    completion += choices[k]->completion_tokens();
    if (k % size_t(n) == 0) {  // the first choice of each prompt
      prompt += choices[k]->prompt_tokens();
      cached += choices[k]->cached_tokens();
    }
  }
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  u["prompt_tokens_details"]["cached_tokens"] = cached;
  return u;
}

json merge_choices(const std::vector<json>& bodies, json usage) {
  json out = bodies.at(0);
  json all = json::array();
  for (const json& b : bodies)
    for (const json& c : b["choices"]) all.push_back(c);
  out["choices"] = std::move(all);
  out["usage"] = std::move(usage);
  return out;
}

json finish_reason_json(const OutputTracker& t) {
  if (!t.finished()) return nullptr;
  return t.finish_reason();
}

static json byte_list(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}

json chat_logprobs(const std::vector<TokenOut>& toks, const TextCodec& codec) {
  json content = json::array();
  for (const auto& t : toks) {
    const std::string s = codec.token_bytes(t.id);
    json top = json::array();
    for (const auto& alt : t.top) {
      const std::string a = codec.token_bytes(alt.id);
      top.push_back({{"token", valid_utf8(a)}, {"logprob", alt.logprob}, {"bytes", byte_list(a)}});
    }
    content.push_back(
        {{"token", valid_utf8(s)}, {"logprob", t.logprob}, {"bytes", byte_list(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

size_t text_offset_length(const std::string& token_bytes) {
  const std::string s = valid_utf8(token_bytes);
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xc0) != 0x80; }));
}

json completion_logprobs(const std::vector<TokenOut>& toks, const TextCodec& codec, size_t text_offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const auto& t : toks) {
    const std::string s = codec.token_bytes(t.id);
    tokens.push_back(valid_utf8(s));
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& alt : t.top) top[valid_utf8(codec.token_bytes(alt.id))] = alt.logprob;
    tops.push_back(top);
    offs.push_back(text_offset);
    text_offset += text_offset_length(s);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json chat_chunk(const ResponseCtx& c, json delta, json finish_reason, json logprobs) {
  return {{"id", c.id},
          {"object", "chat.completion.chunk"},
          {"created", c.created},
          {"model", c.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({{{"index", c.index},
                                    {"delta", std::move(delta)},
                                    {"logprobs", std::move(logprobs)},
                                    {"finish_reason", std::move(finish_reason)}}})}};
}

json completion_chunk(const ResponseCtx& c, const std::string& text, json finish_reason, json logprobs) {
  return {{"id", c.id},
          {"object", "text_completion"},
          {"created", c.created},
          {"model", c.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({{{"index", c.index},
                                    {"text", text},
                                    {"logprobs", std::move(logprobs)},
                                    {"finish_reason", std::move(finish_reason)}}})}};
}

json usage_chunk(const ResponseCtx& c, const char* object, const OutputTracker& t) {
  return {{"id", c.id},       {"object", object},         {"created", c.created},
          {"model", c.model}, {"choices", json::array()}, {"usage", usage_json(t)}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (const auto& c : calls) {
    json j = {
        {"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (with_index) j["index"] = c.index;
    out.push_back(std::move(j));
  }
  return out;
}

json chat_delta(const ParsedDelta& d) {
  json delta = json::object();
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, true);
  if (delta.empty()) delta["content"] = "";
  return delta;
}

json chat_finish_reason(const OutputTracker& t, int tool_calls) {
  if (t.finished() && t.finish_reason() == "stop" && tool_calls > 0) return "tool_calls";
  return finish_reason_json(t);
}

json chat_response(const ResponseCtx& c, const OutputTracker& t, const GenSpec& spec,
                   const TextCodec& codec) {
  OutputParser parser(spec.parse);
  ParsedDelta d = parser.feed(t.text());
  d.append(parser.finish());
  json message = {{"role", "assistant"}, {"content", d.content}};
  if (!d.reasoning.empty()) message["reasoning_content"] = d.reasoning;
  if (!d.tool_calls.empty()) {
    if (d.content.empty()) message["content"] = nullptr;
    message["tool_calls"] = tool_calls_json(d.tool_calls, false);
  }
  json choice = {{"index", c.index},
                 {"message", std::move(message)},
                 {"logprobs", spec.logprobs ? chat_logprobs(t.tokens(), codec) : json(nullptr)},
                 {"finish_reason", chat_finish_reason(t, parser.tool_call_count())}};
  json out = {{"id", c.id},
              {"object", "chat.completion"},
              {"created", c.created},
              {"model", c.model},
              {"system_fingerprint", nullptr},
              {"choices", json::array({choice})},
              {"usage", usage_json(t)}};
  if (spec.vllm_prompt_logprobs)
    out["prompt_logprobs"] = vllm_prompt_logprobs(spec.prompt, t.prompt_logprobs(), codec);
  return out;
}

json completion_response(const ResponseCtx& c, const OutputTracker& t, const GenSpec& spec,
                         const TextCodec& codec) {
  json lp = nullptr;
  if (spec.logprobs) {
    lp = completion_logprobs(t.tokens(), codec,
                             spec.echo_logprobs ? prompt_text_offset(spec.prompt, codec) : 0);
    if (spec.echo_logprobs) prepend_echo_logprobs(lp, spec.prompt, t.prompt_logprobs(), codec);
  }
  json choice = {{"index", c.index},
                 {"text", spec.echo_text + t.text()},
                 {"logprobs", std::move(lp)},
                 {"finish_reason", finish_reason_json(t)}};
  if (spec.vllm_prompt_logprobs)
    choice["prompt_logprobs"] = vllm_prompt_logprobs(spec.prompt, t.prompt_logprobs(), codec);
  return {{"id", c.id},
          {"object", "text_completion"},
          {"created", c.created},
          {"model", c.model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({choice})},
          {"usage", usage_json(t)}};
}

static json sglang_logprob_list(const std::vector<TokenLogprob>& v, const TextCodec& codec, bool with_text) {
  json out = json::array();
  for (const auto& x : v)
    out.push_back(json::array(
        {x.logprob, x.id, with_text ? json(valid_utf8(codec.token_bytes(x.id))) : json(nullptr)}));
  return out;
}

namespace {
// Speculative decoding, for a request that verified drafts: SGLang's spec_verify_ct (its verify passes with a
// draft), kiln's draft and accepted token counts, and the accept length (1 + accepted / verify passes: the
// tokens each pass gave, the target's own included).
void append_spec_meta(json& meta, const OutputTracker& t) {
  const spec::SpecRequestStats& s = t.spec();
  if (s.verify_rows <= 0) return;
  meta["spec_verify_ct"] = s.verify_rows;
  meta["spec_draft_tokens"] = s.draft_tokens;
  meta["spec_accepted_tokens"] = s.accepted_tokens;
  meta["spec_accept_length"] = s.accept_length();
}
}  // namespace

json generate_response(const ResponseCtx& c, const OutputTracker& t, const GenSpec& spec,
                       const TextCodec& codec, double e2e_seconds) {
  json finish = nullptr;
  if (t.finished()) {
    finish = {{"type", t.finish_reason()}};
    if (t.finish_reason() == "length") finish["length"] = t.completion_tokens();
    if (!t.matched().is_null()) finish["matched"] = t.matched();
    if (t.finish_reason() == "error") finish["message"] = t.error();
  }
  json meta = {{"id", c.id},
               {"finish_reason", finish},
               {"prompt_tokens", t.prompt_tokens()},
               {"completion_tokens", t.completion_tokens()},
               {"cached_tokens", t.cached_tokens()},
               {"e2e_latency", e2e_seconds}};
  if (spec.logprobs) {
    json lps = json::array(), tops = json::array();
    for (const auto& tok : t.tokens()) {
      lps.push_back(json::array(
          {tok.logprob, tok.id,
           spec.return_text_in_logprobs ? json(valid_utf8(codec.token_bytes(tok.id))) : json(nullptr)}));
      tops.push_back(sglang_logprob_list(tok.top, codec, spec.return_text_in_logprobs));
    }
    meta["output_token_logprobs"] = lps;
    if (spec.top_logprobs > 0) meta["output_top_logprobs"] = tops;
  }
  add_sglang_input_logprobs(meta, spec, t.prompt_logprobs(), codec);
  if (spec.return_hidden && t.finished()) meta["hidden_states"] = json::array({t.hidden()});
  append_spec_meta(meta, t);
  json out = {{"text", t.text()}, {"output_ids", t.output_ids()}, {"meta_info", meta}};
  if (spec.n > 1 || spec.batched) out["index"] = c.index;  // SGLang's parallel samples say which one they are
  return out;
}

std::vector<float> shape_embedding(std::vector<float> v, int64_t dims) {
  if (dims > 0 && size_t(dims) < v.size()) {
    v.resize(size_t(dims));
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    const double norm = std::sqrt(ss);
    if (norm > 0)
      for (float& x : v) x = float(x / norm);
  }
  return v;
}

std::string base64_floats(const std::vector<float>& v) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = char((u >> (8 * b)) & 0xff);  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = (uint32_t(uint8_t(bytes[i])) << 16) |
                       (i + 1 < bytes.size() ? uint32_t(uint8_t(bytes[i + 1])) << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t(uint8_t(bytes[i + 2])) : 0);
    out += tbl[(n >> 18) & 63];
    out += tbl[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? tbl[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? tbl[n & 63] : '=';
  }
  return out;
}

json embeddings_response(const std::string& model, const std::vector<std::vector<float>>& vecs, bool base64,
                         int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vecs.size(); ++i)
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", base64 ? json(base64_floats(vecs[i])) : json(vecs[i])}});
  return {{"object", "list"},
          {"data", data},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace kiln::server
