#include "server/protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "kiln/error.h"
#include "kiln/json_depth.h"
#include "server/api_error.h"
#include "server/prompt_logprobs.h"
#include "server/protocol_fields.h"
#include "server/protocol_images.h"

namespace kiln::server {
namespace {

using nlohmann::json;

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopBytes = 256;
constexpr int kMaxTopLogprobs = 20;
constexpr int64_t kMaxN = 16;  // choices per request (vLLM has no cap; 16 bounds one request's share)
constexpr size_t kMaxLogitBias = 1024;

const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> opt_bool(const json& obj, const char* name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

std::optional<int64_t> opt_int(const json& obj, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      throw bad_request(std::string("'") + name + "' is out of range", name);
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             v->get<double>() == std::floor(v->get<double>()) && std::fabs(v->get<double>()) < 9e15) {
    x = int64_t(v->get<double>());  // 16.0 is accepted as 16
  } else {
    throw bad_request(std::string("'") + name + "' must be an integer", name);
  }
  if (x < lo || x > hi)
    throw bad_request(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + std::to_string(x),
                      name);
  return x;
}

// Finite number in [lo, hi]; lo_open excludes lo itself.
std::optional<double> opt_num(const json& obj, const char* name, double lo, double hi, bool lo_open = false) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(std::string("'") + name + "' must be a number", name);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    std::ostringstream os;
    os << "'" << name << "' must be a finite number in " << (lo_open ? "(" : "[") << lo << ", " << hi
       << "], got " << v->dump();
    throw bad_request(os.str(), name);
  }
  return x;
}

std::optional<std::string> opt_string(const json& obj, const char* name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(std::string("'") + name + "' must be a string", name);
  return v->get<std::string>();
}

std::vector<int32_t> token_list(const json& arr, const char* param, const ApiLimits& lim) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& t : arr) {
    if (!t.is_number_integer())
      throw bad_request(std::string("'") + param + "' must hold integer token ids", param);
    const int64_t id =
        t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : t.get<int64_t>();
    if (id < 0 || id >= lim.vocab_size)
      throw bad_request("token id " + t.dump() + " in '" + param + "' is out of range [0, " +
                            std::to_string(lim.vocab_size) + ")",
                        param);
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> encode_text(const TextCodec& codec, const std::string& text, const char* param) {
  try {
    return codec.encode(text);
  } catch (const kiln::Error& e) {
    throw bad_request(std::string("'") + param + "' could not be tokenized: " + e.what(), param);
  }
}

std::vector<int32_t> encode_embedding(const TextCodec& codec, const std::string& text) {
  // Checked on the text: the post-processor would turn "" into a lone <|endoftext|>.
  if (text.empty()) throw bad_request("'input' must not contain an empty string", "input");
  try {
    return codec.encode_embedding_input(text);
  } catch (const kiln::Error& e) {
    throw bad_request(std::string("'input' could not be tokenized: ") + e.what(), "input");
  }
}

std::vector<std::string> parse_stop(const json& obj, const char* name) {
  std::vector<std::string> out;
  const json* v = field(obj, name);
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStops)
      throw bad_request(std::string("'") + name + "' holds at most " + std::to_string(kMaxStops) + " strings",
                        name);
    for (const auto& s : *v) {
      if (!s.is_string())
        throw bad_request(std::string("'") + name + "' must be a string or a list of strings", name);
      out.push_back(s.get<std::string>());
    }
  } else {
    throw bad_request(std::string("'") + name + "' must be a string or a list of strings", name);
  }
  for (const auto& s : out)
    if (s.empty() || s.size() > kMaxStopBytes)
      throw bad_request(
          std::string("each '") + name + "' string must be 1.." + std::to_string(kMaxStopBytes) + " bytes",
          name);
  return out;
}

