// Fuzzes the Jinja interpreter: any text either fails to parse, or renders over a small conversation (with
// tools, tool calls and image parts), or raises -- always as a kiln::Error, never a crash, a hang or a
// sanitizer report. Seeds: the feature templates in tests/fixtures/chat_templates.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/error.h"
#include "template/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::tmpl::Value vars = kiln::tmpl::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <think>"},
                 {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"a": [1, 2.5, "x"]}}}]},
                 {"role": "tool", "content": "{\"ok\": true}", "tool_call_id": "c1"},
                 {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "enable_thinking": false})"));
  try {
    const kiln::tmpl::Template t(std::string(reinterpret_cast<const char*>(data), size));
    (void)t.render(vars);
  } catch (const kiln::Error&) {
  }
  return 0;
}
