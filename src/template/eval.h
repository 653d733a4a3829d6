// Internal interface between the evaluator (eval.cpp) and the builtins (builtins.cpp, strings.cpp): Jinja's
// scoping and the calls the builtins make back into the evaluator (filters that apply filters or tests by
// name, attribute paths).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "template/ast.h"
#include "template/value.h"

namespace kiln::tmpl {

// One variable frame. A for-loop iteration, a macro call and a with/generation block each get a fresh
// frame over their parent, so a `set` inside them is invisible outside (hence namespace() in templates).
struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  const Scope* parent = nullptr;
  const Value* lookup(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

// Filters, tests and methods (builtins.cpp). `found` is cleared when no builtin has that name.
Value apply_filter(const std::string& name, const Value& v, std::vector<Value>& args, Kwargs& kwargs);
bool apply_test(const std::string& name, const Value& v, std::vector<Value>& args);
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value call_method(const Value& obj, const std::string& name, std::vector<Value>& args, Kwargs& kwargs,
                  bool& found);
Value get_attr(const Value& obj,
               std::string_view name);               // Jinja's getattr: attribute, then item, else undefined
Value get_item(const Value& obj, const Value& key);  // Jinja's getitem: item, else undefined
Value attr_path(const Value& obj, const std::string& path);  // "a.b.0" as map(attribute=...) reads it
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
bool contains(const Value& container, const Value& item);  // Python's `in`
std::vector<Value> iterate(const Value& v);                // Python's iter(): list items, dict keys, chars
[[noreturn]] void raise_undefined(const Value& v);
// Globals every render sees: range, namespace, dict, raise_exception, strftime_now.
void add_globals(Scope& s);

// Python str methods (strings.cpp).
Value string_method(const std::string& s, const std::string& name, std::vector<Value>& args, Kwargs& kwargs,
                    bool& found);
std::string py_strip(std::string_view s, const Value& chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string jinja_title(std::string_view s);
// Python's `fmt % args` (the `format` filter too): %s %r %d %i %x %o %f %e %g %% with flags, width,
// precision.
std::string py_percent_format(const std::string& fmt, const std::vector<Value>& args);

// Argument helpers: positional i, else keyword `name`, else the default.
const Value* arg(std::vector<Value>& args, Kwargs& kwargs, size_t i, const char* name);
void check_args(const char* fn, std::vector<Value>& args, Kwargs& kwargs, size_t max_positional,
                std::initializer_list<const char*> names);

// Executes a template body into out (eval.cpp).
void render_body(const Body& body, Scope& globals, std::string& out);

}  // namespace kiln::tmpl
