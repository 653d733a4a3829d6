// Python semantics of Jinja values: str/repr, ==, ordering, truthiness, JSON in and out. See value.h.
#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace kiln::tmpl {

void fail(const std::string& msg) {
  throw TemplateError(msg);
}

namespace {
thread_local int walk_depth = 0;

// Containers whose last reference went while another was being freed: freed by the outermost release.
// graveyard_gone (trivially destructible, so readable to the thread's very end) says the graveyard itself
// was destroyed: values freed after that (a static's, at exit) are deleted directly.
thread_local bool graveyard_gone = false;
struct Graveyard {
  std::vector<Array*> arrays;
  std::vector<Object*> objects;
  bool busy = false;
  ~Graveyard() { graveyard_gone = true; }
};
thread_local Graveyard graveyard;

void bury(Graveyard& g) {
  g.busy = true;
  while (!g.arrays.empty() || !g.objects.empty()) {
    if (!g.arrays.empty()) {
      Array* a = g.arrays.back();
      g.arrays.pop_back();
      delete a;  // its elements' containers land in the graveyard instead of recursing
    } else {
      Object* o = g.objects.back();
      g.objects.pop_back();
      delete o;
    }
  }
  g.busy = false;
}

template <typename T>
void release(std::vector<T*> Graveyard::*pile, T* p) noexcept {
  if (graveyard_gone) {
    delete p;
    return;
  }
  try {
    (graveyard.*pile).push_back(p);
  } catch (...) {
    delete p;  // out of memory for the pile: this one recurses
    return;
  }
  if (!graveyard.busy) bury(graveyard);
}
}  // namespace

NestingGuard::NestingGuard() {
  if (++walk_depth > kMaxValueDepth) {
    --walk_depth;
    fail("value nested deeper than " + std::to_string(kMaxValueDepth) +
         " levels (kiln's limit for template values)");
  }
}
NestingGuard::~NestingGuard() {
  --walk_depth;
}

void release_array(Array* a) noexcept {
  release(&Graveyard::arrays, a);
}
void release_object(Object* o) noexcept {
  release(&Graveyard::objects, o);
}

namespace {
[[noreturn]] void overflow(const char* op, int64_t a, int64_t b) {
  fail(std::string("integer overflow: ") + std::to_string(a) + " " + op + " " + std::to_string(b) +
       " does not fit in 64 bits");
}
}  // namespace

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow("+", a, b);
  return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow("-", a, b);
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow("*", a, b);
  return r;
}
int64_t checked_neg(int64_t a) {
  return checked_sub(0, a);
}
int64_t int_of_float(double d) {
  // [-2^63, 2^63): both bounds are exact doubles; NaN fails every comparison.
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
    fail("cannot convert float " + py_float_repr(d) + " to a 64-bit integer");
  return int64_t(d);
}
size_t bounded_count(int64_t n, size_t max, const char* what) {
  if (n <= 0) return 0;
  if (uint64_t(n) > max) fail(std::string(what) + " " + std::to_string(n) + " is too large");
  return size_t(n);
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "Undefined";
    case Kind::none:
      return "NoneType";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::floating:
      return "float";
    case Kind::string:
      return "str";
    case Kind::array:
      return v.tuple ? "tuple" : "list";
    case Kind::object:
      return v.namespace_ ? "Namespace" : "dict";
    case Kind::function:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
    case Kind::none:
      return false;
    case Kind::boolean:
      return v.b;
    case Kind::integer:
      return v.i != 0;
    case Kind::floating:
      return v.f != 0.0;
    case Kind::string:
      return !v.s->empty();
    case Kind::array:
      return !v.a->empty();
    case Kind::object:
      return v.namespace_ || !v.o->items.empty();
    case Kind::function:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  const NestingGuard level;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none:
      return true;
    case Kind::string:
      return *a.s == *b.s;
    case Kind::array:
      if (a.a->size() != b.a->size() || a.tuple != b.tuple) return false;
      for (size_t i = 0; i < a.a->size(); ++i)
        if (!equal((*a.a)[i], (*b.a)[i])) return false;
      return true;
    case Kind::object: {
      if (a.o == b.o) return true;
      if (a.namespace_ || b.namespace_ || a.o->items.size() != b.o->items.size()) return false;
      for (const auto& [k, v] : a.o->items) {
        const Value* w = b.o->find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    case Kind::function:
      return a.fn == b.fn;
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  const NestingGuard level;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s->compare(*b.s) < 0 ? -1 : a.s->compare(*b.s) > 0 ? 1 : 0;
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < std::min(a.a->size(), b.a->size()); ++i)
      if (int c = compare((*a.a)[i], (*b.a)[i])) return c;
    return a.a->size() < b.a->size() ? -1 : a.a->size() > b.a->size() ? 1 : 0;
  }
  fail(std::string("'<' not supported between instances of '") + kind_name(a) + "' and '" + kind_name(b) +
       "'");
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string s(buf, r.ptr);
  std::string out;
  size_t i = 0;
  if (s[0] == '-') {
    out += '-';
    i = 1;
  }
  const size_t epos = s.find('e');
  std::string digits;
  for (size_t k = i; k < epos; ++k)
    if (s[k] != '.') digits += s[k];
  const int exp = std::stoi(s.substr(epos + 1));
  // repr uses fixed notation for 1e-4 <= |x| < 1e16, exponent notation otherwise.
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits;
      out.append(size_t(exp) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, size_t(exp) + 1);
      out += '.';
      out += digits.substr(size_t(exp) + 1);
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + e;
}

