// Recursive-descent Jinja parser: tags and bodies (the expressions are in parse_expr.cpp); see parser.h.
#include "template/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "template/lexer.h"
#include "template/parser_impl.h"

namespace kiln::tmpl {

Op op_from(const std::string& s) {
  static const std::pair<const char*, Op> table[] = {
      {"+", Op::add},    {"-", Op::sub},  {"*", Op::mul},    {"/", Op::div},      {"//", Op::floordiv},
      {"%", Op::mod},    {"**", Op::pow}, {"~", Op::concat}, {"and", Op::and_},   {"or", Op::or_},
      {"not", Op::not_}, {"==", Op::eq},  {"!=", Op::ne},    {"<", Op::lt},       {">", Op::gt},
      {"<=", Op::le},    {">=", Op::ge},  {"in", Op::in},    {"notin", Op::notin}};
  for (const auto& [k, v] : table)
    if (s == k) return v;
  return Op::none;
}

namespace detail {

Body Parser::body(std::initializer_list<const char*> ends) {
  Body out;
  while (true) {
    const Token& tk = cur();
    if (tk.type == Tok::eof) {
      if (ends.size()) err("unexpected end of template, expected '" + closing(ends) + "'");
      return out;
    }
    if (tk.type == Tok::text) {
      auto s = std::make_unique<Stmt>();
      s->kind = SK::text;
      s->line = tk.line;
      s->text = tk.s;
      out.push_back(std::move(s));
      ++p_;
    } else if (tk.type == Tok::var_begin) {
      ++p_;
      auto s = std::make_unique<Stmt>();
      s->kind = SK::output;
      s->line = tk.line;
      s->expr = tuple_expr(true);
      if (cur().type != Tok::var_end) err("expected '}}', got " + describe());
      ++p_;
      out.push_back(std::move(s));
    } else if (tk.type == Tok::block_begin) {
      const Token& nm = peek();
      if (nm.type != Tok::name) {
        ++p_;
        err("expected a tag name, got " + describe());
      }
      for (const char* e : ends)
        if (nm.s == e) {
          ++p_;
          return out;
        }
      ++p_;
      if (nm.s.starts_with("end") || nm.s == "elif" || nm.s == "else")
        err("unexpected '" + nm.s + "'" +
            (ends.size() ? ", expected '" + closing(ends) + "'" : std::string()));
      out.push_back(statement());
    } else {
      err("unexpected " + describe());
    }
  }
}

StmtP Parser::make(SK k) {
  auto s = std::make_unique<Stmt>();
  s->kind = k;
  s->line = cur().line;
  return s;
}

void Parser::end_tag(const char* name) {  // after body(): the name token of the end tag, then %}
  if (!skip_name(name)) err(std::string("expected '") + name + "'");
  expect_block_end();
}

StmtP Parser::statement() {
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(++x) {}
    ~Depth() { --d; }
  } depth(nesting_);
  if (nesting_ > 128) err("blocks nested too deeply");
  const std::string tag = expect_name();
  if (tag == "if") return if_stmt();
  if (tag == "for") return for_stmt();
  if (tag == "set") return set_stmt();
  if (tag == "macro") return macro_stmt();
  if (tag == "call") return call_stmt();
  if (tag == "filter") {
    auto s = make(SK::filter_block);
    filter_chain(s->filters, false);
    expect_block_end();
    s->body = body({"endfilter"});
    end_tag("endfilter");
    return s;
  }
  if (tag == "with") {
    auto s = make(SK::scope);
    while (cur().type != Tok::block_end) {
      if (!s->params.empty()) expect_op(",");
      std::string n = expect_name();
      expect_op("=");
      s->params.emplace_back(std::move(n), expr());
    }
    expect_block_end();
    s->body = body({"endwith"});
    end_tag("endwith");
    return s;
  }
  if (tag == "generation") {  // transformers' AssistantTracker: renders its body unchanged
    auto s = make(SK::scope);
    expect_block_end();
    s->body = body({"endgeneration"});
    end_tag("endgeneration");
    return s;
  }
  if (tag == "break" || tag == "continue") {
    auto s = make(tag == "break" ? SK::break_ : SK::continue_);
    expect_block_end();
    return s;
  }
  --p_;
  err("unknown or unsupported tag '" + tag + "'");
}

StmtP Parser::if_stmt() {
  auto s = make(SK::if_);
  ExprP c = tuple_expr(true);
  expect_block_end();
  while (true) {
    Body b = body({"elif", "else", "endif"});
    s->branches.emplace_back(std::move(c), std::move(b));
    if (skip_name("elif")) {
      c = tuple_expr(true);
      expect_block_end();
      continue;
    }
    if (skip_name("else")) {
      expect_block_end();
      s->branches.emplace_back(nullptr, body({"endif"}));
    }
    end_tag("endif");
    return s;
  }
}

std::vector<std::string> Parser::targets() {
  std::vector<std::string> out;
  const bool paren = skip_op("(");
  do {
    out.push_back(expect_name());
  } while (skip_op(","));
  if (paren) expect_op(")");
  return out;
}

StmtP Parser::for_stmt() {
  auto s = make(SK::for_);
  s->targets = targets();
  if (!skip_name("in")) err("expected 'in' in for loop, got " + describe());
  s->expr = tuple_expr(false);  // no inline if here: `if` starts the loop filter
  if (skip_name("if")) s->cond = expr();
  if (skip_name("recursive")) err("recursive for loops are not supported");
  expect_block_end();
  s->body = body({"else", "endfor"});
  if (skip_name("else")) {
    expect_block_end();
    s->else_body = body({"endfor"});
  }
  end_tag("endfor");
  return s;
}

StmtP Parser::set_stmt() {
  auto s = make(SK::set);
  s->targets.push_back(expect_name());
  if (skip_op(".")) {
    s->attr = expect_name();
  } else {
    while (skip_op(",")) s->targets.push_back(expect_name());
  }
  if (skip_op("=")) {
    s->expr = tuple_expr(true);
    expect_block_end();
    return s;
  }
  if (s->targets.size() != 1 || !s->attr.empty()) err("expected '=' in set");
  s->kind = SK::set_block;
  filter_chain(s->filters, true);
  expect_block_end();
  s->body = body({"endset"});
  end_tag("endset");
  return s;
}

void Parser::params(std::vector<std::pair<std::string, ExprP>>& out) {
  expect_op("(");
  while (!skip_op(")")) {
    if (!out.empty()) expect_op(",");
    if (skip_op(")")) break;
    std::string n = expect_name();
    ExprP def = skip_op("=") ? expr() : nullptr;
    out.emplace_back(std::move(n), std::move(def));
  }
}

StmtP Parser::macro_stmt() {
  auto s = make(SK::macro);
  s->targets.push_back(expect_name());
  params(s->params);
  expect_block_end();
  s->body = body({"endmacro"});
  end_tag("endmacro");
  return s;
}

StmtP Parser::call_stmt() {  // {% call(params) macro(args) %}body{% endcall %}: body is caller()
  auto s = make(SK::call_block);
  if (is_op("(")) params(s->params);
  s->expr = primary_postfix();
  if (s->expr->kind != EK::call) err("expected a call after 'call'");
  expect_block_end();
  s->body = body({"endcall"});
  end_tag("endcall");
  return s;
}

void Parser::filter_chain(std::vector<ExprP>& out, bool need_pipe) {
  while (need_pipe ? skip_op("|") : true) {
    auto f = node(EK::filter);
    f->name = expect_name();
    if (is_op("(")) call_args(*f);
    out.push_back(std::move(f));
    need_pipe = true;
  }
}

}  // namespace detail

Body parse(std::string_view source) {
  return detail::Parser(lex(source)).run();
}

}  // namespace kiln::tmpl
