// Template: parse once, render many times; see template.h.
#include "template/template.h"

#include "template/eval.h"
#include "template/parser.h"

namespace kiln::tmpl {

struct Template::Impl {
  Body body;
};

Template::Template(std::string_view source) : impl_(std::make_unique<Impl>()) {
  impl_->body = parse(source);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& vars) const {
  if (!vars.is_object()) fail("template variables must be a mapping");
  Scope globals;
  add_globals(globals);
  for (const auto& [k, v] : vars.o->items) globals.set(k, v);
  std::string out;
  render_body(impl_->body, globals, out);
  return out;
}

std::string Template::render(const nlohmann::ordered_json& vars) const {
  return render(from_json(vars));
}

}  // namespace kiln::tmpl