std::vector<int32_t> parse_stop_ids(const json& obj, const char* name, const ApiLimits& lim) {
  const json* v = field(obj, name);
  if (!v) return {};
  if (!v->is_array()) throw bad_request(std::string("'") + name + "' must be a list of token ids", name);
  return token_list(*v, name, lim);
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}; SGLang's has the same shape.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& obj, const ApiLimits& lim) {
  std::vector<std::pair<int32_t, float>> out;
  const json* v = field(obj, "logit_bias");
  if (!v) return out;
  if (!v->is_object()) throw bad_request("'logit_bias' must be an object of token id -> bias", "logit_bias");
  if (v->size() > kMaxLogitBias)
    throw bad_request("'logit_bias' holds at most " + std::to_string(kMaxLogitBias) + " entries",
                      "logit_bias");
  for (const auto& [key, bias] : v->items()) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size() || id < 0 || id >= lim.vocab_size)
      throw bad_request(
          "'logit_bias' key '" + key + "' is not a token id in [0, " + std::to_string(lim.vocab_size) + ")",
          "logit_bias");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) || std::fabs(bias.get<double>()) > 100.0)
      throw bad_request(
          "'logit_bias' values must be numbers in [-100, 100]; token " + key + " has " + bias.dump(),
          "logit_bias");
    out.emplace_back(int32_t(id), float(bias.get<double>()));
  }
  return out;
}

// Sampling fields shared by the OpenAI endpoints and /generate's sampling_params (SGLang names the same
// fields the same way, except max_new_tokens).
void parse_sampling(const json& obj, const ApiLimits& lim, SamplingParams& sp, std::vector<std::string>& stop,
                    int& n) {
  if (auto v = opt_num(obj, "temperature", 0.0, 2.0)) sp.temperature = float(*v);
  if (auto v = opt_num(obj, "top_p", 0.0, 1.0, /*lo_open=*/true)) sp.top_p = float(*v);
  if (auto v = opt_int(obj, "top_k", -1, 1 << 30)) sp.top_k = *v == 0 ? -1 : int(*v);
  if (auto v = opt_num(obj, "min_p", 0.0, 1.0)) sp.min_p = float(*v);
  if (auto v = opt_int(obj, "seed", INT64_MIN + 1, INT64_MAX)) sp.seed = *v < 0 ? -1 : *v;
  if (auto v = opt_int(obj, "sampling_seed", 0, INT64_MAX)) sp.seed = *v;
  if (auto v = opt_bool(obj, "ignore_eos")) sp.ignore_eos = *v;
  sp.stop_token_ids = parse_stop_ids(obj, "stop_token_ids", lim);
  stop = parse_stop(obj, "stop");
  if (auto v = opt_num(obj, "presence_penalty", -2.0, 2.0)) sp.presence_penalty = float(*v);
  if (auto v = opt_num(obj, "frequency_penalty", -2.0, 2.0)) sp.frequency_penalty = float(*v);
  if (auto v = opt_num(obj, "repetition_penalty", 0.0, 2.0, /*lo_open=*/true))
    sp.repetition_penalty = float(*v);
  // vLLM names it min_tokens, SGLang min_new_tokens; checked against max_tokens once that is known.
  for (const char* name : {"min_tokens", "min_new_tokens"})
    if (auto v = opt_int(obj, name, 0, INT32_MAX)) sp.min_new_tokens = int(*v);
  sp.logit_bias = parse_logit_bias(obj, lim);
  if (auto v = opt_int(obj, "n", 1, kMaxN)) n = int(*v);
}

// generation_config.json's eos ids stop generation as the model's own eos does (not under ignore_eos).
void add_default_eos(SamplingParams& sp, const ApiLimits& lim) {
  if (sp.ignore_eos) return;
  for (int32_t id : lim.extra_eos_ids)
    if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), id) == sp.stop_token_ids.end())
      sp.stop_token_ids.push_back(id);
}

void reject_openai_unsupported(const json& body) {
  if (auto v = opt_int(body, "best_of", INT64_MIN, INT64_MAX); v && *v != 1)
    throw bad_request("'best_of' must be 1", "best_of");
  if (const json* v = field(body, "suffix"))
    if (!v->is_string() || !v->get<std::string>().empty())
      throw bad_request("'suffix' is not supported", "suffix");
}

void parse_stream(const json& body, GenSpec& g) {
  g.stream = opt_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (!g.stream)
      throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    g.include_usage = opt_bool(*so, "include_usage").value_or(false);
    g.continuous_usage = opt_bool(*so, "continuous_usage_stats").value_or(false);
  }
}

