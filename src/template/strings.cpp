// Python's str methods as chat templates call them (startswith, split, strip, title, replace, ...), over
// UTF-8 with Python's whitespace set. Case mapping is Unicode's simple (one code point to one) mapping from
// utf8proc; Python's few one-to-many special cases (German sharp s to "SS", ligatures) are not made.
#include <utf8proc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "template/eval.h"

namespace kiln::tmpl {
namespace {

uint32_t decode(std::string_view c) {
  const auto u = static_cast<unsigned char>(c[0]);
  if (c.size() == 1) return u;
  uint32_t cp = u & (0x3f >> (c.size() - 1));
  for (size_t k = 1; k < c.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(c[k]) & 0x3f);
  return cp;
}

bool py_space(uint32_t cp) {  // str.isspace(): Unicode White_Space plus the ASCII separators
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

const std::string& str_arg(const Value* v, const char* fn) {
  if (!v || !v->is_string()) fail(std::string(fn) + "() argument must be str");
  return *v->s;
}

std::vector<std::string> split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty pieces
    const auto cs = utf8_chars(s);
    size_t k = 0;
    while (k < cs.size()) {
      while (k < cs.size() && py_space(decode(cs[k]))) ++k;
      if (k == cs.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        std::string rest;
        for (size_t j = k; j < cs.size(); ++j) rest += cs[j];
        while (!rest.empty() && py_space(uint8_t(rest.back()))) rest.pop_back();
        out.push_back(rest);
        return out;
      }
      std::string w;
      while (k < cs.size() && !py_space(decode(cs[k]))) w += cs[k++];
      out.push_back(std::move(w));
    }
    return out;
  }
  const std::string& d = str_arg(sep, "split");
  if (d.empty()) fail("empty separator");
  size_t b = 0;
  while (true) {
    const size_t e = s.find(d, b);
    if (e == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(s.substr(b));
      return out;
    }
    out.push_back(s.substr(b, e - b));
    b = e + d.size();
  }
}

Value strings(std::vector<std::string> parts) {
  Array a;
  a.reserve(parts.size());
  for (auto& p : parts) a.push_back(Value::string(std::move(p)));
  return Value::array(std::move(a));
}

bool affix(const std::string& s, const Value* p, bool start) {
  auto one = [&](const Value& x) {
    const std::string& q = str_arg(&x, start ? "startswith" : "endswith");
    return s.size() >= q.size() &&
           (start ? s.compare(0, q.size(), q) == 0 : s.compare(s.size() - q.size(), q.size(), q) == 0);
  };
  if (p && p->is_array()) return std::any_of(p->a->begin(), p->a->end(), one);
  if (!p) fail("startswith/endswith need an argument");
  return one(*p);
}

}  // namespace

std::string py_strip(std::string_view s, const Value& chars, bool left, bool right) {
  const auto cs = utf8_chars(s);
  std::vector<std::string_view> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_chars(str_arg(&chars, "strip"));
  auto strip_it = [&](std::string_view c) {
    return ws ? py_space(decode(c)) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strip_it(cs[b])) ++b;
  if (right)
    while (e > b && strip_it(cs[e - 1])) --e;
  if (b == e) return "";
  return std::string(
      s.substr(size_t(cs[b].data() - s.data()), size_t(cs[e - 1].data() + cs[e - 1].size() - cs[b].data())));
}

namespace {

template <typename F>
std::string map_chars(std::string_view s, F f) {  // f(code point, index, previous cased?) -> code point
  std::string r;
  r.reserve(s.size());
  bool prev_cased = false;
  size_t i = 0;
  for (std::string_view c : utf8_chars(s)) {
    const uint32_t cp = decode(c);
    const uint32_t m = f(cp, i++, prev_cased);
    const auto cat = utf8proc_category(utf8proc_int32_t(cp));
    prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
    if (m == cp) {
      r += c;
    } else {
      utf8proc_uint8_t buf[4];
      r.append(reinterpret_cast<const char*>(buf), size_t(utf8proc_encode_char(utf8proc_int32_t(m), buf)));
    }
  }
  return r;
}
uint32_t upper(uint32_t cp) {
  return uint32_t(utf8proc_toupper(utf8proc_int32_t(cp)));
}
uint32_t lower(uint32_t cp) {
  return uint32_t(utf8proc_tolower(utf8proc_int32_t(cp)));
}
uint32_t title(uint32_t cp) {
  return uint32_t(utf8proc_totitle(utf8proc_int32_t(cp)));
}

}  // namespace

