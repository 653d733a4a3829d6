#include "server/request_fields.h"

#include <algorithm>
#include <string_view>

#include "server/api_error.h"

namespace kiln::server {

namespace {

using Names = std::vector<std::string_view>;

// Sampling fields of the OpenAI routes (vLLM's extra body included) and the fields every OpenAI
// generation route reads.
const Names kOpenAiCommon = {
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop", "stop_token_ids", "ignore_eos",
    "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
    "min_new_tokens", "sampling_seed", "best_of", "suffix", "stream", "stream_options", "logprobs",
    "top_logprobs", "max_tokens", "include_stop_str_in_output", "return_tokens_as_token_ids",
    "truncate_prompt_tokens", "prompt_logprobs", "use_beam_search", "allowed_token_ids", "bad_words",
    "skip_special_tokens", "priority",
    // structured output: implemented or refused by name (protocol.cpp)
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
    "json_schema", "regex", "ebnf", "structural_tag"};
const Names kChat = {"messages",
                     "max_completion_tokens",
                     "chat_template_kwargs",
                     "tools",
                     "tool_choice",
                     "parallel_tool_calls",
                     "separate_reasoning",
                     "add_generation_prompt",
                     "continue_final_message",
                     "reasoning_effort",
                     "echo"};
const Names kCompletion = {"prompt", "echo"};
const Names kGenerate = {"text",
                         "input_ids",
                         "sampling_params",
                         "stream",
                         "return_logprob",
                         "top_logprobs_num",
                         "return_text_in_logprobs",
                         "return_hidden_states",
                         "logprob_start_len",
                         "rid",
                         "image_data",
                         "model"};
const Names kEmbeddings = {"model", "input", "encoding_format", "dimensions"};
const Names kResponses = {"model",
                          "input",
                          "instructions",
                          "tools",
                          "tool_choice",
                          "parallel_tool_calls",
                          "temperature",
                          "top_p",
                          "max_output_tokens",
                          "previous_response_id",
                          "store",
                          "reasoning",
                          "text",
                          "include",
                          "metadata",
                          "background",
                          "truncation",
                          "user",
                          "stream"};
const Names kRerank = {"model", "query", "documents", "top_n", "return_documents", "instruction"};
const Names kScore = {"model", "text_1", "text_2", "instruction"};
const Names kTokenize = {"model",
                         "prompt",
                         "messages",
                         "add_special_tokens",
                         "add_generation_prompt",
                         "continue_final_message",
                         "tools",
                         "chat_template_kwargs",
                         "reasoning_effort",
                         "return_token_strs"};
const Names kDetokenize = {"model", "tokens"};

bool in(const Names& names, const std::string& key) {
  return std::find(names.begin(), names.end(), std::string_view(key)) != names.end();
}

}  // namespace

std::vector<std::string> unknown_request_fields(const std::string& path, const nlohmann::json& body) {
  std::vector<const Names*> lists;
  if (path == "/v1/chat/completions") lists = {&kOpenAiCommon, &kChat};
  if (path == "/v1/completions") lists = {&kOpenAiCommon, &kCompletion};
  if (path == "/generate") lists = {&kGenerate};
  if (path == "/v1/embeddings") lists = {&kEmbeddings};
  if (path == "/v1/responses") lists = {&kResponses};
  if (path == "/v1/rerank" || path == "/v2/rerank" || path == "/rerank") lists = {&kRerank};
  if (path == "/score" || path == "/v1/score") lists = {&kScore};
  if (path == "/tokenize") lists = {&kTokenize};
  if (path == "/detokenize") lists = {&kDetokenize};
  std::vector<std::string> out;
  if (lists.empty() || !body.is_object()) return out;
  for (const auto& [key, value] : body.items())
    if (std::none_of(lists.begin(), lists.end(), [&](const Names* n) { return in(*n, key); }))
      out.push_back(key);
  return out;
}

void refuse_vllm_output_fields(const nlohmann::json& body) {
  auto given = [&](const char* name) -> const nlohmann::json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  auto refuse = [](const char* name, const std::string& why) {
    throw bad_request("'" + std::string(name) + "' " + why + " is not supported by kiln", name);
  };
  if (const auto* v = given("use_beam_search"); v && *v != false) refuse("use_beam_search", "(beam search)");
  for (const char* name : {"allowed_token_ids", "bad_words"})
    if (const auto* v = given(name); v && !(v->is_array() && v->empty())) refuse(name, "(a non-empty list)");
  if (const auto* v = given("skip_special_tokens"); v && *v != true)
    refuse("skip_special_tokens", "other than true");
  if (const auto* v = given("priority"); v && *v != 0)
    refuse("priority", "other than 0 (no priority scheduling)");
}

std::string unknown_fields_log_line(const std::string& path, const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  const std::vector<std::string> unknown = unknown_request_fields(path, j);
  if (unknown.empty()) return "";
  std::string line = "kiln server: debug: POST " + path + ": fields not read by kiln (ignored): ";
  for (size_t i = 0; i < unknown.size(); ++i) line += (i ? ", " : "") + unknown[i];
  return line;
}

}  // namespace kiln::server
