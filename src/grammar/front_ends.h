// Front ends: each turns its source text into the grammar IR (grammar.h). Contracts in README.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "kiln/grammar.h"

namespace kiln::grammar {

Grammar json_schema_grammar(std::string_view schema_json, const CompileOptions& options);
Grammar any_json_grammar(const CompileOptions& options);
Grammar regex_grammar(std::string_view pattern);
Grammar ebnf_grammar(std::string_view text);
// GrammarKind::tool_calls (tool_calls.cpp): the spec is JSON, README.md "Front ends".
Grammar tool_call_grammar(std::string_view spec_json, const CompileOptions& options);

// JSON lexemes shared by the JSON front ends (json_lexemes.cpp).
Re json_ws_re(int max_whitespace);
Re json_string_re(int min_chars, int max_chars);    // a whole JSON string literal, quotes included
Re json_string_char_re();                           // one character of a JSON string, escaped or not
Dfa json_string_dfa(int min_chars, int max_chars);  // json_string_re(min, max), built faster
Re json_number_re(bool integer);
// Integers / numbers within bounds; nullopt bounds are open. Throws UnsupportedKeyword(keyword) for bounds
// it cannot express (non-integer bounds of numbers, magnitudes past 1e18).
struct NumberBounds {
  bool has_min = false, has_max = false;
  double min = 0, max = 0;
  std::string min_text, max_text;  // the bounds as the schema wrote them (decimal digits)
  bool min_exclusive = false, max_exclusive = false;
};
Dfa json_bounded_number_dfa(bool integer, const NumberBounds& b);
// The format's regex (inside the quotes, JSON-escaped text), or throws UnsupportedKeyword("format: NAME").
Re json_format_re(std::string_view format);

}  // namespace kiln::grammar
