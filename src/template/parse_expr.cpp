// Jinja expressions: operator precedence as Jinja 3's parser (see parser.h), postfix access, calls,
// filters, tests and literals. The statements are in parser.cpp.
#include "template/parser_impl.h"

namespace kiln::tmpl::detail {

// ---- expressions ----
ExprP Parser::tuple_expr(bool with_cond) {
  ExprP first = with_cond ? expr() : or_expr();
  if (!is_op(",")) return first;
  auto t = node(EK::tuple);
  t->args.push_back(std::move(first));
  while (skip_op(",")) {
    if (cur().type == Tok::block_end || cur().type == Tok::var_end || is_op(")")) break;
    t->args.push_back(with_cond ? expr() : or_expr());
  }
  return t;
}

ExprP Parser::expr() {
  ExprP e = or_expr();
  while (skip_name("if")) {
    auto c = node(EK::cond);
    c->a = or_expr();
    c->b = std::move(e);
    if (skip_name("else")) c->c = expr();
    e = fin(std::move(c));
  }
  return e;
}

ExprP Parser::binary(std::string op, ExprP l, ExprP r) {
  auto e = node(EK::binary);
  e->op = op_from(op);
  e->name = std::move(op);
  e->a = std::move(l);
  e->b = std::move(r);
  return fin(std::move(e));
}

ExprP Parser::or_expr() {
  ExprP e = and_expr();
  while (skip_name("or")) e = binary("or", std::move(e), and_expr());
  return e;
}

ExprP Parser::and_expr() {
  ExprP e = not_expr();
  while (skip_name("and")) e = binary("and", std::move(e), not_expr());
  return e;
}

ExprP Parser::not_expr() {
  if (is_name("not")) {
    auto e = node(EK::unary);
    ++p_;
    e->name = "not";
    e->op = Op::not_;
    e->a = not_expr();
    return fin(std::move(e));
  }
  return compare();
}

ExprP Parser::compare() {
  ExprP first = math1();
  ExprP cmp;
  while (true) {
    std::string op;
    if (cur().type == Tok::op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == ">" ||
                                  cur().s == "<=" || cur().s == ">=")) {
      op = t_[p_++].s;
    } else if (skip_name("in")) {
      op = "in";
    } else if (is_name("not") && peek().type == Tok::name && peek().s == "in") {
      p_ += 2;
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(EK::compare);
      cmp->a = std::move(first);
    }
    cmp->ops.push_back(op_from(op));
    cmp->args.push_back(math1());
  }
  return cmp ? fin(std::move(cmp)) : std::move(first);
}

ExprP Parser::math1() {
  ExprP e = concat();
  while (is_op("+") || is_op("-")) {
    std::string op = t_[p_++].s;
    e = binary(op, std::move(e), concat());
  }
  return e;
}

ExprP Parser::concat() {
  ExprP e = math2();
  while (skip_op("~")) e = binary("~", std::move(e), math2());
  return e;
}

ExprP Parser::math2() {
  ExprP e = pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = t_[p_++].s;
    e = binary(op, std::move(e), pow());
  }
  return e;
}

ExprP Parser::pow() {
  ExprP e = unary(true);
  while (skip_op("**")) e = binary("**", std::move(e), unary(true));
  return e;
}

ExprP Parser::unary(bool with_filter) {
  ExprP e;
  if (is_op("-") || is_op("+")) {
    e = node(EK::unary);
    e->name = t_[p_++].s;
    e->op = e->name == "-" ? Op::neg : Op::pos;
    e->a = unary(false);
    e = fin(std::move(e));
  } else {
    e = primary_postfix();
  }
  return with_filter ? filter_expr(std::move(e)) : std::move(e);
}

ExprP Parser::filter_expr(ExprP e) {
  while (true) {
    if (skip_op("|")) {
      auto f = node(EK::filter);
      f->name = expect_name();
      if (is_op("(")) call_args(*f);
      f->a = std::move(e);
      e = fin(std::move(f));
    } else if (skip_name("is")) {
      auto t = node(EK::test);
      t->negated = skip_name("not");
      t->name = expect_name();
      if (is_op("(")) {
        call_args(*t);
      } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                  cur().type == Tok::floating || is_op("(") || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and")) {
        if (is_name("is")) err("you cannot chain multiple tests with is");
        t->args.push_back(primary_postfix());
      }
      t->a = std::move(e);
      e = fin(std::move(t));
    } else if (is_op("(")) {
      auto c = node(EK::call);
      c->a = std::move(e);
      call_args(*c);
      e = fin(std::move(c));
    } else {
      return e;
    }
  }
}

