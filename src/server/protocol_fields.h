// Request fields beyond the core schema of protocol.h, each implemented as vLLM or SGLang defines it or
// refused with a 400 that names it (never accepted and ignored), and the bodies of vLLM's /tokenize and
// /detokenize.
//
//   add_generation_prompt (chat, default true), continue_final_message (chat, default false; the reply
//     continues the last assistant message: the prompt is cut right after its content, as transformers
//     does; both true is a 400, as in vLLM)
//   reasoning_effort: "none" | "minimal" | "low" | "medium" | "high"; handed to the chat template as the
//     variable reasoning_effort (vLLM); Qwen3's template has no effort levels, so "none" and "minimal" turn
//     thinking off (enable_thinking false) unless chat_template_kwargs sets enable_thinking
//   truncate_prompt_tokens: k >= 1 keeps the prompt's last k tokens; -1 the last max_model_len (vLLM)
//   tools: each {"type": "function", "function": {"name": non-empty string, "description"?: string,
//     "parameters"?: object}}; anything else is a 400 naming tools[i]
//   parallel_tool_calls false: only the first tool call is returned, later ones dropped (vLLM's
//     maybe_filter_parallel_tool_calls)
//   include_stop_str_in_output (false): true keeps a matched stop string at the end of the text (vLLM)
//   refused when set to its non-default value: return_tokens_as_token_ids true, and vLLM's fields that would
//   change the output (server/request_fields.h refuse_vllm_output_fields)
//   /generate sampling_params: a key SGLang does not define, or one kiln does not implement, is a 400
//   /generate rid (SGLang): a string used as the reply's id (meta_info.id); a list is refused (batches)
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "server/backend.h"
#include "server/protocol.h"

namespace kiln::server {

// The field's value, or null when absent or JSON null (clients send null for "not set").
const nlohmann::json* given_field(const nlohmann::json& obj, const char* name);

// Chat fields that change the rendering: checks them and writes them into `normalized` (the request the
// chat template sees). Returns whether the rendered prompt must be cut after the final message
// (continue_final_message).
bool apply_chat_render_fields(const nlohmann::json& body, nlohmann::json& normalized);
// continue_final_message: `text` cut right after the last message's content (transformers' rule).
std::string cut_after_final_message(const std::string& text, const nlohmann::json& messages);
// 400 for a malformed tool definition (param "tools[i]...").
void validate_tools(const nlohmann::json* tools);
// 400 for the refused fields above (OpenAI routes); include_stop_str_in_output read into `g`.
void refuse_unimplemented_fields(const nlohmann::json& body, GenSpec& g);
// parallel_tool_calls false: at most one call is returned (ParserOptions::max_calls; 0 = no limit).
int max_tool_calls(const nlohmann::json& body);
// truncate_prompt_tokens applied to g.prompt (OpenAI routes).
void truncate_prompt(const nlohmann::json& body, GenSpec& g, const ApiLimits& lim);
// /generate: sampling_params keys checked against SGLang's set; rid read into g.request_id.
void check_generate_fields(const nlohmann::json& body, GenSpec& g);

// vLLM /tokenize: {"prompt": str, "add_special_tokens"?: true} or {"messages": [...],
// "add_generation_prompt"?, "continue_final_message"?, "tools"?, "chat_template_kwargs"?};
// "return_token_strs" true is a 400. Returns {"count", "max_model_len", "tokens", "token_strs": null}.
nlohmann::json tokenize_request(const nlohmann::json& body, const TextCodec& codec, const ApiLimits& lim);
// vLLM /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens kept, as vLLM decodes).
nlohmann::json detokenize_request(const nlohmann::json& body, const TextCodec& codec, const ApiLimits& lim);

}  // namespace kiln::server