std::string py_upper(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t, bool) { return upper(c); });
}
std::string py_lower(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t, bool) { return lower(c); });
}
std::string py_capitalize(std::string_view s) {  // Python >= 3.8: the first character in title case
  return map_chars(s, [](uint32_t c, size_t i, bool) { return i == 0 ? title(c) : lower(c); });
}
static std::string py_title(std::string_view s) {  // str.title(): title case after an uncased character
  return map_chars(s, [](uint32_t c, size_t, bool prev) { return prev ? lower(c) : title(c); });
}
std::string jinja_title(std::string_view s) {  // the title filter: words start after - whitespace ( { [ <
  std::string r;
  bool start = true;
  for (std::string_view c : utf8_chars(s)) {
    const uint32_t cp = decode(c);
    if (cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_space(cp)) {
      r += c;
      start = true;
    } else {
      r += start ? py_upper(c) : py_lower(c);
      start = false;
    }
  }
  return r;
}

constexpr int kMaxFormatField = 1024;

std::string py_percent_format(const std::string& fmt, const std::vector<Value>& args) {
  std::string out;
  size_t next = 0;
  auto take = [&]() -> const Value& {
    if (next >= args.size()) fail("not enough arguments for format string");
    return args[next++];
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    // Python's %-spec: flags, a width, a precision. Each number is bounded (no template needs a wider
    // field), so the output and snprintf's buffer stay small whatever the template asks for.
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos)
      spec += fmt[i++];
    const bool left = spec.find('-') != std::string::npos;
    auto number = [&]() -> int {
      int n = 0;
      for (; i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9'; ++i) {
        spec += fmt[i];
        n = n * 10 + (fmt[i] - '0');
        if (n > kMaxFormatField)
          fail("format field width or precision over " + std::to_string(kMaxFormatField));
      }
      return n;
    };
    const int width = number();
    int precision = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      precision = number();
    }
    if (i >= fmt.size()) fail("incomplete format");
    const char conv = fmt[i];
    char buf[2 * kMaxFormatField + 64];
    if (conv == '%') {
      out += '%';
    } else if (conv == 's' || conv == 'r') {
      const Value& v = take();
      std::string t = conv == 's' ? to_str(v) : repr(v);
      if (precision >= 0 && utf8_length(t) > size_t(precision)) {  // "%.3s" keeps 3 characters
        const auto cs = utf8_chars(t);
        t = std::string(t.data(), size_t(cs[size_t(precision)].data() - t.data()));
      }
      const size_t len = utf8_length(t), w = size_t(width);
      if (len < w && !left) out.append(w - len, ' ');
      out += t;
      if (len < w && left) out.append(w - len, ' ');
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      const Value& v = take();
      if (!v.is_number())
        fail(std::string("%") + conv + " format: a number is required, not " + kind_name(v));
      const long long n = v.kind == Kind::floating ? int_of_float(v.f) : v.as_int();
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
      out += buf;
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
      const Value& v = take();
      if (!v.is_number())
        fail(std::string("%") + conv + " format: a number is required, not " + kind_name(v));
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
      out += buf;
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (next < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

Value string_method(const std::string& s, const std::string& name, std::vector<Value>& args, Kwargs& kwargs,
                    bool& found) {
  found = true;
  const Value none = Value::none();
  if (name == "startswith" || name == "endswith") {
    check_args(name.c_str(), args, kwargs, 1, {});
    return Value::boolean(affix(s, arg(args, kwargs, 0, "prefix"), name == "startswith"));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_args(name.c_str(), args, kwargs, 1, {});
    const Value* c = arg(args, kwargs, 0, "chars");
    return Value::string(py_strip(s, c ? *c : none, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    check_args(name.c_str(), args, kwargs, 2, {"sep", "maxsplit"});
    const Value* m = arg(args, kwargs, 1, "maxsplit");
    const int64_t maxsplit = m ? m->as_int() : -1;
    if (name == "rsplit" && maxsplit >= 0) {  // split from the right: reverse, split, reverse back
      const Value* sep = arg(args, kwargs, 0, "sep");
      std::vector<std::string> parts = split(s, sep, -1);
      const std::string d = sep && sep->is_string() ? *sep->s : " ";
      if (int64_t(parts.size()) - 1 <= maxsplit) return strings(std::move(parts));
      std::vector<std::string> out;
      const size_t head = parts.size() - size_t(maxsplit);
      std::string first;
      for (size_t k = 0; k < head; ++k) first += (k ? d : "") + parts[k];
      out.push_back(first);
      for (size_t k = head; k < parts.size(); ++k) out.push_back(parts[k]);
      return strings(std::move(out));
    }
    return strings(split(s, arg(args, kwargs, 0, "sep"), maxsplit));
  }
  if (name == "splitlines") {
    std::vector<std::string> out;
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == '\n' || s[k] == '\r') {
        out.push_back(s.substr(b, k - b));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        b = k + 1;
      }
    if (b < s.size()) out.push_back(s.substr(b));
    return strings(std::move(out));
  }
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    check_args("replace", args, kwargs, 3, {"count"});
    const std::string& a = str_arg(arg(args, kwargs, 0, "old"), "replace");
    const std::string& b = str_arg(arg(args, kwargs, 1, "new"), "replace");
    const Value* cv = arg(args, kwargs, 2, "count");
    int64_t count = cv ? cv->as_int() : -1;
    std::string r;
    size_t p = 0;
    if (a.empty()) {  // Python inserts `new` between every character
      const auto cs = utf8_chars(s);
      for (size_t k = 0; k <= cs.size(); ++k) {
        if (count < 0 || int64_t(k) < count) r += b;
        if (k < cs.size()) r += cs[k];
      }
      return Value::string(std::move(r));
    }
    while (count != 0) {
      const size_t e = s.find(a, p);
      if (e == std::string::npos) break;
      r.append(s, p, e - p);
      r += b;
      p = e + a.size();
      --count;
    }
    r.append(s, p);
    return Value::string(std::move(r));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const std::string& sub = str_arg(arg(args, kwargs, 0, "sub"), name.c_str());
    if (name == "count") {
      int64_t n = 0;
      if (sub.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(utf8_length(std::string_view(s).substr(0, p))));
  }
  if (name == "join") {
    const Value* it = arg(args, kwargs, 0, "iterable");
    if (!it) fail("join() takes exactly one argument");
    std::string r;
    bool first = true;
    for (const Value& v : iterate(*it)) {
      if (!v.is_string())
        fail("sequence item: expected str instance, " + std::string(kind_name(v)) + " found");
      if (!first) r += s;
      first = false;
      r += *v.s;
    }
    return Value::string(std::move(r));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" ||
      name == "isupper") {
    if (s.empty()) return Value::boolean(false);
    bool ok = true, cased = false;
    for (char c : s) {
      const bool d = c >= '0' && c <= '9', a = is_alpha(c);
      if (name == "isdigit") ok = ok && d;
      if (name == "isalpha") ok = ok && a;
      if (name == "isalnum") ok = ok && (a || d);
      if (name == "isspace") ok = ok && py_space(uint8_t(c));
      if (name == "islower") ok = ok && !(c >= 'A' && c <= 'Z'), cased = cased || (c >= 'a' && c <= 'z');
      if (name == "isupper") ok = ok && !(c >= 'a' && c <= 'z'), cased = cased || (c >= 'A' && c <= 'Z');
    }
    return Value::boolean(ok && (name != "islower" && name != "isupper" ? true : cased));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& a = str_arg(arg(args, kwargs, 0, "prefix"), name.c_str());
    if (name == "removeprefix") return Value::string(s.compare(0, a.size(), a) == 0 ? s.substr(a.size()) : s);
    return Value::string(s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0
                             ? s.substr(0, s.size() - a.size())
                             : s);
  }
  found = false;
  return Value::undefined();
}

}  // namespace kiln::tmpl
