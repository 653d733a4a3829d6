// Python's json.dumps(x, ensure_ascii=False) byte for byte (what Hugging Face's `tojson` chat-template filter
// emits): ", " and ": " separators, keys in input order, floats as Python's repr, only '"', '\\' and control
// characters escaped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kiln::tok {

void py_json_dumps(const nlohmann::ordered_json& v, std::string& out);
std::string py_float_repr(double x);  // repr(float): shortest round-trip digits, Python's layout

}  // namespace kiln::tok
