// Jinja's tests, dict and list methods, attribute/item access, slicing, `in`, iteration and the globals
// transformers adds (raise_exception, strftime_now) -- with Jinja 3.1's behaviour for each. Filters are in
// filters.cpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "template/eval.h"

namespace kiln::tmpl {

void raise_undefined(const Value& v) {
  if (!v.s || v.s->empty()) fail("a value is undefined");
  if (v.missing_attr) fail("the object has no attribute or item '" + *v.s + "'");
  if (v.s->find(' ') != std::string::npos) fail(*v.s);
  fail("'" + *v.s + "' is undefined");
}

const Value* arg(std::vector<Value>& args, Kwargs& kwargs, size_t i, const char* name) {
  if (i < args.size()) return &args[i];
  for (auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

void check_args(const char* fn, std::vector<Value>& args, Kwargs& kwargs, size_t max_positional,
                std::initializer_list<const char*> names) {
  if (args.size() > max_positional)
    fail(std::string(fn) + "() takes at most " + std::to_string(max_positional) + " positional argument(s)");
  for (const auto& [k, v] : kwargs) {
    bool ok = false;
    for (const char* n : names) ok = ok || k == n;
    if (!ok) fail(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return {};
    case Kind::array:
      return *v.a;
    case Kind::object: {
      std::vector<Value> keys;
      keys.reserve(v.o->items.size());
      for (const auto& kv : v.o->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::string: {
      std::vector<Value> cs;
      for (auto c : utf8_chars(*v.s)) cs.push_back(Value::string(std::string(c)));
      return cs;
    }
    default:
      fail(std::string("'") + kind_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& c, const Value& x) {
  if (c.is_undefined()) raise_undefined(c);
  if (c.is_string()) {
    if (!x.is_string())
      fail("'in <string>' requires string as left operand, not " + std::string(kind_name(x)));
    return c.s->find(*x.s) != std::string::npos;
  }
  if (c.is_array()) return std::any_of(c.a->begin(), c.a->end(), [&](const Value& e) { return equal(e, x); });
  if (c.is_object()) return x.is_string() && c.o->find(*x.s) != nullptr;
  fail(std::string("argument of type '") + kind_name(c) + "' is not iterable");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_object()) {
    if (!key.is_string() && !key.is_number()) return Value::undefined();
    const Value* v = obj.o->find(key.is_string() ? *key.s : to_str(key));
    return v ? *v : Value::undefined();
  }
  if ((obj.is_array() || obj.is_string()) && (key.kind == Kind::integer || key.kind == Kind::boolean)) {
    int64_t i = key.as_int();
    if (obj.is_array()) {
      const int64_t n = int64_t(obj.a->size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? (*obj.a)[size_t(i)] : Value::undefined();
    }
    const auto cs = utf8_chars(*obj.s);
    const int64_t n = int64_t(cs.size());
    if (i < 0) i += n;
    return i >= 0 && i < n ? Value::string(std::string(cs[size_t(i)])) : Value::undefined();
  }
  if (key.is_string()) return get_attr(obj, *key.s);
  return Value::undefined();
}

Value get_attr(const Value& obj, std::string_view name) {
  if (obj.is_object()) {
    const Value* v = obj.o->find(name);
    return v ? *v : Value::undefined();
  }
  return Value::undefined();
}

Value attr_path(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t b = 0;
  while (true) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    int64_t index = 0;
    if (digits && cur.is_array() &&
        std::from_chars(part.data(), part.data() + part.size(), index).ec != std::errc{})
      return Value::undefined();  // an index past int64: past the end of any list
    cur =
        digits && cur.is_array() ? get_item(cur, Value::integer(index)) : get_item(cur, Value::string(part));
    if (e == std::string::npos || cur.is_undefined()) return cur;
    b = e + 1;
  }
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  std::vector<Value> items;
  std::vector<std::string_view> cs;
  int64_t n;
  if (obj.is_string()) {
    cs = utf8_chars(*obj.s);
    n = int64_t(cs.size());
  } else if (obj.is_array()) {
    n = int64_t(obj.a->size());
  } else {
    fail(std::string("'") + kind_name(obj) + "' object is not subscriptable");
  }
  const int64_t st = step.is_none() ? 1 : step.as_int();
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::string s;
  Array a;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    if (obj.is_string()) {
      s += cs[size_t(i)];
    } else {
      a.push_back((*obj.a)[size_t(i)]);
    }
    if (__builtin_add_overflow(i, st, &i)) break;  // past the end either way
  }
  if (obj.is_string()) return Value::string(std::move(s));
  Value r = Value::array(std::move(a));
  r.tuple = obj.tuple;
  return r;
}

Value call_method(const Value& obj, const std::string& name, std::vector<Value>& args, Kwargs& kwargs,
                  bool& found) {
  found = false;
  if (obj.is_string()) return string_method(*obj.s, name, args, kwargs, found);
  if (obj.is_object()) {
    found = true;
    if (name == "items") {
      Array a;
      for (const auto& [k, v] : obj.o->items) {
        Value t = Value::array({Value::string(k), v});
        t.tuple = true;
        a.push_back(std::move(t));
      }
      return Value::array(std::move(a));
    }
    if (name == "keys") return Value::array(iterate(obj));
    if (name == "values") {
      Array a;
      for (const auto& kv : obj.o->items) a.push_back(kv.second);
      return Value::array(std::move(a));
    }
    if (name == "get") {
      const Value* k = arg(args, kwargs, 0, "key");
      if (!k) fail("get() needs a key");
      Value v = get_item(obj, *k);
      if (!v.is_undefined()) return v;
      const Value* d = arg(args, kwargs, 1, "default");
      return d ? *d : Value::none();
    }
    found = false;
    const Value* fn = obj.o->find(name);
    if (fn && fn->kind == Kind::function) return Value::undefined();
    if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" || name == "popitem")
      fail("access to attribute '" + name + "' of 'dict' object is unsafe");
    return Value::undefined();
  }
  if (obj.is_array()) {
    if (name == "append" || name == "pop" || name == "extend" || name == "insert" || name == "remove" ||
        name == "clear" || name == "sort" || name == "reverse")
      fail("access to attribute '" + name + "' of '" + kind_name(obj) + "' object is unsafe");
    if (name == "index" || name == "count") {
      found = true;
      const Value* x = arg(args, kwargs, 0, "value");
      if (!x) fail(name + "() takes exactly one argument");
      int64_t c = 0;
      for (size_t k = 0; k < obj.a->size(); ++k)
        if (equal((*obj.a)[k], *x)) {
          if (name == "index") return Value::integer(int64_t(k));
          ++c;
        }
      if (name == "index") fail("value is not in list");
      return Value::integer(c);
    }
  }
  return Value::undefined();
}

namespace {

const char* kTests[] = {"defined",  "undefined", "none", "string", "number",      "integer",
                        "float",    "boolean",   "true", "false",  "mapping",     "iterable",
                        "sequence", "callable",  "odd",  "even",   "divisibleby", "eq",
                        "equalto",  "==",        "ne",   "!=",     "lt",          "lessthan",
                        "<",        "le",        "<=",   "gt",     "greaterthan", ">",
                        "ge",       ">=",        "in",   "sameas", "lower",       "upper",
                        "escaped",  "filter",    "test"};

}  // namespace

bool has_test(const std::string& name) {
  return std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return name == t; });
}

bool apply_test(const std::string& n, const Value& v, std::vector<Value>& args) {
  auto need = [&](size_t k) -> const Value& {
    if (args.size() < k + 1) fail("test '" + n + "' needs an argument");
    return args[k];
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.kind == Kind::integer;
  if (n == "float") return v.kind == Kind::floating;
  if (n == "boolean") return v.kind == Kind::boolean;
  if (n == "true") return v.kind == Kind::boolean && v.b;
  if (n == "false") return v.kind == Kind::boolean && !v.b;
  if (n == "mapping") return v.is_object();
  if (n == "iterable") return v.is_array() || v.is_object() || v.is_string() || v.is_undefined();
  if (n == "sequence") return v.is_array() || v.is_object() || v.is_string() || v.is_undefined();
  if (n == "callable") return v.kind == Kind::function;
  if (n == "odd" || n == "even") {
    if (v.kind != Kind::integer && v.kind != Kind::boolean) fail("test '" + n + "' needs an integer");
    return (v.as_int() % 2 != 0) == (n == "odd");
  }
  if (n == "divisibleby") {
    const int64_t d = need(0).as_int();
    return d != 0 && (d == -1 || v.as_int() % d == 0);  // INT64_MIN % -1 traps
  }
  if (n == "eq" || n == "equalto" || n == "==") return equal(v, need(0));
  if (n == "ne" || n == "!=") return !equal(v, need(0));
  if (n == "lt" || n == "lessthan" || n == "<") return compare(v, need(0)) < 0;
  if (n == "le" || n == "<=") return compare(v, need(0)) <= 0;
  if (n == "gt" || n == "greaterthan" || n == ">") return compare(v, need(0)) > 0;
  if (n == "ge" || n == ">=") return compare(v, need(0)) >= 0;
  if (n == "in") return contains(need(0), v);
  if (n == "sameas") {
    const Value& o = need(0);
    if (v.kind != o.kind) return false;
    if (v.is_array()) return v.a == o.a;
    if (v.is_object()) return v.o == o.o;
    if (v.is_string()) return v.s == o.s;
    return equal(v, o);
  }
  if (n == "lower") return v.is_string() && py_lower(*v.s) == *v.s;
  if (n == "upper") return v.is_string() && py_upper(*v.s) == *v.s;
  if (n == "escaped") return false;
  if (n == "filter") return need(0).is_string() && has_filter(*need(0).s);
  if (n == "test") return need(0).is_string() && has_test(*need(0).s);
  fail("no test named '" + n + "'");
}

void add_globals(Scope& s) {
  s.set("range", Value::function([](std::vector<Value>& a, Kwargs&) -> Value {
          if (a.empty() || a.size() > 3) fail("range expected 1 to 3 arguments");
          int64_t b = 0, e, st = 1;
          if (a.size() == 1) {
            e = a[0].as_int();
          } else {
            b = a[0].as_int();
            e = a[1].as_int();
            if (a.size() == 3) st = a[2].as_int();
          }
          if (st == 0) fail("range() arg 3 must not be zero");
          Array out;
          for (int64_t i = b; st > 0 ? i < e : i > e;) {
            out.push_back(Value::integer(i));
            if (out.size() > 100000) fail("range too big");
            if (__builtin_add_overflow(i, st, &i)) break;  // past the end either way
          }
          return Value::array(std::move(out));
        }));
  auto make_dict = [](bool ns) {
    return [ns](std::vector<Value>& a, Kwargs& kw) -> Value {
      Value o = Value::object();
      o.namespace_ = ns;
      for (const Value& x : a) {
        if (!x.is_object()) fail(ns ? "namespace() takes a mapping" : "dict() takes a mapping");
        for (const auto& [k, v] : x.o->items) o.o->set(k, v);
      }
      for (const auto& [k, v] : kw) o.o->set(k, v);
      return o;
    };
  };
  s.set("namespace", Value::function(make_dict(true)));
  s.set("dict", Value::function(make_dict(false)));
  s.set("raise_exception", Value::function([](std::vector<Value>& a, Kwargs&) -> Value {
          fail("raise_exception: " + (a.empty() ? std::string() : to_str(a[0])));
        }));
  s.set("strftime_now", Value::function([](std::vector<Value>& a, Kwargs&) -> Value {
          if (a.empty() || !a[0].is_string()) fail("strftime_now(format) needs a format string");
          const std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, a[0].s->c_str(), &tm);
          return Value::string(std::string(buf, n));
        }));
}

}  // namespace kiln::tmpl
