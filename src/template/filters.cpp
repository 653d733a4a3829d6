// Jinja 3.1's filters, transformers' tojson among them; see eval.h for the interface.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "template/eval.h"

namespace kiln::tmpl {
namespace {

double round_half_away(double x) {
  return x < 0 ? -std::floor(-x + 0.5) : std::floor(x + 0.5);
}

Value to_number(const Value& v, bool as_float, const Value* def) {
  if (v.kind == Kind::floating && std::isnan(v.f) && !as_float)  // Python: int(nan) is a ValueError
    return def ? *def : Value::integer(0);
  if (v.is_number())
    return as_float ? Value::floating(v.as_double())
                    : Value::integer(v.kind == Kind::floating ? int_of_float(v.f) : v.as_int());
  if (v.is_string()) {
    const std::string t = py_strip(*v.s, Value::none(), true, true);
    const char* b = t.c_str();
    const char* end = b + t.size();
    if (!as_float) {
      int64_t i = 0;
      const auto r = std::from_chars(b + (t.size() > 1 && t[0] == '+'), end, i);
      if (r.ec == std::errc{} && r.ptr == end && !t.empty()) return Value::integer(i);
    }
    // strtod, as Python's float(): past the range is inf (or 0); Jinja's int falls back to int(float(s)).
    char* used = nullptr;
    const double d = t.empty() ? 0.0 : std::strtod(b, &used);
    if (!t.empty() && used == end && !(std::isnan(d) && !as_float))
      return as_float ? Value::floating(d) : Value::integer(int_of_float(d));
  }
  if (def) return *def;
  return as_float ? Value::floating(0.0) : Value::integer(0);
}

std::vector<Value> sorted(std::vector<Value> items, bool reverse, bool case_sensitive,
                          const Value* attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute && attribute->is_string() ? attr_path(v, *attribute->s) : v;
    if (!case_sensitive && k.is_string()) k = Value::string(py_lower(*k.s));
    return k;
  };
  std::vector<std::pair<Value, Value>> kv;
  for (auto& v : items) kv.emplace_back(key(v), v);
  std::stable_sort(kv.begin(), kv.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  for (auto& p : kv) out.push_back(std::move(p.second));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    switch (c) {
      case '&':
        r += "&amp;";
        break;
      case '<':
        r += "&lt;";
        break;
      case '>':
        r += "&gt;";
        break;
      case '"':
        r += "&#34;";
        break;
      case '\'':
        r += "&#39;";
        break;
      default:
        r += c;
    }
  }
  return r;
}

// select/reject/selectattr/rejectattr: args are [attribute,] test name, test args.
Value select(const Value& seq, std::vector<Value>& args, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attribute;
  if (by_attr) {
    if (args.empty() || !args[0].is_string()) fail("selectattr/rejectattr need an attribute name");
    attribute = *args[0].s;
    k = 1;
  }
  std::string test;
  if (k < args.size()) {
    if (!args[k].is_string()) fail("the test name must be a string");
    test = *args[k].s;
  }
  std::vector<Value> targs(args.begin() + std::min(args.size(), k + 1), args.end());
  Array out;
  for (const Value& v : iterate(seq)) {
    const Value x = by_attr ? attr_path(v, attribute) : v;
    const bool ok = test.empty() ? truthy(x) : apply_test(test, x, targs);
    if (ok == keep) out.push_back(v);
  }
  return Value::array(std::move(out));
}

Value tojson(const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  check_args("tojson", args, kwargs, 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  DumpOptions o;
  if (const Value* x = arg(args, kwargs, 0, "ensure_ascii")) o.ensure_ascii = truthy(*x);
  if (const Value* x = arg(args, kwargs, 1, "indent"); x && !x->is_none()) {
    if (x->is_string()) fail("tojson: a string indent is not supported");
    o.indent = int(bounded_count(x->as_int(), 4096, "tojson: indent"));
    o.item_sep = ",";
  }
  if (const Value* x = arg(args, kwargs, 2, "separators"); x && !x->is_none()) {
    if (!x->is_array() || x->a->size() != 2 || !(*x->a)[0].is_string() || !(*x->a)[1].is_string())
      fail("tojson: separators must be a (item_separator, key_separator) pair of strings");
    o.item_sep = *(*x->a)[0].s;
    o.key_sep = *(*x->a)[1].s;
  }
  if (const Value* x = arg(args, kwargs, 3, "sort_keys")) o.sort_keys = truthy(*x);
  std::string out;
  json_dumps(v, o, out);
  return Value::string(std::move(out));
}

}  // namespace

Value apply_filter(const std::string& n, const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  const Value none = Value::none();
  auto str_of = [&] { return to_str(v); };
  if (n == "tojson") return tojson(v, args, kwargs);
  if (n == "default" || n == "d") {
    const Value* def = arg(args, kwargs, 0, "default_value");
    const Value* boolean = arg(args, kwargs, 1, "boolean");
    const bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (def ? *def : Value::string("")) : v;
  }
  if (n == "length" || n == "count") {
    if (v.is_string()) return Value::integer(int64_t(utf8_length(*v.s)));
    if (v.is_array()) return Value::integer(int64_t(v.a->size()));
    if (v.is_object()) return Value::integer(int64_t(v.o->items.size()));
    if (v.is_undefined()) return Value::integer(0);
    fail(std::string("object of type '") + kind_name(v) + "' has no len()");
  }
  if (n == "trim") {
    const Value* c = arg(args, kwargs, 0, "chars");
    return Value::string(py_strip(str_of(), c ? *c : none, true, true));
  }
  if (n == "upper") return Value::string(py_upper(str_of()));
  if (n == "lower") return Value::string(py_lower(str_of()));
  if (n == "capitalize") return Value::string(py_capitalize(str_of()));
  if (n == "title") return Value::string(jinja_title(str_of()));
  if (n == "string" || n == "safe") return v.is_string() ? v : Value::string(str_of());
  if (n == "e" || n == "escape" || n == "forceescape") return Value::string(html_escape(str_of()));
  if (n == "replace") {
    bool found;
    Value s = Value::string(str_of());
    return string_method(*s.s, "replace", args, kwargs, found);
  }
  if (n == "join") {
    const Value* d = arg(args, kwargs, 0, "d");
    const Value* attribute = arg(args, kwargs, 1, "attribute");
    std::string sep = d ? to_str(*d) : "", r;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first) r += sep;
      first = false;
      append_str(attribute ? attr_path(x, to_str(*attribute)) : x, r);
    }
    return Value::string(std::move(r));
  }
  if (n == "list") return Value::array(iterate(v));
  if (n == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) fail("items filter needs a mapping");
    bool found;
    return call_method(v, "items", args, kwargs, found);
  }
  if (n == "dictsort") {
    if (!v.is_object()) fail("dictsort needs a mapping");
    const Value* cs = arg(args, kwargs, 0, "case_sensitive");
    const Value* by = arg(args, kwargs, 1, "by");
    const Value* rev = arg(args, kwargs, 2, "reverse");
    bool found;
    std::vector<Value> no_args;
    Kwargs no_kw;
    Value items = call_method(v, "items", no_args, no_kw, found);
    const Value idx = Value::string(by && by->is_string() && *by->s == "value" ? "1" : "0");
    return Value::array(sorted(*items.a, rev && truthy(*rev), cs && truthy(*cs), &idx));
  }
  if (n == "first" || n == "last") {
    if (v.is_array()) return v.a->empty() ? Value::undefined() : n == "first" ? v.a->front() : v.a->back();
    std::vector<Value> it = iterate(v);
    return it.empty() ? Value::undefined() : n == "first" ? it.front() : it.back();
  }
  if (n == "reverse") {
    if (v.is_string()) return slice(v, none, none, Value::integer(-1));
    std::vector<Value> it = iterate(v);
    std::reverse(it.begin(), it.end());
    return Value::array(std::move(it));
  }
  if (n == "sort") {
    check_args("sort", args, kwargs, 3, {"reverse", "case_sensitive", "attribute"});
    const Value* rev = arg(args, kwargs, 0, "reverse");
    const Value* cs = arg(args, kwargs, 1, "case_sensitive");
    return Value::array(
        sorted(iterate(v), rev && truthy(*rev), cs && truthy(*cs), arg(args, kwargs, 2, "attribute")));
  }
  if (n == "unique") {
    Array out;
    for (const Value& x : iterate(v))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value::array(std::move(out));
  }
  if (n == "min" || n == "max") {
    std::vector<Value> it = sorted(iterate(v), false, false, arg(args, kwargs, 1, "attribute"));
    if (it.empty()) return Value::undefined();
    return n == "min" ? it.front() : it.back();
  }
  if (n == "sum") {
    const Value* attribute = arg(args, kwargs, 0, "attribute");
    const Value* start = arg(args, kwargs, 1, "start");
    Value acc = start ? *start : Value::integer(0);
    for (const Value& x : iterate(v)) {
      const Value y = attribute ? attr_path(x, to_str(*attribute)) : x;
      if (!acc.is_number() || !y.is_number()) fail("sum: unsupported operand types");
      acc = acc.kind == Kind::floating || y.kind == Kind::floating
                ? Value::floating(acc.as_double() + y.as_double())
                : Value::integer(checked_add(acc.as_int(), y.as_int()));
    }
    return acc;
  }
  if (n == "map") {
    Array out;
    const Value* attribute = nullptr;
    for (auto& [k, x] : kwargs)
      if (k == "attribute") attribute = &x;
    if (attribute) {
      const Value* def = nullptr;
      for (auto& [k, x] : kwargs)
        if (k == "default") def = &x;
      for (const Value& x : iterate(v)) {
        Value y = attr_path(x, to_str(*attribute));
        out.push_back(y.is_undefined() && def ? *def : y);
      }
      return Value::array(std::move(out));
    }
    if (args.empty() || !args[0].is_string()) fail("map needs a filter name or attribute=");
    const std::string f = *args[0].s;
    std::vector<Value> rest(args.begin() + 1, args.end());
    for (const Value& x : iterate(v)) {
      std::vector<Value> a = rest;
      out.push_back(apply_filter(f, x, a, kwargs));
    }
    return Value::array(std::move(out));
  }
  if (n == "select" || n == "reject") return select(v, args, false, n == "select");
  if (n == "selectattr" || n == "rejectattr") return select(v, args, true, n == "selectattr");
  if (n == "attr") {
    const Value* a = arg(args, kwargs, 0, "name");
    return a ? get_attr(v, to_str(*a)) : Value::undefined();
  }
  if (n == "int") return to_number(v, false, arg(args, kwargs, 0, "default"));
  if (n == "float") return to_number(v, true, arg(args, kwargs, 0, "default"));
  if (n == "abs") {
    if (v.kind == Kind::floating) return Value::floating(std::fabs(v.f));
    if (v.is_number()) return Value::integer(v.as_int() < 0 ? checked_neg(v.as_int()) : v.as_int());
    fail("bad operand type for abs()");
  }
  if (n == "round") {
    const Value* p = arg(args, kwargs, 0, "precision");
    const Value* m = arg(args, kwargs, 1, "method");
    const int64_t digits = p ? p->as_int() : 0;
    const std::string method = m ? to_str(*m) : "common";
    if (method == "common" && digits >= 0 && digits < 20) {
      // Python's round(): the exact binary value rounded half to even, which printf does too.
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.*f", int(digits), v.as_double());
      return Value::floating(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, double(digits));
    const double x = v.as_double() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : round_half_away(x);
    return Value::floating(r / scale);
  }
  if (n == "indent") {
    const Value* w = arg(args, kwargs, 0, "width");
    const Value* first = arg(args, kwargs, 1, "first");
    const Value* blank = arg(args, kwargs, 2, "blank");
    const std::string pad =
        w && w->is_string()
            ? *w->s
            : std::string(bounded_count(w ? w->as_int() : 4, Value::kMaxString, "indent: width"), ' ');
    const std::string s = str_of();
    std::string r;
    size_t b = 0;
    bool first_line = true;
    while (b <= s.size()) {
      size_t e = s.find('\n', b);
      const std::string line = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!first_line) r += '\n';
      if (first_line ? (first && truthy(*first)) : (!line.empty() || (blank && truthy(*blank)))) {
        if (r.size() + pad.size() + line.size() > Value::kMaxString) fail("indent: result too large");
        r += pad;
      }
      r += line;
      first_line = false;
      if (e == std::string::npos) break;
      b = e + 1;
    }
    return Value::string(std::move(r));
  }
  if (n == "format") {
    if (!v.is_string()) fail("format filter needs a format string");
    return Value::string(py_percent_format(*v.s, args));
  }
  if (n == "wordcount") {
    bool found;
    std::vector<Value> no;
    Kwargs nk;
    return Value::integer(int64_t(string_method(str_of(), "split", no, nk, found).a->size()));
  }
  fail("no filter named '" + n + "'");
}

bool has_filter(const std::string& n) {
  static const char* names[] = {"tojson", "default",    "d",           "length",    "count",   "trim",
                                "upper",  "lower",      "capitalize",  "title",     "string",  "safe",
                                "e",      "escape",     "forceescape", "replace",   "join",    "list",
                                "items",  "dictsort",   "first",       "last",      "reverse", "sort",
                                "unique", "min",        "max",         "sum",       "map",     "select",
                                "reject", "selectattr", "rejectattr",  "attr",      "int",     "float",
                                "abs",    "round",      "indent",      "wordcount", "format"};
  return std::any_of(std::begin(names), std::end(names), [&](const char* x) { return n == x; });
}

}  // namespace kiln::tmpl
