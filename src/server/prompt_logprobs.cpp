#include "server/prompt_logprobs.h"

#include <algorithm>
#include <string>

#include "server/api_error.h"
#include "server/protocol_fields.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;

namespace {

constexpr int kMaxPromptTop = 20;  // runtime/prompt_logprobs.h kMaxPromptTopLogprobs

int small_count(const json& v, const char* name) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxPromptTop)
    throw bad_request(std::string("'") + name + "' must be an integer in [0, " +
                          std::to_string(kMaxPromptTop) + "], got " + v.dump(),
                      name);
  return int(v.get<int64_t>());
}

const PromptTokenLogprob* at_position(const std::vector<PromptTokenLogprob>& lp, int32_t p) {
  auto it = std::lower_bound(lp.begin(), lp.end(), p,
                             [](const PromptTokenLogprob& a, int32_t pos) { return a.position < pos; });
  return it != lp.end() && it->position == p ? &*it : nullptr;
}

std::string text_of(const TextCodec& codec, int32_t id) {
  return valid_utf8(codec.token_bytes(id));
}

}  // namespace

void parse_vllm_prompt_logprobs(const json& body, GenSpec& g) {
  const json* v = given_field(body, "prompt_logprobs");
  if (!v) return;
  const int k = small_count(*v, "prompt_logprobs");
  if (g.stream)
    throw bad_request("'prompt_logprobs' is not available with 'stream': true", "prompt_logprobs");
  g.vllm_prompt_logprobs = true;
  g.prompt_logprobs_asked = true;
  g.prompt_top_logprobs = std::max(g.prompt_top_logprobs, k);
}

void ask_echo_logprobs(GenSpec& g, int top) {
  if (g.stream)
    throw bad_request("'echo' with 'logprobs' is not available with 'stream': true: send it unstreamed",
                      "echo");
  g.echo_logprobs = true;
  g.prompt_logprobs_asked = true;
  g.prompt_top_logprobs = std::max(g.prompt_top_logprobs, top);
}

void parse_sglang_input_logprobs(const json& body, GenSpec& g) {
  const json* v = given_field(body, "logprob_start_len");
  int64_t start = -1;
  if (v) {
    if (!v->is_number_integer() || v->get<int64_t>() < -1 || v->get<int64_t>() > INT32_MAX)
      throw bad_request("'logprob_start_len' must be an integer >= -1, got " + v->dump(),
                        "logprob_start_len");
    start = v->get<int64_t>();
  }
  if (!g.logprobs) return;  // SGLang reads it only with return_logprob
  g.sglang_input_logprobs = true;
  g.sglang_logprob_start = int32_t(start);
  g.prompt_logprobs_asked = true;
  g.prompt_top_logprobs = std::max(g.prompt_top_logprobs, g.top_logprobs);
}

namespace {
int32_t sglang_start(const GenSpec& g) {
  const int32_t last = int32_t(g.prompt.size()) - 1;
  return g.sglang_logprob_start < 0 ? last : std::min(g.sglang_logprob_start, last);
}
}  // namespace

int32_t engine_prompt_logprobs_from(const GenSpec& g) {
  if (!g.prompt_logprobs_asked) return -1;
  // vLLM and echo: every position from 1; SGLang: from its start's successor (the start's own entry is null).
  int32_t from = int32_t(g.prompt.size());
  if (g.vllm_prompt_logprobs || g.echo_logprobs) from = 1;
  if (g.sglang_input_logprobs) from = std::min(from, sglang_start(g) + 1);
  return from;
}

json vllm_prompt_logprobs(const std::vector<int32_t>& prompt, const std::vector<PromptTokenLogprob>& lp,
                          const TextCodec& codec) {
  json out = json::array();
  for (size_t p = 0; p < prompt.size(); ++p) {
    const PromptTokenLogprob* e = at_position(lp, int32_t(p));
    if (!e) {
      out.push_back(nullptr);
      continue;
    }
    json d = json::object();
    d[std::to_string(e->id)] = {
        {"logprob", e->logprob}, {"rank", e->rank}, {"decoded_token", text_of(codec, e->id)}};
    for (size_t j = 0; j < e->top.size(); ++j) {
      const TokenLogprob& t = e->top[j];
      if (t.id == e->id) continue;
      d[std::to_string(t.id)] = {
          {"logprob", t.logprob}, {"rank", int(j) + 1}, {"decoded_token", text_of(codec, t.id)}};
    }
    out.push_back(std::move(d));
  }
  return out;
}

size_t prompt_text_offset(const std::vector<int32_t>& prompt, const TextCodec& codec) {
  size_t n = 0;
  for (int32_t id : prompt) n += text_offset_length(codec.token_bytes(id));
  return n;
}

void prepend_echo_logprobs(json& logprobs, const std::vector<int32_t>& prompt,
                           const std::vector<PromptTokenLogprob>& lp, const TextCodec& codec) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t offset = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    const std::string s = codec.token_bytes(prompt[p]);
    tokens.push_back(valid_utf8(s));
    offs.push_back(offset);
    offset += text_offset_length(s);
    const PromptTokenLogprob* e = at_position(lp, int32_t(p));
    if (!e) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    lps.push_back(e->logprob);
    json top = json::object();
    for (const TokenLogprob& t : e->top) top[text_of(codec, t.id)] = t.logprob;
    top[text_of(codec, e->id)] = e->logprob;  // the prompt's own token, as OpenAI and vLLM list it
    tops.push_back(std::move(top));
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    json& dst = std::string(key) == "tokens"           ? tokens
                : std::string(key) == "token_logprobs" ? lps
                : std::string(key) == "top_logprobs"   ? tops
                                                       : offs;
    for (const json& x : logprobs[key]) dst.push_back(x);
    logprobs[key] = std::move(dst);
  }
}

void add_sglang_input_logprobs(json& meta, const GenSpec& g, const std::vector<PromptTokenLogprob>& lp,
                               const TextCodec& codec) {
  if (!g.sglang_input_logprobs) return;
  const bool with_text = g.return_text_in_logprobs;
  json lps = json::array(), tops = json::array();
  for (int32_t p = sglang_start(g); p < int32_t(g.prompt.size()); ++p) {
    const int32_t id = g.prompt[size_t(p)];
    const json text = with_text ? json(text_of(codec, id)) : json(nullptr);
    const PromptTokenLogprob* e = at_position(lp, p);
    lps.push_back(json::array({e ? json(e->logprob) : json(nullptr), id, text}));
    if (!e) {
      tops.push_back(nullptr);
      continue;
    }
    json alts = json::array();
    for (const TokenLogprob& t : e->top)
      alts.push_back(json::array({t.logprob, t.id, with_text ? json(text_of(codec, t.id)) : json(nullptr)}));
    tops.push_back(std::move(alts));
  }
  meta["input_token_logprobs"] = std::move(lps);
  if (g.top_logprobs > 0) meta["input_top_logprobs"] = std::move(tops);
}

}  // namespace kiln::server