// max_tokens: explicit values must fit the context; absent ones default and clamp.
void set_max_tokens(GenSpec& g, std::optional<int64_t> given, int64_t def, const ApiLimits& lim,
                    const char* param, const char* prompt_param) {
  const int64_t n = int64_t(g.prompt.size());
  if (n >= lim.max_context_len)
    throw bad_request("This model's maximum context length is " + std::to_string(lim.max_context_len) +
                          " tokens, but the prompt has " + std::to_string(n) + " tokens",
                      prompt_param);
  const int64_t room = lim.max_context_len - n;
  if (given) {
    if (*given > room)
      throw bad_request("This model's maximum context length is " + std::to_string(lim.max_context_len) +
                            " tokens; the prompt has " + std::to_string(n) + " tokens and " + param +
                            " asks for " + std::to_string(*given) + " more",
                        param);
    g.sampling.max_new_tokens = int(*given);
  } else {
    g.sampling.max_new_tokens = int(std::min(def, room));
  }
}

// min_tokens may not ask for more than max_tokens allows (vLLM's rule).
void check_min_tokens(const GenSpec& g) {
  if (g.sampling.min_new_tokens > g.sampling.max_new_tokens)
    throw bad_request("'min_tokens' (" + std::to_string(g.sampling.min_new_tokens) +
                          ") must not exceed max_tokens (" + std::to_string(g.sampling.max_new_tokens) + ")",
                      g.endpoint == Endpoint::generate ? "min_new_tokens" : "min_tokens");
}

void check_prompt(const GenSpec& g, const char* param) {
  if (g.prompt.empty()) throw bad_request(std::string("'") + param + "' must not be empty", param);
}

// Whether the reply should be parsed for tool calls: tools given and tool_choice "auto" (or absent),
// "required" or a named function (those two are forced by a grammar: server/structured_output.h).
bool tools_requested(const json& body, const json* tools) {
  const json* tc = field(body, "tool_choice");
  if (tc) {
    if (tc->is_object()) {
      if (!tools || tools->empty())
        throw bad_request("'tool_choice' naming a function needs a non-empty 'tools' list", "tool_choice");
      return true;
    }
    if (!tc->is_string())
      throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or an object", "tool_choice");
    const std::string c = tc->get<std::string>();
    if (c != "none" && c != "auto" && c != "required")
      throw bad_request(
          "'tool_choice' must be \"none\", \"auto\", \"required\" or an object; got '" + c + "'",
          "tool_choice");
    if (c != "none" && (!tools || tools->empty()))
      throw bad_request("'tool_choice' \"" + c + "\" needs a non-empty 'tools' list", "tool_choice");
    if (c == "none") return false;
  }
  if (auto v = opt_bool(body, "parallel_tool_calls"); v) (void)*v;  // read by max_tool_calls
  return tools && !tools->empty();
}

bool thinking_enabled(const json& body) {
  const json* kw = field(body, "chat_template_kwargs");
  if (!kw) return true;
  auto it = kw->find("enable_thinking");
  return it == kw->end() || !it->is_boolean() || it->get<bool>();
}

// The generation prompt left a <think> open (templates that start the reply inside reasoning).
bool prompt_opens_think(const std::string& text) {
  const size_t open = text.rfind("<think>");
  return open != std::string::npos && text.find("</think>", open) == std::string::npos &&
         text.find("<|im_start|>assistant", open) == std::string::npos &&
         text.rfind("<|im_start|>assistant") < open;
}

// The prompts of a request, one or a batch: each checked (not empty, truncated when truncate_body asks,
// fitting the context with its output limit). g.prompt, already set to the first (its images expanded),
// keeps it; g.more_prompts gets the others with their own limits.
void set_prompts(GenSpec& g, std::vector<GenSpec::MorePrompt> prompts, std::optional<int64_t> max_tokens,
                 int64_t def, const ApiLimits& lim, const json* truncate_body, const char* max_param,
                 const char* prompt_param) {
  std::vector<int32_t> first;
  int first_max = 0;
  for (size_t k = 0; k < prompts.size(); ++k) {
    if (k > 0) g.prompt = std::move(prompts[k].ids);
    check_prompt(g, prompt_param);
    if (truncate_body) truncate_prompt(*truncate_body, g, lim);
    set_max_tokens(g, max_tokens, def, lim, max_param, prompt_param);
    check_min_tokens(g);
    if (k == 0) {
      first = std::move(g.prompt);
      first_max = g.sampling.max_new_tokens;
      g.echo_text = prompts[0].echo_text;
    } else {
      g.more_prompts.push_back({std::move(g.prompt), g.sampling.max_new_tokens, prompts[k].echo_text});
    }
  }
  g.prompt = std::move(first);
  g.sampling.max_new_tokens = first_max;
  g.batched = prompts.size() > 1;
}

}  // namespace

