// The Parser class shared by parser.cpp (statements) and parse_expr.cpp (expressions); internal to
// src/template. One Parser per parse() call; it owns the token vector and walks it once.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "template/ast.h"
#include "template/lexer.h"

namespace kiln::tmpl::detail {

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body run() {
    Body b = body({});
    if (cur().type != Tok::eof) err("unexpected tag '" + cur().s + "'");
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  [[noreturn]] void err(const std::string& msg) const {
    fail("template syntax error (line " + std::to_string(cur().line) + "): " + msg);
  }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().s == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().s == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++p_;
    return true;
  }
  std::string describe() const {
    switch (cur().type) {
      case Tok::eof:
        return "end of template";
      case Tok::var_end:
        return "'}}'";
      case Tok::block_end:
        return "'%}'";
      case Tok::text:
        return "text";
      default:
        return "'" + cur().s + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) err(std::string("expected '") + op + "', got " + describe());
  }
  std::string expect_name() {
    if (cur().type != Tok::name) err("expected a name, got " + describe());
    return t_[p_++].s;
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end) err("expected '%}', got " + describe());
    ++p_;
  }
  // Sets e's height and refuses trees taller than 256: evaluating and destroying them recurses.
  ExprP fin(ExprP e) {
    int h = 0;
    for (const ExprP* c : {&e->a, &e->b, &e->c, &e->d})
      if (*c) h = std::max(h, (*c)->height);
    for (const auto& x : e->args) h = std::max(h, x->height);
    for (const auto& kv : e->kwargs) h = std::max(h, kv.second->height);
    for (const auto& kv : e->items) h = std::max({h, kv.first->height, kv.second->height});
    e->height = h + 1;
    if (e->height > 256) err("expression nested too deeply");
    return e;
  }
  ExprP node(EK k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = cur().line;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `ends` (left unconsumed, the block_begin consumed) or eof.
  static std::string closing(std::initializer_list<const char*> ends) {  // the end tag, for messages
    for (const char* e : ends)
      if (std::string_view(e).starts_with("end")) return e;
    return ends.size() ? *ends.begin() : "";
  }

  Body body(std::initializer_list<const char*> ends);
  StmtP make(SK k);
  void end_tag(const char* name);  // after body(): the name token of the end tag, then %}
  StmtP statement();
  StmtP if_stmt();
  std::vector<std::string> targets();
  StmtP for_stmt();
  StmtP set_stmt();
  void params(std::vector<std::pair<std::string, ExprP>>& out);
  StmtP macro_stmt();
  StmtP call_stmt();  // % call(params) macro(args) %}body% endcall %}: body is caller()
  void filter_chain(std::vector<ExprP>& out, bool need_pipe);
  // ---- expressions ----
  ExprP tuple_expr(bool with_cond);
  ExprP expr();
  ExprP binary(std::string op, ExprP l, ExprP r);
  ExprP or_expr();
  ExprP and_expr();
  ExprP not_expr();
  ExprP compare();
  ExprP math1();
  ExprP concat();
  ExprP math2();
  ExprP pow();
  ExprP unary(bool with_filter);
  ExprP filter_expr(ExprP e);
  void call_args(Expr& e);
  ExprP primary_postfix();
  ExprP subscript(ExprP obj);
  ExprP primary();

  int nesting_ = 0;  // open block tags: bounded for the same reason as fin()
  int depth_ = 0;    // nesting of primary(): bounded so a hostile template cannot overflow the stack
};

}  // namespace kiln::tmpl::detail
