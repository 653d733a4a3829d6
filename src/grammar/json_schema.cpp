// JSON Schema -> grammar. Objects keep the schema's property order (declared properties in the order the
// schema lists them, then additional ones); see README.md for the keyword list and the limits.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "grammar/front_ends.h"
#include "kiln/error.h"

namespace kiln::grammar {

namespace {

using json = nlohmann::ordered_json;

const std::set<std::string> kSupported = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum"};
// JSON Schema assertions the engine cannot enforce: refused by name. Keywords outside the vocabulary are
// annotations (the spec ignores them) and pass.
const std::set<std::string> kUnsupported = {"not",
                                            "if",
                                            "then",
                                            "else",
                                            "patternProperties",
                                            "propertyNames",
                                            "minProperties",
                                            "maxProperties",
                                            "dependencies",
                                            "dependentRequired",
                                            "dependentSchemas",
                                            "uniqueItems",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "multipleOf",
                                            "unevaluatedProperties",
                                            "unevaluatedItems",
                                            "$dynamicRef",
                                            "$recursiveRef",
                                            "contentSchema",
                                            "$data"};
const std::set<std::string> kAnnotations = {
    "title",   "description", "$schema",  "$id",       "id",      "$comment",         "examples",
    "default", "deprecated",  "readOnly", "writeOnly", "$anchor", "contentMediaType", "contentEncoding"};
constexpr int kMaxSchemaDepth = 128;
constexpr int64_t kMaxUnroll = 2000;

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const CompileOptions& o) : root_(root), opt_(o) {
    ws_ = b_.lexeme(json_ws_re(o.max_whitespace));
  }

  // The document: whitespace may surround the value, as JSON allows.
  Grammar run() {
    const uint32_t value = rule_for(root_, "value", 0);
    const uint32_t doc = b_.new_rule("root");
    b_.add_alt(doc, {ws_, b_.call(value), ws_});
    return b_.finish(doc);
  }

 private:
  const json& root_;
  CompileOptions opt_;
  GrammarBuilder b_;
  Element ws_;
  std::map<std::string, uint32_t> refs_;
  int64_t any_rule_ = -1;

  std::map<std::string, Element> memo_;  // lexemes by what they were built from: schemas repeat them

  Element lit(const std::string& s) {
    return memo("lit:" + s, [&] { return compile_re(re_bytes(s)); });
  }
  template <typename Make>
  Element memo(const std::string& key, Make make) {
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const Element e = b_.lexeme(make());
    memo_.emplace(key, e);
    return e;
  }

  const json& resolve(const std::string& ref) {
    KILN_CHECK(!ref.empty() && ref[0] == '#', "json schema: only local $ref (#...) is supported, got ", ref);
    if (ref == "#") return root_;
    std::string ptr;
    for (size_t i = 1; i < ref.size(); ++i) {  // percent-decoding
      if (ref[i] == '%' && i + 2 < ref.size() && std::isxdigit(uint8_t(ref[i + 1])) &&
          std::isxdigit(uint8_t(ref[i + 2]))) {
        auto hex = [](char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; };
        ptr += char(hex(ref[i + 1]) * 16 + hex(ref[i + 2]));
        i += 2;
      } else {
        ptr += ref[i];
      }
    }
    try {
      return root_.at(json::json_pointer(ptr));
    } catch (const json::exception&) {
      KILN_FAIL("json schema: $ref ", ref, " does not resolve");
    }
  }