void check_model(const json& body, const ApiLimits& lim, std::string& model) {
  model = lim.served_model_name;
  if (auto m = opt_string(body, "model")) {
    const auto& a = lim.model_aliases;
    if (*m != lim.served_model_name && std::find(a.begin(), a.end(), *m) == a.end())
      throw ApiError(
          404, "The model '" + *m + "' does not exist; this server serves '" + lim.served_model_name + "'",
          "model", "invalid_request_error", "model_not_found");
  }
}

json parse_body(const std::string& body) {
  // Before parsing: the parsed value is copied, dumped and walked recursively (kiln/json_depth.h).
  try {
    check_json_depth(body, "the request body");
  } catch (const kiln::Error& e) {
    throw bad_request(e.what());
  }
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    // nlohmann's messages say where and why (including ill-formed UTF-8 in strings).
    throw bad_request(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad_request("request body must be a JSON object");
  return j;
}

GenSpec parse_chat_request(const json& body, const TextCodec& codec, const ApiLimits& lim) {
  GenSpec g;
  g.endpoint = Endpoint::chat;
  check_model(body, lim, g.model);
  reject_openai_unsupported(body);
  if (auto v = opt_bool(body, "echo"); v && *v) throw bad_request("'echo' is not supported on chat", "echo");
  refuse_unimplemented_fields(body, g);
  g.sampling = lim.sampling_defaults;
  parse_sampling(body, lim, g.sampling, g.stop, g.n);
  add_default_eos(g.sampling, lim);
  parse_stream(body, g);
  g.logprobs = opt_bool(body, "logprobs").value_or(false);
  if (auto v = opt_int(body, "top_logprobs", 0, kMaxTopLogprobs)) {
    if (!g.logprobs && *v > 0) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    g.top_logprobs = int(*v);
  }
  // vLLM: max_completion_tokens (OpenAI's current name) wins over the deprecated max_tokens.
  std::optional<int64_t> max_tokens = opt_int(body, "max_tokens", 1, INT32_MAX);
  if (auto v = opt_int(body, "max_completion_tokens", 1, INT32_MAX)) max_tokens = v;

  const json* msgs = field(body, "messages");
  if (!msgs) throw bad_request("'messages' is required", "messages");
  if (!msgs->is_array() || msgs->empty())
    throw bad_request("'messages' must be a non-empty list", "messages");
  json normalized = body;
  json& out_msgs = normalized["messages"];
  std::vector<ImageRef> images;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request("'" + p + "' must be an object", p);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw bad_request("'" + p + ".role' must be a string", p + ".role");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      throw bad_request(
          "'" + p + ".role' must be system, user, assistant, tool or developer; got '" + r + "'",
          p + ".role");
    if (r == "developer") out_msgs[i]["role"] = "system";
    auto content = m.find("content");
    if (content == m.end() && r != "assistant")
      throw bad_request("'" + p + ".content' is required", p + ".content");
    out_msgs[i]["content"] = content == m.end() ? json("") : chat_content(*content, i, lim, images);
  }
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object())
      throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (auto it = kw->find("enable_thinking"); it != kw->end() && !it->is_boolean() && !it->is_null())
      throw bad_request("'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs");
  }
  const json* tools = field(body, "tools");
  if (tools && !tools->is_array()) throw bad_request("'tools' must be a list", "tools");
  validate_tools(tools);
  const bool parse_tools = tools_requested(body, tools) && lim.tool_call_parser;
  const bool continue_final = apply_chat_render_fields(body, normalized);
  std::string text;
  try {
    text = codec.render_chat(normalized);
    if (continue_final) text = cut_after_final_message(text, normalized["messages"]);
  } catch (const kiln::Error& e) {
    throw bad_request(std::string("'messages' could not be rendered with the chat template: ") + e.what(),
                      "messages");
  }
  g.prompt = encode_text(codec, text, "messages");
  check_prompt(g, "messages");
  attach_images(g, images, lim, "messages");
  truncate_prompt(body, g, lim);
  set_max_tokens(g, max_tokens, lim.max_context_len, lim, "max_tokens", "messages");
  check_min_tokens(g);
  g.parse.tools = parse_tools;
  g.parse.max_calls = max_tool_calls(body);
  g.parse.reasoning =
      lim.reasoning_parser && opt_bool(body, "separate_reasoning").value_or(true) && thinking_enabled(body);
  g.parse.start_in_reasoning = g.parse.reasoning && prompt_opens_think(text);
  parse_vllm_prompt_logprobs(body, g);
  g.grammar = chat_grammar(body, tools, lim.tool_call_parser);
  // Reasoning on: the grammar constrains the answer after </think>, the reasoning is free (SGLang's rule).
  if (g.grammar && g.parse.reasoning) g.grammar_after_token = think_end_token(codec);
  g.sampling.return_logprob = g.logprobs;
  g.sampling.top_logprobs = g.top_logprobs;
  return g;
}

