// Jinja parser: tokens (lexer.h) -> statement tree (ast.h), with Jinja 3's operator precedence
// (inline if < or < and < not < comparisons < + - < ~ < * / // % < ** < unary - < filters and tests <
// postfix . [] ()). Tags: if/elif/else, for (else, `if` filter), set (also block set and ns.attr),
// macro, call, filter, with, break/continue (loopcontrols), generation (transformers' AssistantTracker),
// raw (in the lexer).
//
// Contract: parse() returns the top-level body or raises TemplateError "template syntax error (line N):
// ..." for anything Jinja would reject at compile time, and for the few tags kiln does not implement
// (extends, block, include, import: never used by chat templates).
#pragma once

#include <string_view>

#include "template/ast.h"

namespace kiln::tmpl {

Body parse(std::string_view source);

}  // namespace kiln::tmpl