  // Refuses (or, lenient, ignores) keywords the engine cannot enforce.
  void check_keywords(const json& s) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kSupported.count(k) || kAnnotations.count(k) || !kUnsupported.count(k)) continue;
      if (k == "uniqueItems" && it.value() == false) continue;
      if ((k == "minProperties" && it.value() == 0) || k == "$recursiveAnchor") continue;
      if (!opt_.lenient) throw UnsupportedKeyword(k);
    }
  }

  // allOf and sibling keywords beside anyOf: a conservative merge of object-level keywords.
  json merge(json a, const json& b, int depth) {
    KILN_CHECK(depth < kMaxSchemaDepth, "json schema: nesting deeper than ", kMaxSchemaDepth, " (the limit)");
    if (b.is_boolean()) {
      if (b.get<bool>()) return a;
      return json(false);
    }
    if (a.is_boolean()) return a.get<bool>() ? b : a;
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (!a.contains(k) || kAnnotations.count(k) || k == "$defs" || k == "definitions") {
        if (!a.contains(k)) a[k] = v;
        continue;
      }
      json& x = a[k];
      if (x == v) continue;
      if (k == "properties") {
        for (auto p = v.begin(); p != v.end(); ++p)
          x[p.key()] = x.contains(p.key()) ? json{{"allOf", {x[p.key()], p.value()}}} : p.value();
      } else if (k == "required") {
        for (const auto& r : v)
          if (std::find(x.begin(), x.end(), r) == x.end()) x.push_back(r);
      } else if (k == "minItems" || k == "minLength" || k == "minimum" || k == "exclusiveMinimum") {
        if (v.is_number() && x.is_number() && v > x) x = v;
      } else if (k == "maxItems" || k == "maxLength" || k == "maximum" || k == "exclusiveMaximum") {
        if (v.is_number() && x.is_number() && v < x) x = v;
      } else if (k == "type") {
        json xs = x.is_array() ? x : json::array({x}), vs = v.is_array() ? v : json::array({v});
        json both = json::array();
        for (const auto& t : xs)
          for (const auto& u : vs)
            if (t == u || (t == "number" && u == "integer") || (t == "integer" && u == "number"))
              both.push_back(t == "integer" || u == "integer" ? json("integer") : t);
        x = both;
      } else if (k == "additionalProperties" || k == "items") {
        x = json{{"allOf", {x, v}}};
      } else {
        throw UnsupportedKeyword("allOf");
      }
    }
    return a;
  }

  json flatten_all_of(const json& s, int depth) {
    json base = s;
    base.erase("allOf");
    for (const auto& sub : s["allOf"]) {
      json part = sub;
      if (part.is_object() && part.contains("$ref")) part = resolve(part["$ref"].get<std::string>());
      if (part.is_object() && part.contains("allOf")) part = flatten_all_of(part, depth + 1);
      base = merge(std::move(base), part, depth + 1);
    }
    return base;
  }

  uint32_t any_value() {
    if (any_rule_ < 0) {
      any_rule_ = b_.new_rule("any");
      const uint32_t r = uint32_t(any_rule_);
      add_any(r);
    }
    return uint32_t(any_rule_);
  }

  void add_any(uint32_t r) {
    const Element str = memo("string{}", [] { return json_string_dfa(0, -1); });
    b_.add_alt(r, {str});
    b_.add_alt(r, {b_.lexeme(json_number_re(false))});
    b_.add_alt(r, {b_.lexeme(parse_regex("true|false|null", false))});
    // Objects and arrays: ws "," ws item repeated through a tail call.
    const uint32_t mrest = b_.new_rule("any_members"), irest = b_.new_rule("any_items");
    const std::vector<Element> member{str, ws_, lit(":"), ws_, b_.call(r)};
    std::vector<Element> m1{ws_, lit(","), ws_};
    m1.insert(m1.end(), member.begin(), member.end());
    m1.push_back(b_.call(mrest));
    b_.add_alt(mrest, m1);
    b_.add_alt(mrest, {});
    b_.add_alt(irest, {ws_, lit(","), ws_, b_.call(r), b_.call(irest)});
    b_.add_alt(irest, {});
    b_.add_alt(r, {lit("{"), ws_, lit("}")});
    std::vector<Element> obj{lit("{"), ws_};
    obj.insert(obj.end(), member.begin(), member.end());
    obj.insert(obj.end(), {b_.call(mrest), ws_, lit("}")});
    b_.add_alt(r, obj);
    b_.add_alt(r, {lit("["), ws_, lit("]")});
    b_.add_alt(r, {lit("["), ws_, b_.call(r), b_.call(irest), ws_, lit("]")});
  }

  // A constant value: scalars as their JSON text (integers also with a zero fraction), containers with
  // whitespace allowed between tokens.
  void add_const(uint32_t r, const json& v) { b_.add_alt(r, const_elems(v)); }
  std::vector<Element> const_elems(const json& v) {
    if (v.is_object() || v.is_array()) {
      std::vector<Element> seq{lit(v.is_object() ? "{" : "["), ws_};
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) seq.insert(seq.end(), {ws_, lit(","), ws_});
        first = false;
        if (v.is_object()) seq.insert(seq.end(), {lit(json(it.key()).dump()), ws_, lit(":"), ws_});
        auto sub = const_elems(it.value());
        seq.insert(seq.end(), sub.begin(), sub.end());
      }
      seq.insert(seq.end(), {ws_, lit(v.is_object() ? "}" : "]")});
      return seq;
    }
    return {b_.lexeme(scalar_re(v))};
  }
  static Re scalar_re(const json& v) {
    const std::string text = v.dump();
    if (v.is_number_integer() || v.is_number_unsigned() ||
        (v.is_number_float() && std::isfinite(v.get<double>()) &&
         v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 1e15)) {
      const std::string whole = v.is_number_float() ? json(int64_t(v.get<double>())).dump() : text;
      return re_concat({re_bytes(whole), parse_regex("(\\.0+)?", false)});
    }
    return re_bytes(text);
  }

  static bool is_type(const json& types, const char* t) {
    return std::find(types.begin(), types.end(), t) != types.end();
  }

  uint32_t rule_for(const json& s, const std::string& name, int depth) {
    KILN_CHECK(depth < kMaxSchemaDepth, "json schema: nesting deeper than ", kMaxSchemaDepth, " (the limit)");
    const uint32_t r = b_.new_rule(name);
    fill(r, s, name, depth);
    return r;
  }

  uint32_t ref_rule(const std::string& ref, int depth) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return it->second;
    const uint32_t r = b_.new_rule("ref " + ref);
    refs_[ref] = r;  // before filling: recursion calls the rule being built
    fill(r, resolve(ref), "ref " + ref, depth + 1);
    return r;
  }

  void fill(uint32_t r, const json& s, const std::string& name, int depth) {
    if (s.is_boolean()) {
      if (s.get<bool>()) b_.add_alt(r, {b_.call(any_value())});
      return;  // false: no alternative
    }
    KILN_CHECK(s.is_object(), "json schema: a schema must be an object or a boolean at ", name);
    check_keywords(s);
    if (s.contains("$ref")) {  // draft 4-7: $ref replaces its siblings
      b_.add_alt(r, {b_.call(ref_rule(s["$ref"].get<std::string>(), depth))});
      return;
    }
    if (s.contains("allOf")) {
      KILN_CHECK(s["allOf"].is_array(), "json schema: allOf must be an array at ", name);
      fill(r, flatten_all_of(s, depth), name, depth + 1);
      return;
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      KILN_CHECK(s[k].is_array() && !s[k].empty(), "json schema: ", k, " must be a non-empty array at ",
                 name);
      json rest = s;
      rest.erase("anyOf"), rest.erase("oneOf");
      bool plain = true;
      for (auto it = rest.begin(); it != rest.end(); ++it)
        if (!kAnnotations.count(it.key()) && it.key() != "$defs" && it.key() != "definitions") plain = false;
      size_t i = 0;
      for (const auto& sub : s[k]) {
        json branch = sub;
        if (!plain) {
          if (branch.is_object() && branch.contains("$ref"))
            branch = resolve(branch["$ref"].get<std::string>());
          branch = merge(rest, branch, depth + 1);
        }
        b_.add_alt(r, {b_.call(rule_for(branch, name + "/" + k + std::to_string(i++), depth + 1))});
      }
      return;
    }
    if (s.contains("const")) {
      add_const(r, s["const"]);
      return;
    }
    if (s.contains("enum")) {
      KILN_CHECK(s["enum"].is_array(), "json schema: enum must be an array at ", name);
      std::vector<Re> scalars;
      for (const auto& v : s["enum"]) {
        if (v.is_object() || v.is_array())
          add_const(r, v);
        else
          scalars.push_back(scalar_re(v));
      }
      if (!scalars.empty()) b_.add_alt(r, {b_.lexeme(re_alt(std::move(scalars)))});
      return;
    }
    json types = json::array({"null", "boolean", "object", "array", "number", "string"});
    if (s.contains("type")) {
      types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
      for (const auto& t : types)
        KILN_CHECK(t.is_string(), "json schema: type must be a string or a list at ", name);
      if (is_type(types, "number") && is_type(types, "integer"))
        types.erase(std::find(types.begin(), types.end(), "integer"));
    }
    for (const auto& t : types) {
      const std::string ty = t.get<std::string>();
      if (ty == "null") {
        b_.add_alt(r, {lit("null")});
      } else if (ty == "boolean") {
        b_.add_alt(r, {b_.lexeme(parse_regex("true|false", false))});
      } else if (ty == "integer" || ty == "number") {
        json bounds = json::object();
        for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
          if (s.contains(k)) bounds[k] = s[k];
        b_.add_alt(r, {memo(ty + bounds.dump(), [&] { return number_dfa(s, ty == "integer"); })});
      } else if (ty == "string") {
        json key = json::object();
        for (const char* k : {"minLength", "maxLength", "pattern", "format"})
          if (s.contains(k)) key[k] = s[k];
        b_.add_alt(r, {memo("string" + key.dump(), [&] { return string_dfa(s); })});
      } else if (ty == "array") {
        add_array(r, s, name, depth);
      } else if (ty == "object") {
        add_object(r, s, name, depth);
      } else {
        KILN_FAIL("json schema: unknown type `", ty, "` at ", name);
      }
    }
  }

  Dfa number_dfa(const json& s, bool integer) {
    NumberBounds nb;
    auto num = [&](const char* k) {
      KILN_CHECK(s[k].is_number(), "json schema: ", k, " must be a number");
      return s[k].get<double>();
    };
    if (s.contains("minimum")) nb.has_min = true, nb.min = num("minimum"), nb.min_text = s["minimum"].dump();
    if (s.contains("maximum")) nb.has_max = true, nb.max = num("maximum"), nb.max_text = s["maximum"].dump();
    if (s.contains("exclusiveMinimum")) {
      if (s["exclusiveMinimum"].is_boolean()) {  // draft 4: a flag on minimum
        nb.min_exclusive = s["exclusiveMinimum"].get<bool>();
      } else {
        const double v = num("exclusiveMinimum");
        if (!nb.has_min || v >= nb.min)
          nb.has_min = true, nb.min = v, nb.min_exclusive = true, nb.min_text = s["exclusiveMinimum"].dump();
      }
    }
    if (s.contains("exclusiveMaximum")) {
      if (s["exclusiveMaximum"].is_boolean()) {
        nb.max_exclusive = s["exclusiveMaximum"].get<bool>();
      } else {
        const double v = num("exclusiveMaximum");
        if (!nb.has_max || v <= nb.max)
          nb.has_max = true, nb.max = v, nb.max_exclusive = true, nb.max_text = s["exclusiveMaximum"].dump();
      }
    }
    try {
      return json_bounded_number_dfa(integer, nb);
    } catch (const UnsupportedKeyword&) {
      if (!opt_.lenient) throw;
      return compile_re(json_number_re(integer));
    }
  }

  int64_t count(const json& s, const char* k, int64_t def) {
    if (!s.contains(k)) return def;
    KILN_CHECK(s[k].is_number_integer() && s[k].get<int64_t>() >= 0, "json schema: ", k,
               " must be a non-negative integer");
    return s[k].get<int64_t>();
  }

  Dfa string_dfa(const json& s) {
    const int64_t lo = count(s, "minLength", 0), hi = count(s, "maxLength", -1);
    KILN_CHECK(lo <= kMaxUnroll && hi <= kMaxUnroll, "json schema: minLength/maxLength above ", kMaxUnroll,
               " (the limit)");
    Dfa d = json_string_dfa(int(lo), int(hi));
    auto quoted = [](Re inner) { return re_concat({re_bytes("\""), std::move(inner), re_bytes("\"")}); };
    if (s.contains("pattern")) {
      KILN_CHECK(s["pattern"].is_string(), "json schema: pattern must be a string");
      d = dfa_intersection(d, compile_re(quoted(parse_regex(s["pattern"].get<std::string>(), true)), true));
    }
    if (s.contains("format")) {
      KILN_CHECK(s["format"].is_string(), "json schema: format must be a string");
      try {
        d = dfa_intersection(d, compile_re(quoted(json_format_re(s["format"].get<std::string>())), true));
      } catch (const UnsupportedKeyword&) {
        if (!opt_.lenient) throw;
      }
    }
    return d;
  }

  void add_array(uint32_t r, const json& s, const std::string& name, int depth) {
    std::vector<json> prefix;
    json rest = true;
    if (s.contains("prefixItems")) {
      for (const auto& p : s["prefixItems"]) prefix.push_back(p);
      if (s.contains("items")) rest = s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {  // draft 4-2019 tuple form
      for (const auto& p : s["items"]) prefix.push_back(p);
      if (s.contains("additionalItems")) rest = s["additionalItems"];
    } else if (s.contains("items")) {
      rest = s["items"];
    }
    const int64_t lo = count(s, "minItems", 0);
    int64_t hi = count(s, "maxItems", -1);
    if (rest == false) hi = hi < 0 ? int64_t(prefix.size()) : std::min<int64_t>(hi, int64_t(prefix.size()));
    if (hi >= 0 && hi < lo) return;  // no array satisfies it
    KILN_CHECK(lo <= kMaxUnroll && int64_t(prefix.size()) <= kMaxUnroll && hi <= kMaxUnroll,
               "json schema: minItems/maxItems/prefixItems above ", kMaxUnroll, " (the limit)");
    std::vector<uint32_t> item_rules;
    int64_t rest_rule = -1;
    auto item = [&](int64_t j) -> Element {
      if (j < int64_t(prefix.size())) {
        while (int64_t(item_rules.size()) <= j)
          item_rules.push_back(
              rule_for(prefix[item_rules.size()], name + "/" + std::to_string(item_rules.size()), depth + 1));
        return b_.call(item_rules[size_t(j)]);
      }
      if (rest_rule < 0) rest_rule = rule_for(rest, name + "/items", depth + 1);
      return b_.call(uint32_t(rest_rule));
    };
    // tail(j): the items after j have been written. A self-loop once past the prefix and minItems.
    const int64_t loop_from = std::max<int64_t>(lo, int64_t(prefix.size()));
    std::map<int64_t, uint32_t> tails;
    std::function<uint32_t(int64_t)> tail = [&](int64_t j) -> uint32_t {
      const int64_t key = (hi < 0 && j >= loop_from) ? loop_from : j;
      auto it = tails.find(key);
      if (it != tails.end()) return it->second;
      const uint32_t t = b_.new_rule(name + "/tail" + std::to_string(key));
      tails[key] = t;
      if (key >= lo) b_.add_alt(t, {});
      if (hi < 0 || key < hi) b_.add_alt(t, {ws_, lit(","), ws_, item(key), b_.call(tail(key + 1))});
      return t;
    };
    if (lo == 0) b_.add_alt(r, {lit("["), ws_, lit("]")});
    if (hi != 0) b_.add_alt(r, {lit("["), ws_, item(0), b_.call(tail(1)), ws_, lit("]")});
  }

  void add_object(uint32_t r, const json& s, const std::string& name, int depth) {
    struct Prop {
      std::string key;
      json schema;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> req;
    if (s.contains("required")) {
      KILN_CHECK(s["required"].is_array(), "json schema: required must be an array at ", name);
      for (const auto& k : s["required"]) req.insert(k.get<std::string>());
    }
    if (s.contains("properties")) {
      KILN_CHECK(s["properties"].is_object(), "json schema: properties must be an object at ", name);
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it)
        props.push_back({it.key(), it.value(), req.count(it.key()) > 0});
    }
    for (const auto& k : s.value("required", json::array())) {
      const std::string key = k.get<std::string>();
      if (std::none_of(props.begin(), props.end(), [&](const Prop& p) { return p.key == key; }))
        props.push_back({key, json(true), true});
    }
    json addl = s.contains("additionalProperties") ? s["additionalProperties"] : json(!opt_.strict);
    const size_t n = props.size();
    std::vector<Element> kv_addl;
    if (addl != false) {
      std::vector<Re> names;
      for (const auto& p : props) names.push_back(re_bytes(json(p.key).dump()));
      const bool closed_names = !names.empty();
      Dfa keys = json_string_dfa(0, -1);
      if (closed_names) keys = dfa_difference(keys, compile_re(re_alt(std::move(names))));
      kv_addl = {!closed_names ? memo("string{}", [&] { return keys; }) : b_.lexeme(std::move(keys)), ws_,
                 lit(":"), ws_, b_.call(rule_for(addl, name + "/additional", depth + 1))};
    }
    std::vector<std::vector<Element>> pv(n);
    for (size_t i = 0; i < n; ++i)
      pv[i] = {lit(json(props[i].key).dump()), ws_, lit(":"), ws_,
               b_.call(rule_for(props[i].schema, name + "/" + props[i].key, depth + 1))};
    // after[i]: properties i.. may follow, at least one written; start[i]: none written yet (non-empty).
    std::vector<uint32_t> after(n + 1), start(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      after[i] = b_.new_rule(name + "/after" + std::to_string(i));
      start[i] = b_.new_rule(name + "/start" + std::to_string(i));
    }
    b_.add_alt(after[n], {});
    if (!kv_addl.empty()) {
      std::vector<Element> a{ws_, lit(","), ws_};
      a.insert(a.end(), kv_addl.begin(), kv_addl.end());
      a.push_back(b_.call(after[n]));
      b_.add_alt(after[n], a);
      std::vector<Element> st = kv_addl;
      st.push_back(b_.call(after[n]));
      b_.add_alt(start[n], st);
    }
    for (size_t i = n; i-- > 0;) {
      std::vector<Element> a{ws_, lit(","), ws_};
      a.insert(a.end(), pv[i].begin(), pv[i].end());
      a.push_back(b_.call(after[i + 1]));
      b_.add_alt(after[i], a);
      std::vector<Element> st = pv[i];
      st.push_back(b_.call(after[i + 1]));
      b_.add_alt(start[i], st);
      if (!props[i].required) {
        b_.add_alt(after[i], {b_.call(after[i + 1])});
        b_.add_alt(start[i], {b_.call(start[i + 1])});
      }
    }
    if (req.empty() && std::none_of(props.begin(), props.end(), [](const Prop& p) { return p.required; }))
      b_.add_alt(r, {lit("{"), ws_, lit("}")});
    b_.add_alt(r, {lit("{"), ws_, b_.call(start[0]), ws_, lit("}")});
  }
};

}  // namespace

Grammar json_schema_grammar(std::string_view schema_json, const CompileOptions& options) {
  json root;
  try {
    root = json::parse(schema_json);
  } catch (const json::exception& e) {
    KILN_FAIL("json schema: not valid JSON: ", e.what());
  }
  SchemaCompiler c(root, options);
  try {
    return c.run();
  } catch (const json::exception& e) {  // a keyword's value of the wrong JSON type
    KILN_FAIL("json schema: ", e.what());
  }
}

Grammar any_json_grammar(const CompileOptions& options) {
  return json_schema_grammar("true", options);
}

Grammar regex_grammar(std::string_view pattern) {
  GrammarBuilder b;
  const uint32_t r = b.new_rule("root");
  b.add_alt(r, {b.lexeme(parse_regex(pattern, false))});
  return b.finish(r);
}

}  // namespace kiln::grammar
