// The parsed template: expression and statement trees, owned by Template. Nodes are plain data; the
// evaluator (eval.cpp) gives them meaning. `line` is the source line, for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace kiln::tmpl {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

enum class EK : uint8_t {
  literal,  // lit
  name,     // name
  list,     // args
  tuple,    // args
  dict,     // kwargs-like pairs in items
  getattr,  // a.name
  getitem,  // a[b]
  slice,    // a[b:c:d] (absent parts are null)
  call,     // a(args, kwargs)
  filter,   // a | name(args, kwargs); a is null in a {% filter %} block
  test,     // a is [not] name(args)
  unary,    // op a   (op: "-", "+", "not")
  binary,   // a op b (op: + - * / // % ** ~ and or)
  compare,  // a op0 args[0] op1 args[1] ... (ops: == != < > <= >= in notin)
  cond,     // b if a else c
};

// Operators, resolved at parse time (the evaluator switches on them instead of comparing strings).
enum class Op : uint8_t {
  none,
  add,
  sub,
  mul,
  div,
  floordiv,
  mod,
  pow,
  concat,
  and_,
  or_,
  not_,
  neg,
  pos,
  eq,
  ne,
  lt,
  gt,
  le,
  ge,
  in,
  notin
};
Op op_from(const std::string& s);

struct Expr {
  EK kind;
  Op op = Op::none;
  int height = 1;  // of this subtree (the parser bounds it)  // unary / binary
  int line = 0;
  Value lit;
  std::string name;         // name / attribute / filter / test / operator
  ExprP a, b, c, d;         // operands
  std::vector<ExprP> args;  // positional arguments, list/tuple items, compare operands
  std::vector<Op> ops;      // compare operators
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::pair<ExprP, ExprP>> items;  // dict literal
  bool negated = false;                        // `is not`
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

enum class SK : uint8_t {
  text,
  output,
  if_,
  for_,
  set,
  set_block,
  macro,
  call_block,
  filter_block,
  break_,
  continue_,
  scope
};

struct Stmt {
  SK kind;
  int line = 0;
  std::string text;                  // text
  ExprP expr;                        // output, set value, for iterable, if condition chain head
  std::vector<std::string> targets;  // for / set names (tuple unpacking), macro name is targets[0]
  std::string attr;                  // set ns.attr = ...
  std::vector<std::pair<ExprP, Body>> branches;  // if / elif ... (else has a null condition)
  ExprP cond;                                    // for ... if cond
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro parameters with defaults (null: none)
  std::vector<ExprP> filters;  // set_block / filter_block filter chain (EK::filter, a = null)
};

}  // namespace kiln::tmpl
