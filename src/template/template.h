// kiln's Jinja interpreter: the subset of Jinja 3 that Hugging Face chat templates use, configured as
// transformers' apply_chat_template configures Jinja2 (trim_blocks, lstrip_blocks, loopcontrols,
// ImmutableSandboxedEnvironment, its `tojson`, `raise_exception` and `strftime_now`).
//
// Contract:
//  - Template(source) parses once (raises TemplateError "template syntax error (line N): ..."); the object
//    is immutable afterwards and render() may run on many threads at once.
//  - render(vars) renders with `vars` (a JSON object) as the template's variables, byte for byte what Jinja2
//    renders, or raises TemplateError "chat template error (line N): ..." where Jinja2 raises
//    (raise_exception, an undefined value used, a type error). Extensions where Jinja2 would differ are
//    listed in README.md (docs: "Chat templates").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "template/value.h"

namespace kiln::tmpl {

struct Stmt;

class Template {
 public:
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  std::string render(const nlohmann::ordered_json& vars) const;
  std::string render(const Value& vars) const;  // vars: an object Value

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::tmpl