GenSpec parse_completion_request(const json& body, const TextCodec& codec, const ApiLimits& lim) {
  GenSpec g;
  g.endpoint = Endpoint::completion;
  check_model(body, lim, g.model);
  reject_openai_unsupported(body);
  refuse_unimplemented_fields(body, g);
  g.sampling = lim.sampling_defaults;
  parse_sampling(body, lim, g.sampling, g.stop, g.n);
  add_default_eos(g.sampling, lim);
  parse_stream(body, g);
  if (auto v = opt_int(body, "logprobs", 0, kMaxTopLogprobs)) {
    g.logprobs = true;
    g.top_logprobs = int(*v);
  }
  const bool echo = opt_bool(body, "echo").value_or(false);
  // With echo, max_tokens 0 scores the prompt without generating (OpenAI's legacy scoring call, vLLM).
  const auto max_tokens = opt_int(body, "max_tokens", echo ? 0 : 1, INT32_MAX);

  const json* p = field(body, "prompt");
  if (!p) throw bad_request("'prompt' is required", "prompt");
  if (echo && g.logprobs) ask_echo_logprobs(g, g.top_logprobs);
  parse_vllm_prompt_logprobs(body, g);
  // One prompt, or a batch: a list of strings or of token lists.
  std::vector<const json*> items;
  if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    if (p->size() > kMaxBatchPrompts)
      throw bad_request("'prompt' holds at most " + std::to_string(kMaxBatchPrompts) + " prompts", "prompt");
    for (const json& item : *p) items.push_back(&item);
  } else if (p->is_string() || p->is_array()) {
    if (p->is_array() && p->empty()) throw bad_request("'prompt' must not be empty", "prompt");
    items.push_back(p);
  } else {
    throw bad_request("'prompt' must be a string, a list of token ids, or a list of either", "prompt");
  }
  std::vector<GenSpec::MorePrompt> prompts;
  for (const json* item : items) {
    GenSpec::MorePrompt mp;
    if (item->is_string())
      mp.ids = encode_text(codec, item->get<std::string>(), "prompt");
    else if (item->is_array())
      mp.ids = token_list(*item, "prompt", lim);
    else
      throw bad_request("'prompt' lists must hold only strings or only token lists", "prompt");
    if (echo) mp.echo_text = item->is_string() ? item->get<std::string>() : codec.decode(mp.ids);
    prompts.push_back(std::move(mp));
  }
  g.prompt = prompts[0].ids;
  set_prompts(g, std::move(prompts), max_tokens, 16, lim, &body, "max_tokens", "prompt");
  g.grammar = parse_structured_output(structured_output_fields(body), /*openai_body=*/true);
  g.sampling.return_logprob = g.logprobs;
  g.sampling.top_logprobs = g.top_logprobs;
  return g;
}