namespace {

void repr_string(const std::string& s, std::string& out) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  out += q;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char h[8];
      std::snprintf(h, sizeof h, "\\x%02x", unsigned(u));
      out += h;
    } else {
      out += c;
    }
  }
  out += q;
}

void append_repr(const Value& v, std::string& out) {
  const NestingGuard level;
  switch (v.kind) {
    case Kind::string:
      repr_string(*v.s, out);
      return;
    case Kind::array: {
      out += v.tuple ? '(' : '[';
      for (size_t i = 0; i < v.a->size(); ++i) {
        if (i) out += ", ";
        append_repr((*v.a)[i], out);
      }
      if (v.tuple && v.a->size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return;
    }
    case Kind::object: {
      out += v.namespace_ ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.o->items) {
        if (!first) out += ", ";
        first = false;
        repr_string(k, out);
        out += ": ";
        append_repr(e, out);
      }
      out += v.namespace_ ? "}>" : "}";
      return;
    }
    default:
      append_str(v, out);
  }
}

}  // namespace

void append_str(const Value& v, std::string& out) {
  switch (v.kind) {
    case Kind::undefined:
      return;
    case Kind::none:
      out += "None";
      return;
    case Kind::boolean:
      out += v.b ? "True" : "False";
      return;
    case Kind::integer:
      out += std::to_string(v.i);
      return;
    case Kind::floating:
      out += py_float_repr(v.f);
      return;
    case Kind::string:
      out += *v.s;
      return;
    case Kind::function:
      out += "<function>";
      return;
    default:
      append_repr(v, out);
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return *v.s;
  std::string out;
  append_str(v, out);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(v, out);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  const NestingGuard level;
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value::boolean(j.get<bool>());
    case T::number_integer:
      return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? Value::floating(double(u)) : Value::integer(int64_t(u));
    }
    case T::number_float:
      return Value::floating(j.get<double>());
    case T::string:
      return Value::string(j.get<std::string>());
    case T::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return Value::array(std::move(a));
    }
    case T::object: {
      Value o = Value::object();
      o.o->items.reserve(j.size());
      for (const auto& [k, e] : j.items()) o.o->items.emplace_back(k, from_json(e));
      return o;
    }
    default:
      return Value::none();
  }
}

nlohmann::ordered_json to_json(const Value& v) {
  const NestingGuard level;
  switch (v.kind) {
    case Kind::none:
      return nullptr;
    case Kind::boolean:
      return v.b;
    case Kind::integer:
      return v.i;
    case Kind::floating:
      return v.f;
    case Kind::string:
      return *v.s;
    case Kind::array: {
      auto j = nlohmann::ordered_json::array();
      for (const auto& e : *v.a) j.push_back(to_json(e));
      return j;
    }
    case Kind::object: {
      auto j = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.o->items) j[k] = to_json(e);
      return j;
    }
    default:
      fail(std::string("Object of type ") + kind_name(v) + " is not JSON serializable");
  }
}

namespace {

void dump_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    char h[16];
    if (u < 0x20 || (ensure_ascii && u == 0x7f)) {
      std::snprintf(h, sizeof h, "\\u%04x", unsigned(u));
      out += h;
    } else if (ensure_ascii && u >= 0x80) {
      // Decode one UTF-8 sequence; code points past the BMP become a surrogate pair, as json.dumps writes.
      const int n = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : 2;
      uint32_t cp = u & (0x3f >> (n - 1));
      for (int k = 1; k < n && i + 1 < s.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[++i]) & 0x3f);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(h, sizeof h, "\\u%04x\\u%04x", unsigned(0xd800 + (cp >> 10)),
                      unsigned(0xdc00 + (cp & 0x3ff)));
      } else {
        std::snprintf(h, sizeof h, "\\u%04x", unsigned(cp));
      }
      out += h;
    } else {
      out += c;
    }
  }
  out += '"';
}

void dump(const Value& v, const DumpOptions& opt, int level, std::string& out) {
  const NestingGuard nesting;
  const auto newline = [&](int lvl) {
    if (opt.indent < 0) return;
    out += '\n';
    const size_t pad = size_t(opt.indent) * size_t(lvl);
    if (out.size() + pad > Value::kMaxString) fail("tojson: result too large (over 64 MiB)");
    out.append(pad, ' ');
  };
  switch (v.kind) {
    case Kind::none:
      out += "null";
      return;
    case Kind::boolean:
      out += v.b ? "true" : "false";
      return;
    case Kind::integer:
      out += std::to_string(v.i);
      return;
    case Kind::floating:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py_float_repr(v.f);
      }
      return;
    case Kind::string:
      dump_string(*v.s, opt.ensure_ascii, out);
      return;
    case Kind::array: {
      if (v.a->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.a->size(); ++i) {
        if (i) out += opt.item_sep;
        newline(level + 1);
        dump((*v.a)[i], opt, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::object: {
      if (v.o->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.o->items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first < y->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += opt.item_sep;
        newline(level + 1);
        dump_string(items[i]->first, opt.ensure_ascii, out);
        out += opt.key_sep;
        dump(items[i]->second, opt, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      fail(std::string("Object of type ") + kind_name(v) + " is not JSON serializable");
  }
}

}  // namespace

void json_dumps(const Value& v, const DumpOptions& opt, std::string& out) {
  dump(v, opt, 0, out);
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    size_t n = u < 0x80 ? 1 : u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : u >= 0xc0 ? 2 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

}  // namespace kiln::tmpl
