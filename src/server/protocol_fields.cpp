#include "server/protocol_fields.h"

#include "server/request_fields.h"

#include <algorithm>
#include <array>
#include <climits>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;

namespace {

const json* given(const json& obj, const char* name) {
  return given_field(obj, name);
}

// A boolean field's value (400 naming it when it is not a boolean), `def` when absent.
bool flag(const json& obj, const char* name, bool def) {
  const json* v = given(obj, name);
  if (!v) return def;
  if (!v->is_boolean()) throw bad_request(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

// SGLang's SamplingParams fields (python/sglang/srt/sampling/sampling_params.py) that kiln implements,
// plus the vLLM spellings parse_sampling also reads; anything else in sampling_params is a 400.
constexpr std::array kGenerateSamplingKeys = {"max_new_tokens",
                                              "min_new_tokens",
                                              "min_tokens",
                                              "stop",
                                              "stop_token_ids",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "frequency_penalty",
                                              "presence_penalty",
                                              "repetition_penalty",
                                              "n",
                                              "ignore_eos",
                                              "skip_special_tokens",
                                              "logit_bias",
                                              "sampling_seed",
                                              "seed",
                                              "json_schema",
                                              "regex",
                                              "ebnf",
                                              "structural_tag",
                                              "guided_json",
                                              "guided_regex",
                                              "guided_choice",
                                              "guided_grammar",
                                              "structured_outputs"};

}  // namespace

const json* given_field(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool apply_chat_render_fields(const json& body, json& normalized) {
  const bool add_prompt = flag(body, "add_generation_prompt", true);
  const bool continue_final = flag(body, "continue_final_message", false);
  if (add_prompt && continue_final && given(body, "add_generation_prompt"))
    throw bad_request(
        "'continue_final_message' and 'add_generation_prompt' cannot both be true: set add_generation_prompt "
        "false to continue the final message",
        "continue_final_message");
  json& kw = normalized["chat_template_kwargs"];
  if (!kw.is_object()) kw = json::object();
  if (continue_final) {
    const json& msgs = normalized["messages"];
    if (!msgs.is_array() || msgs.empty() || msgs.back().value("role", "") != "assistant" ||
        !msgs.back().contains("content") || !msgs.back()["content"].is_string())
      throw bad_request("'continue_final_message' needs a final assistant message with string content",
                        "continue_final_message");
  }
  // chat_template_kwargs set by the client win over the top-level fields (vLLM merges them so too).
  if (!kw.contains("add_generation_prompt")) kw["add_generation_prompt"] = add_prompt && !continue_final;
  if (const json* e = given(body, "reasoning_effort")) {
    static const std::array kEfforts = {"none", "minimal", "low", "medium", "high"};
    const std::string v = e->is_string() ? e->get<std::string>() : "";
    if (std::find(kEfforts.begin(), kEfforts.end(), v) == kEfforts.end())
      throw bad_request("'reasoning_effort' must be one of none, minimal, low, medium, high",
                        "reasoning_effort");
    if (!kw.contains("reasoning_effort")) kw["reasoning_effort"] = v;
    if ((v == "none" || v == "minimal") && !kw.contains("enable_thinking")) kw["enable_thinking"] = false;
  }
  return continue_final;
}

std::string cut_after_final_message(const std::string& text, const json& messages) {
  const std::string content = messages.back()["content"].get<std::string>();
  size_t at = text.rfind(content);
  if (content.empty() || at == std::string::npos) {
    // Templates that trim messages before rendering (transformers falls back to the stripped content).
    const size_t b = content.find_first_not_of(" \t\r\n");
    const std::string stripped =
        b == std::string::npos ? "" : content.substr(b, content.find_last_not_of(" \t\r\n") - b + 1);
    at = stripped.empty() ? std::string::npos : text.rfind(stripped);
    if (at == std::string::npos)
      throw bad_request(
          "'continue_final_message': the chat template did not render the final message's content",
          "continue_final_message");
    return text.substr(0, at + stripped.size());
  }
  return text.substr(0, at + content.size());
}

void validate_tools(const json* tools) {
  if (!tools) return;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw bad_request("'" + p + "' must be an object", p);
    const json* type = given(t, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "function")
      throw bad_request("'" + p + ".type' must be \"function\" (kiln runs no built-in tools); got " +
                            (type ? type->dump() : std::string("none")),
                        p + ".type");
    const json* fn = given(t, "function");
    if (!fn || !fn->is_object()) throw bad_request("'" + p + ".function' must be an object", p + ".function");
    const json* name = given(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      throw bad_request("'" + p + ".function.name' must be a non-empty string", p + ".function.name");
    if (const json* d = given(*fn, "description"); d && !d->is_string())
      throw bad_request("'" + p + ".function.description' must be a string", p + ".function.description");
    if (const json* ps = given(*fn, "parameters"); ps && !ps->is_object())
      throw bad_request("'" + p + ".function.parameters' must be a JSON Schema object",
                        p + ".function.parameters");
  }
}

void refuse_unimplemented_fields(const json& body, GenSpec& g) {
  g.include_stop_str = flag(body, "include_stop_str_in_output", false);
  if (flag(body, "return_tokens_as_token_ids", false))
    throw bad_request("'return_tokens_as_token_ids': true is not supported", "return_tokens_as_token_ids");
  refuse_vllm_output_fields(body);
}

int max_tool_calls(const json& body) {
  return flag(body, "parallel_tool_calls", true) ? 0 : 1;
}

void truncate_prompt(const json& body, GenSpec& g, const ApiLimits& lim) {
  const json* v = given(body, "truncate_prompt_tokens");
  if (!v) return;
  if (!v->is_number_integer() || v->get<int64_t>() < -1 || v->get<int64_t>() == 0)
    throw bad_request("'truncate_prompt_tokens' must be -1 (the context length) or a positive integer",
                      "truncate_prompt_tokens");
  const int64_t keep = v->get<int64_t>() == -1 ? lim.max_context_len : v->get<int64_t>();
  if (int64_t(g.prompt.size()) > keep) g.prompt.erase(g.prompt.begin(), g.prompt.end() - keep);
}

void check_generate_fields(const json& body, GenSpec& g) {
  if (const json* sp = given(body, "sampling_params"); sp && sp->is_object())
    for (const auto& [key, value] : sp->items())
      if (std::find_if(kGenerateSamplingKeys.begin(), kGenerateSamplingKeys.end(),
                       [&](const char* k) { return key == k; }) == kGenerateSamplingKeys.end())
        throw bad_request("'sampling_params." + key + "' is not supported", "sampling_params." + key);
  if (const json* rid = given(body, "rid")) {
    if (!rid->is_string() || rid->get<std::string>().empty() || rid->get<std::string>().size() > 256)
      throw bad_request(
          "'rid' must be a string of 1..256 bytes (lists belong to batches, which kiln refuses)", "rid");
    g.request_id = rid->get<std::string>();
  }
}

json tokenize_request(const json& body, const TextCodec& codec, const ApiLimits& lim) {
  if (flag(body, "return_token_strs", false))
    throw bad_request("'return_token_strs': true is not supported", "return_token_strs");
  const json* prompt = given(body, "prompt");
  const json* messages = given(body, "messages");
  if (!prompt == !messages) throw bad_request("exactly one of 'prompt' and 'messages' is required", "prompt");
  std::vector<int32_t> ids;
  if (prompt) {
    std::string model;
    check_model(body, lim, model);
    if (!prompt->is_string()) throw bad_request("'prompt' must be a string", "prompt");
    try {
      ids = flag(body, "add_special_tokens", true) ? codec.encode_embedding_input(prompt->get<std::string>())
                                                   : codec.encode(prompt->get<std::string>());
    } catch (const kiln::Error& e) {
      throw bad_request(std::string("'prompt' could not be tokenized: ") + e.what(), "prompt");
    }
  } else {
    if (flag(body, "add_special_tokens", false))
      throw bad_request("'add_special_tokens': true is not supported with 'messages'", "add_special_tokens");
    // The chat route's own parsing and rendering, without its context-length check (vLLM counts any length).
    json chat = json::object();
    for (const char* k : {"model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt",
                          "continue_final_message", "reasoning_effort"})
      if (const json* v = given(body, k)) chat[k] = *v;
    ApiLimits unbounded = lim;
    unbounded.max_context_len = INT32_MAX;
    ids = parse_chat_request(chat, codec, unbounded).prompt;
  }
  return {{"count", ids.size()},
          {"max_model_len", lim.max_context_len},
          {"tokens", ids},
          {"token_strs", nullptr}};
}

json detokenize_request(const json& body, const TextCodec& codec, const ApiLimits& lim) {
  std::string model;
  check_model(body, lim, model);
  const json* tokens = given(body, "tokens");
  if (!tokens || !tokens->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
  std::string text;
  for (const auto& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= lim.vocab_size)
      throw bad_request(
          "'tokens' must hold token ids in [0, " + std::to_string(lim.vocab_size) + "); got " + t.dump(),
          "tokens");
    text += codec.token_bytes(int32_t(t.get<int64_t>()));
  }
  return {{"prompt", valid_utf8(text)}};
}

}  // namespace kiln::server
