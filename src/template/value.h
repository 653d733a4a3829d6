// Jinja values: Python's object model cut down to what chat templates touch (None, bool, int, float, str,
// list/tuple, dict in insertion order, namespace, callables) plus Jinja's Undefined. Lists and dicts are
// shared by reference as in Python, so namespace() attribute writes are seen by every holder.
//
// Contract: to_str() is Python's str() (lists and dicts print their repr, floats repr's shortest
// round-trip digits, None/True/False capitalised); equal() is Python's == (1 == 1.0 == True); truthy() is
// Python's bool(); from_json()/to_json() map JSON <-> values losslessly (key order kept). Errors are
// TemplateError with a message meant for a user reading a 400 response.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/error.h"

namespace kiln::tmpl {

class TemplateError : public Error {
 public:
  explicit TemplateError(const std::string& what) : Error(what) {}
};
[[noreturn]] void fail(const std::string& msg);

// Integers are 64-bit (Python's are unbounded): arithmetic that would overflow is a TemplateError, never
// wrapped or undefined behaviour; a float becomes an integer only when it fits.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_sub(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);
int64_t checked_neg(int64_t a);
int64_t int_of_float(double d);
// A count the template supplies (a width, an indent): negative counts as 0, past `max` is an error.
size_t bounded_count(int64_t n, size_t max, const char* what);

struct Value;
struct Object;
using Array = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
// Positional and keyword arguments of a call; the function validates them itself.
using Function = std::function<Value(std::vector<Value>& args, Kwargs& kwargs)>;

// Walks of nested values (str, repr, ==, <, tojson, JSON conversion) go at most kMaxValueDepth levels deep:
// past it a TemplateError, never a stack overflow. Request JSON nests at most kiln::kMaxJsonDepth (128)
// levels; only a value the template builds itself (namespace attributes wrapped in a loop) gets deeper.
inline constexpr int kMaxValueDepth = 512;
class NestingGuard {  // one per level of a recursive walk, on the walking thread
 public:
  NestingGuard();
  ~NestingGuard();
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};
// Lists and dicts are freed through these, without recursion: a chain nested a million deep (which a
// template can build) is destroyed in a loop, not one stack frame per level.
void release_array(Array* a) noexcept;
void release_object(Object* o) noexcept;

enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, array, object, function };

struct Value {
  Kind kind = Kind::undefined;
  bool tuple = false;         // an array written (a, b): repr prints parentheses
  bool namespace_ = false;    // an object made by namespace(): attributes may be assigned
  bool missing_attr = false;  // an undefined from obj.name / obj[key]: s names the attribute
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;  // the string; for undefined, what is missing (for messages)
  std::shared_ptr<Array> a;
  std::shared_ptr<Object> o;
  std::shared_ptr<const Function> fn;

  static Value undefined() { return Value(); }
  // hint: a name ("x": "'x' is undefined") or a whole sentence (it has a space).
  static Value undefined(std::string hint) {
    Value v;
    v.s = std::make_shared<const std::string>(std::move(hint));
    return v;
  }
  // Without allocating: `name` must outlive the value (a name in the parsed template).
  static Value undefined_ref(const std::string& name, bool missing_attr) {
    Value v;
    v.s = std::shared_ptr<const std::string>(std::shared_ptr<const std::string>(), &name);
    v.missing_attr = missing_attr;
    return v;
  }
  static Value none() { return make(Kind::none); }
  static Value boolean(bool x) {
    Value v = make(Kind::boolean);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::integer);
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v = make(Kind::floating);
    v.f = x;
    return v;
  }
  static constexpr size_t kMaxString = size_t(64) << 20;  // no string grows past this: a runaway template
  static Value string(std::string x) {
    if (x.size() > kMaxString) fail("string result too large (over 64 MiB)");
    Value v = make(Kind::string);
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value array(Array x = {}) {
    Value v = make(Kind::array);
    v.a = std::shared_ptr<Array>(new Array(std::move(x)), release_array);
    return v;
  }
  static Value object();
  static Value function(Function f) {
    Value v = make(Kind::function);
    v.fn = std::make_shared<const Function>(std::move(f));
    return v;
  }

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_array() const { return kind == Kind::array; }
  bool is_object() const { return kind == Kind::object; }
  const std::string& str() const { return *s; }
  double as_double() const {
    return kind == Kind::floating ? f : kind == Kind::boolean ? double(b) : double(i);
  }
  int64_t as_int() const { return kind == Kind::boolean ? int64_t(b) : i; }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// A dict: insertion-ordered; lookups are linear (chat-template dicts hold a handful of keys).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(std::string key, Value v) {
    for (auto& [k, old] : items)
      if (k == key) {
        old = std::move(v);
        return;
      }
    items.emplace_back(std::move(key), std::move(v));
  }
};

inline Value Value::object() {
  Value v = make(Kind::object);
  v.o = std::shared_ptr<Object>(new Object(), release_object);
  return v;
}

const char* kind_name(const Value& v);  // Python's type name: 'str', 'dict', 'NoneType', ...
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);  // <0, 0, >0; raises for unorderable types
std::string to_str(const Value& v);           // str(v)
void append_str(const Value& v, std::string& out);
std::string repr(const Value& v);  // repr(v)
std::string py_float_repr(double x);

Value from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const Value& v);  // raises for undefined and callables

// json.dumps(v, ensure_ascii=False, indent=indent, separators=(item_sep, key_sep), sort_keys=...):
// transformers' tojson filter. indent < 0 means None.
struct DumpOptions {
  int indent = -1;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
void json_dumps(const Value& v, const DumpOptions& opt, std::string& out);

// Python str helpers over UTF-8 (indexing, len and slicing count code points as Python does).
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

}  // namespace kiln::tmpl
