// Recursive-descent Jinja parser; see parser.h.
#include "template/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "template/lexer.h"

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

namespace {

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

  Body body(std::initializer_list<const char*> ends) {
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

  StmtP make(SK k) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = cur().line;
    return s;
  }

  void end_tag(const char* name) {  // after body(): the name token of the end tag, then %}
    if (!skip_name(name)) err(std::string("expected '") + name + "'");
    expect_block_end();
  }

  int nesting_ = 0;  // open block tags: bounded for the same reason as fin()

  StmtP statement() {
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

  StmtP if_stmt() {
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

  std::vector<std::string> targets() {
    std::vector<std::string> out;
    const bool paren = skip_op("(");
    do {
      out.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return out;
  }

  StmtP for_stmt() {
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

  StmtP set_stmt() {
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

  void params(std::vector<std::pair<std::string, ExprP>>& out) {
    expect_op("(");
    while (!skip_op(")")) {
      if (!out.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string n = expect_name();
      ExprP def = skip_op("=") ? expr() : nullptr;
      out.emplace_back(std::move(n), std::move(def));
    }
  }

  StmtP macro_stmt() {
    auto s = make(SK::macro);
    s->targets.push_back(expect_name());
    params(s->params);
    expect_block_end();
    s->body = body({"endmacro"});
    end_tag("endmacro");
    return s;
  }

  StmtP call_stmt() {  // {% call(params) macro(args) %}body{% endcall %}: body is caller()
    auto s = make(SK::call_block);
    if (is_op("(")) params(s->params);
    s->expr = primary_postfix();
    if (s->expr->kind != EK::call) err("expected a call after 'call'");
    expect_block_end();
    s->body = body({"endcall"});
    end_tag("endcall");
    return s;
  }

  void filter_chain(std::vector<ExprP>& out, bool need_pipe) {
    while (need_pipe ? skip_op("|") : true) {
      auto f = node(EK::filter);
      f->name = expect_name();
      if (is_op("(")) call_args(*f);
      out.push_back(std::move(f));
      need_pipe = true;
    }
  }

  // ---- expressions ----

  ExprP tuple_expr(bool with_cond) {
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

  ExprP expr() {
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

  ExprP binary(std::string op, ExprP l, ExprP r) {
    auto e = node(EK::binary);
    e->op = op_from(op);
    e->name = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return fin(std::move(e));
  }

  ExprP or_expr() {
    ExprP e = and_expr();
    while (skip_name("or")) e = binary("or", std::move(e), and_expr());
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (skip_name("and")) e = binary("and", std::move(e), not_expr());
    return e;
  }
  ExprP not_expr() {
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
  ExprP compare() {
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
  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      std::string op = t_[p_++].s;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }
  ExprP concat() {
    ExprP e = math2();
    while (skip_op("~")) e = binary("~", std::move(e), math2());
    return e;
  }
  ExprP math2() {
    ExprP e = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = t_[p_++].s;
      e = binary(op, std::move(e), pow());
    }
    return e;
  }
  ExprP pow() {
    ExprP e = unary(true);
    while (skip_op("**")) e = binary("**", std::move(e), unary(true));
    return e;
  }
  ExprP unary(bool with_filter) {
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

  ExprP filter_expr(ExprP e) {
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

  void call_args(Expr& e) {
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

  ExprP primary_postfix() {
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

  ExprP subscript(ExprP obj) {
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

  int depth_ = 0;  // nesting of primary(): bounded so a hostile template cannot overflow the stack

  ExprP primary() {
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
};

}  // namespace

Body parse(std::string_view source) {
  return Parser(lex(source)).run();
}

}  // namespace kiln::tmpl
