// Request schemas: OpenAI chat/completions/embeddings and SGLang /generate, parsed and validated into plain
// structs before anything reaches the engine. Every problem is an ApiError (400, or 404 for an unknown
// model) that names the offending field: wrong JSON types, missing/empty/over-long prompts, token ids out
// of range, non-finite or out-of-range sampling parameters, unsupported options (best_of != 1, echo with
// logprobs, suffix). JSON null is treated as "not given", as OpenAI clients send it for unset fields.
// Structured output (response_format, SGLang's and vLLM's grammar fields, forced tool calls) is parsed by
// server/structured_output.h into GenSpec::grammar.
//
// Ranges: temperature [0, 2] finite; top_p (0, 1]; top_k -1, 0 (disabled) or >= 1; min_p [0, 1];
// presence_penalty and frequency_penalty [-2, 2]; repetition_penalty (0, 2]; logit_bias {"<id>": [-100,
// 100]} (at most 1024 ids, each in the vocabulary); min_tokens (/generate: min_new_tokens) in [0,
// max_tokens]; n in [1, 16] (/generate: sampling_params.n);
// max_tokens >= 1 (/generate: max_new_tokens >= 0); prompt + max_tokens <= the context length (when
// max_tokens is absent it defaults to the rest of the context for chat, 16 for completions and 128 for
// /generate, clamped to the context); at most 16 stop strings of 1..256 bytes; top_logprobs 0..20.
//
// Chat output parsing (GenSpec::parse): reasoning when the server's parser is on, the request keeps
// `separate_reasoning` (SGLang; default true) and `chat_template_kwargs.enable_thinking` (default true);
// it starts inside reasoning when the rendered prompt ends with an open <think>. Tool calls are parsed
// when the server's parser is on, `tools` is non-empty and `tool_choice` is "auto" (the default with
// tools), "required" or a named function (those two also force the calls with a grammar, and need the
// parser: 400 without it); "none" renders the tools but parses nothing (vLLM's default).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/backend.h"
#include "server/images.h"
#include "server/output_parser.h"
#include "server/structured_output.h"

namespace kiln::server {

struct ApiLimits {
  int64_t vocab_size = 0;
  int64_t max_context_len = 0;
  int64_t hidden_size = 0;
  std::string served_model_name;
  std::vector<std::string> model_aliases;  // further names "model" may carry (server/model_names.h)
  size_t max_embedding_inputs = 256;
  // Output parsing the server is configured for (ServerOptions): chat replies split <think> blocks into
  // reasoning_content, and <tool_call> blocks into tool_calls when the request has tools.
  bool reasoning_parser = false;
  bool tool_call_parser = false;
  // The checkpoint's generation_config.json (ServerOptions): sampling fields a request leaves unset, and
  // eos ids added to its stop_token_ids unless it sets ignore_eos.
  SamplingParams sampling_defaults;
  std::vector<int32_t> extra_eos_ids;
  // A vision-language checkpoint: images are accepted (server/images.h). Null: a text-only model, and any
  // image in a request is a 400.
  std::shared_ptr<const VisionSetup> vision;
};

enum class Endpoint { chat, completion, generate };

struct GenSpec {
  Endpoint endpoint = Endpoint::chat;
  std::string model;            // as echoed back in responses
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (the server matches them on detokenized text)
  bool include_stop_str = false;  // vLLM's include_stop_str_in_output: a matched stop string is kept
  int n = 1;                      // choices: n samples of the one prompt (seeded: seed, seed+1, ...)
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool continuous_usage = false;         // stream_options.continuous_usage_stats (vLLM): usage on every chunk
  bool logprobs = false;                 // report per-token logprobs in the endpoint's shape
  int top_logprobs = 0;                  // alternatives per token
  bool return_hidden = false;            // /generate return_hidden_states
  bool return_text_in_logprobs = false;  // /generate: token text next to each logprob
  ParserOptions parse;                   // chat: reasoning / tool-call parsing of the reply
  // Qwen3-VL: the request's images in prompt order; `prompt` already holds each one's expanded image pads.
  std::vector<vision::ImagePatches> images;
  std::string request_id;  // /generate's rid: the reply's id instead of a generated one
  // Batched prompts (/v1/completions: a list of strings or of token lists; /generate: a list of texts or of
  // id lists): the prompts after `prompt`, each with its own output limit (clamped to its own context room);
  // n choices each, choice index = prompt index * n + choice. At most kMaxBatchPrompts prompts.
  struct MorePrompt {
    std::vector<int32_t> ids;
    int max_new_tokens = 0;
    std::string echo_text;
  };
  std::vector<MorePrompt> more_prompts;
  bool batched = false;   // the request held a list of prompts: /generate's objects then carry their index
  std::string echo_text;  // completions' echo: the prompt's text, put before the output
  // Prompt logprobs (server/prompt_logprobs.h): which shapes the reply carries, and the alternatives asked.
  bool prompt_logprobs_asked = false;
  bool vllm_prompt_logprobs = false;   // prompt_logprobs (vLLM)
  bool echo_logprobs = false;          // completions echo + logprobs (OpenAI)
  bool sglang_input_logprobs = false;  // /generate return_logprob (SGLang input_token_logprobs)
  int32_t sglang_logprob_start = -1;   // logprob_start_len; -1: the last prompt token
  int prompt_top_logprobs = 0;

  // Structured output: the grammar every choice is drawn under (compiled by the server before submitting),
  // from the token after grammar_after_token (Qwen3's </think> when reasoning is on; -1: from the start).
  std::optional<GrammarRequest> grammar;
  int32_t grammar_after_token = -1;
};

constexpr size_t kMaxBatchPrompts = 256;  // prompts in one batched request (each times n engine requests)

struct EmbedSpec {
  std::string model;
  std::vector<std::vector<int32_t>> inputs;  // one token list per input, each non-empty
  bool base64 = false;                       // encoding_format "base64": little-endian float32
  int64_t dimensions = 0;                    // 0 = full; else truncate then L2-renormalise
};

GenSpec parse_chat_request(const nlohmann::json& body, const TextCodec& codec, const ApiLimits& lim);
GenSpec parse_completion_request(const nlohmann::json& body, const TextCodec& codec, const ApiLimits& lim);
GenSpec parse_generate_request(const nlohmann::json& body, const TextCodec& codec, const ApiLimits& lim);
EmbedSpec parse_embedding_request(const nlohmann::json& body, const TextCodec& codec, const ApiLimits& lim);

// "model", when given, must be a name the server accepts (404 model_not_found otherwise); `model` is set to
// the served name responses echo.
void check_model(const nlohmann::json& body, const ApiLimits& lim, std::string& model);

// Parses an HTTP body: must be a JSON object (400 otherwise, with the parser's reason).
nlohmann::json parse_body(const std::string& body);

}  // namespace kiln::server
