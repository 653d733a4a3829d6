// Jinja lexer with transformers' settings: trim_blocks (the first newline after a block or comment tag is
// dropped), lstrip_blocks (spaces and tabs from the start of a line up to a block or comment tag are
// dropped), `-` on either side of a tag strips all whitespace on that side, `+` keeps it; one trailing
// newline of the source is dropped (keep_trailing_newline=False); \r\n and \r in text become \n.
//
// Contract: lex() returns text tokens and the tokens inside {{ }} / {% %} (comments and raw blocks are
// resolved here), ending with eof; every token carries its 1-based source line. Unterminated tags,
// strings and comments raise TemplateError naming the line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tmpl {

enum class Tok : uint8_t {
  text,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct Token {
  Tok type;
  std::string s;  // text, name, string value or operator
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

std::vector<Token> lex(std::string_view src);

}  // namespace kiln::tmpl
