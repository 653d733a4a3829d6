#include "tokenizer/pyjson.h"

#include <cmath>
#include <cstdio>

#include "template/value.h"

namespace kiln::tok {

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";  // json.dumps spells them so
  return tmpl::py_float_repr(x);                               // repr(float)'s digits and layout
}

namespace {

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          out += u;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace

void py_json_dumps(const nlohmann::ordered_json& v, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null:
      out += "null";
      break;
    case T::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case T::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case T::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case T::number_float:
      out += py_float_repr(v.get<double>());
      break;
    case T::string:
      dump_string(v.get_ref<const std::string&>(), out);
      break;
    case T::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        py_json_dumps(e, out);
      }
      out += ']';
      break;
    }
    case T::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(k, out);
        out += ": ";
        py_json_dumps(e, out);
      }
      out += '}';
      break;
    }
    default:
      out += "null";
      break;  // binary/discarded values never come from parsed JSON
  }
}

}  // namespace kiln::tok