GenSpec parse_generate_request(const json& body, const TextCodec& codec, const ApiLimits& lim) {
  GenSpec g;
  g.endpoint = Endpoint::generate;
  g.model = lim.served_model_name;
  const json* text = field(body, "text");
  const json* ids = field(body, "input_ids");
  if (!text == !ids)
    throw bad_request("exactly one of 'text' and 'input_ids' is required", text ? "input_ids" : "text");
  // One prompt, or SGLang's batch: a list of texts, or a list of id lists.
  std::vector<GenSpec::MorePrompt> prompts;
  const char* param = text ? "text" : "input_ids";
  const json* t = text ? text : ids;
  const bool batch = text ? t->is_array() : t->is_array() && !t->empty() && (*t)[0].is_array();
  if (!text && !t->is_array()) throw bad_request("'input_ids' must be a list of token ids", "input_ids");
  if (batch && (t->empty() || t->size() > kMaxBatchPrompts))
    throw bad_request(
        std::string("'") + param + "' holds 1.." + std::to_string(kMaxBatchPrompts) + " prompts", param);
  for (size_t k = 0; k < (batch ? t->size() : 1); ++k) {
    const json& item = batch ? (*t)[k] : *t;
    GenSpec::MorePrompt mp;
    if (text) {
      if (!item.is_string()) throw bad_request("'text' must be a string or a list of strings", "text");
      mp.ids = encode_text(codec, item.get<std::string>(), "text");
    } else {
      if (!item.is_array())
        throw bad_request("'input_ids' must be a list of token ids or of lists", "input_ids");
      mp.ids = token_list(item, "input_ids", lim);
    }
    prompts.push_back(std::move(mp));
  }
  g.prompt = prompts[0].ids;
  check_prompt(g, param);
  const std::vector<ImageRef> image_refs = generate_image_refs(body, lim);
  if (prompts.size() > 1 && !image_refs.empty())
    throw bad_request("'image_data' with batched prompts is not supported: send one prompt per request",
                      "image_data");
  attach_images(g, image_refs, lim, param);
  std::optional<int64_t> max_new;
  g.sampling = lim.sampling_defaults;
  if (const json* sp = field(body, "sampling_params")) {
    if (!sp->is_object()) throw bad_request("'sampling_params' must be an object", "sampling_params");
    parse_sampling(*sp, lim, g.sampling, g.stop, g.n);
    max_new = opt_int(*sp, "max_new_tokens", 0, INT32_MAX);
    if (auto v = opt_bool(*sp, "skip_special_tokens"); v && !*v)
      throw bad_request("'skip_special_tokens': false is not supported", "sampling_params");
    g.grammar = parse_structured_output(structured_output_fields(*sp), /*openai_body=*/false);
  }
  add_default_eos(g.sampling, lim);
  check_generate_fields(body, g);
  g.stream = opt_bool(body, "stream").value_or(false);
  g.logprobs = opt_bool(body, "return_logprob").value_or(false);
  if (auto v = opt_int(body, "top_logprobs_num", 0, kMaxTopLogprobs)) g.top_logprobs = int(*v);
  if (g.top_logprobs > 0 && !g.logprobs)
    throw bad_request("'top_logprobs_num' needs 'return_logprob': true", "top_logprobs_num");
  g.return_text_in_logprobs = opt_bool(body, "return_text_in_logprobs").value_or(false);
  g.return_hidden = opt_bool(body, "return_hidden_states").value_or(false);
  parse_sglang_input_logprobs(body, g);
  set_prompts(g, std::move(prompts), max_new, 128, lim, nullptr, "max_new_tokens", param);
  g.sampling.return_logprob = g.logprobs;
  g.sampling.top_logprobs = g.top_logprobs;
  return g;
}

EmbedSpec parse_embedding_request(const json& body, const TextCodec& codec, const ApiLimits& lim) {
  EmbedSpec e;
  check_model(body, lim, e.model);
  if (auto f = opt_string(body, "encoding_format")) {
    if (*f != "float" && *f != "base64")
      throw bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format");
    e.base64 = *f == "base64";
  }
  if (auto d = opt_int(body, "dimensions", 1, lim.hidden_size)) e.dimensions = *d;
  const json* in = field(body, "input");
  if (!in) throw bad_request("'input' is required", "input");
  auto add_ids = [&](std::vector<int32_t> ids) {
    if (ids.empty()) throw bad_request("'input' must not contain an empty input", "input");
    if (int64_t(ids.size()) > lim.max_context_len)
      throw bad_request("an input has " + std::to_string(ids.size()) + " tokens; the maximum is " +
                            std::to_string(lim.max_context_len),
                        "input");
    e.inputs.push_back(std::move(ids));
  };
  if (in->is_string()) {
    add_ids(encode_embedding(codec, in->get<std::string>()));
  } else if (in->is_array() && !in->empty()) {
    if ((*in)[0].is_number()) {  // one tokenized input (OpenAI): bounded by the context, not the input count
      add_ids(token_list(*in, "input", lim));
    } else {
      if (in->size() > lim.max_embedding_inputs)
        throw bad_request("'input' holds at most " + std::to_string(lim.max_embedding_inputs) + " inputs",
                          "input");
      for (const auto& item : *in) {
        if (item.is_string())
          add_ids(encode_embedding(codec, item.get<std::string>()));
        else if (item.is_array())
          add_ids(token_list(item, "input", lim));
        else
          throw bad_request("'input' items must be strings or lists of token ids", "input");
      }
    }
  } else {
    throw bad_request("'input' must be a string, a list of strings, or token ids", "input");
  }
  return e;
}

}  // namespace kiln::server