void Parser::call_args(Expr& e) {
  expect_op("(");
  bool first = true;
  while (!skip_op(")")) {
    if (!first) {
      expect_op(",");
      if (skip_op(")")) break;
    }
    first = false;
    if (cur().type == Tok::name && peek().type == Tok::op && peek().s == "=") {
      std::string k = t_[p_].s;
      p_ += 2;
      e.kwargs.emplace_back(std::move(k), expr());
    } else {
      if (!e.kwargs.empty()) err("positional argument after a keyword argument");
      e.args.push_back(expr());
    }
  }
}

ExprP Parser::primary_postfix() {
  ExprP e = primary();
  while (true) {
    if (skip_op(".")) {
      if (cur().type == Tok::integer) {
        auto g = node(EK::getitem);
        g->a = std::move(e);
        g->b = node(EK::literal);
        g->b->lit = Value::integer(t_[p_++].i);
        e = fin(std::move(g));
      } else {
        auto g = node(EK::getattr);
        g->name = expect_name();
        g->a = std::move(e);
        e = fin(std::move(g));
      }
    } else if (skip_op("[")) {
      e = fin(subscript(std::move(e)));
    } else if (is_op("(")) {
      auto c = node(EK::call);
      c->a = std::move(e);
      call_args(*c);
      e = fin(std::move(c));
    } else {
      return e;
    }
  }
}

ExprP Parser::subscript(ExprP obj) {
  ExprP parts[3];
  int n = 0;
  bool is_slice = false;
  while (true) {
    if (is_op(":")) {
      is_slice = true;
      ++p_;
      if (++n > 2) err("too many ':' in a slice");
      continue;
    }
    if (is_op("]")) break;
    if (parts[n]) err("expected ':' or ']' in a subscript");
    parts[n] = expr();
  }
  expect_op("]");
  if (!is_slice) {
    if (!parts[0]) err("empty subscript");
    auto g = node(EK::getitem);
    g->a = std::move(obj);
    g->b = std::move(parts[0]);
    return g;
  }
  auto s = node(EK::slice);
  s->a = std::move(obj);
  s->b = std::move(parts[0]);
  s->c = std::move(parts[1]);
  s->d = std::move(parts[2]);
  return s;
}

ExprP Parser::primary() {
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(++x) {}
    ~Depth() { --d; }
  } depth(depth_);
  if (depth_ > 200) err("expression nested too deeply");
  const Token& tk = cur();
  if (tk.type == Tok::name) {
    auto e = node(EK::literal);
    const std::string& n = tk.s;
    if (n == "true" || n == "True") {
      e->lit = Value::boolean(true);
    } else if (n == "false" || n == "False") {
      e->lit = Value::boolean(false);
    } else if (n == "none" || n == "None") {
      e->lit = Value::none();
    } else {
      e->kind = EK::name;
      e->name = n;
    }
    ++p_;
    return e;
  }
  if (tk.type == Tok::string) {
    auto e = node(EK::literal);
    std::string s;
    while (cur().type == Tok::string) s += t_[p_++].s;  // adjacent literals concatenate
    e->lit = Value::string(std::move(s));
    return e;
  }
  if (tk.type == Tok::integer || tk.type == Tok::floating) {
    auto e = node(EK::literal);
    e->lit = tk.type == Tok::integer ? Value::integer(tk.i) : Value::floating(tk.f);
    ++p_;
    return e;
  }
  if (skip_op("(")) {
    if (skip_op(")")) {
      auto t = node(EK::tuple);
      return t;
    }
    ExprP e = expr();
    if (is_op(",")) {
      auto t = node(EK::tuple);
      t->args.push_back(std::move(e));
      while (skip_op(",")) {
        if (is_op(")")) break;
        t->args.push_back(expr());
      }
      e = fin(std::move(t));
    }
    expect_op(")");
    return e;
  }
  if (skip_op("[")) {
    auto l = node(EK::list);
    while (!skip_op("]")) {
      if (!l->args.empty()) {
        expect_op(",");
        if (skip_op("]")) break;
      }
      l->args.push_back(expr());
    }
    return fin(std::move(l));
  }
  if (skip_op("{")) {
    auto d = node(EK::dict);
    while (!skip_op("}")) {
      if (!d->items.empty()) {
        expect_op(",");
        if (skip_op("}")) break;
      }
      ExprP k = expr();
      expect_op(":");
      d->items.emplace_back(std::move(k), expr());
    }
    return fin(std::move(d));
  }
  err("unexpected " + describe());
}
}  // namespace kiln::tmpl::detail
