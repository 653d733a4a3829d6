// Regular expressions over Unicode code points, compiled to byte-level automata (UTF-8).
//
// Dialect (the JSON-Schema `pattern` / ECMA-262 subset): literals (UTF-8), `.` (any code point but the line
// terminators \n \r U+2028 U+2029), classes `[...]` / `[^...]` with ranges, escapes \d \w \s \D \W \S \n \r
// \t \f \v \0 \xHH \uHHHH \u{H...} \cX and escaped punctuation, groups `( )` `(?: )` `(?<name> )`,
// alternation, quantifiers * + ? {m} {m,} {m,n} (a trailing lazy `?` is accepted and means the same: a
// grammar constrains the language, not the match), and anchors `^` `$` at the ends of the top-level
// alternatives. Refused with an error naming the construct: backreferences, lookaround, \b \B, \p{...}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/fsm.h"

namespace kiln::grammar {

// Code-point ranges, sorted and merged.
struct CharSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  void add(uint32_t lo, uint32_t hi);
  void add(const CharSet& o);
  CharSet complement() const;  // within [0, 0x10FFFF], surrogates excluded
  void normalize();
};

struct Re {
  enum class Kind { empty, chars, bytes, concat, alt, repeat };
  Kind kind = Kind::empty;
  CharSet set;            // chars
  std::string bytes;      // bytes: a literal byte string
  std::vector<Re> kids;   // concat, alt, repeat (one kid)
  int min = 0, max = -1;  // repeat; max -1 = unbounded
};

Re re_chars(CharSet s);
Re re_bytes(std::string_view b);
Re re_concat(std::vector<Re> kids);
Re re_alt(std::vector<Re> kids);
Re re_repeat(Re kid, int min, int max);
bool re_nullable(const Re& r);

// search: JSON-Schema semantics (the pattern may match anywhere unless anchored); else the whole text must
// match and anchors at the ends are no-ops. Throws kiln::Error naming the construct it cannot handle.
Re parse_regex(std::string_view pattern, bool search);

// Emits r into nfa. json_escape: the bytes are those of the text inside a JSON string literal, so `"`, `\`
// and control characters appear as their JSON escapes (one spelling each: \" \\ \b \f \n \r \t, \u00XX).
Frag emit_re(Nfa& nfa, const Re& r, bool json_escape);
Dfa compile_re(const Re& r, bool json_escape = false);

// Encodes a code point as UTF-8 (appends to out).
void append_utf8(uint32_t cp, std::string& out);

}  // namespace kiln::grammar
