// A checkpoint's chat template(s), found where transformers finds them, and rendered with the variables
// apply_chat_template passes: messages, tools (None when absent), documents (None when absent),
// add_generation_prompt (False when absent), the special tokens (bos_token, eos_token, unk_token, sep_token,
// pad_token, cls_token, mask_token, additional_special_tokens: those set), then every other key of the
// request (chat_template_kwargs such as enable_thinking), which may override them.
//
// Where the template comes from, first match wins (transformers' from_pretrained): a chat_template.jinja
// file; chat_template.json's "chat_template" (what processors of VL checkpoints ship);
// tokenizer_config.json's "chat_template". A list of named templates picks "tool_use" when the request has
// tools and one exists, else "default" (as transformers' get_chat_template).
//
// The Qwen3 template (fingerprint) renders natively (qwen3_chat.cpp), any other through src/template. A
// template that does not parse is reported when rendered (load succeeds: the tokenizer is still usable).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "template/template.h"

namespace kiln::tok {

class ChatTemplate {
 public:
  // Any argument may be "" (file absent). Throws kiln::Error for tokenizer_config/chat_template.json that
  // is not JSON.
  static std::shared_ptr<const ChatTemplate> load(std::string_view tokenizer_config_json,
                                                  std::string_view chat_template_jinja,
                                                  std::string_view chat_template_json);
  bool empty() const { return entries_.empty(); }
  // One line for logs: where the template came from, how it renders, and any parse error.
  std::string describe() const;
  // request_json: {"messages": [...], "tools"?, "documents"?, "add_generation_prompt"?, other variables}.
  std::string render(std::string_view request_json) const;
  // The same through the interpreter even for the Qwen3 template (tests compare the two paths).
  std::string render_interpreted(std::string_view request_json) const;

 private:
  struct Entry {
    std::string name, source, parse_error;
    bool native_qwen3 = false;
    std::shared_ptr<const tmpl::Template> compiled;  // null when parse_error is set
  };
  std::vector<Entry> entries_;
  std::string origin_;  // the file it came from
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();

  const Entry& pick(const nlohmann::ordered_json& request) const;
  std::string render(std::string_view request_json, bool allow_native) const;
};

bool is_qwen3_template(std::string_view chat_template);
std::string render_qwen3_chat(std::string_view request_json);  // throws for malformed requests

}  // namespace kiln::tok
