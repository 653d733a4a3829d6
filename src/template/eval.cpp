// The tree-walking evaluator: statements write to one output string, expressions evaluate to Values with
// Python's operator semantics and Jinja's Undefined rules (an undefined name renders as "", is falsy and
// iterates as empty; any other use raises "'x' is undefined").
#include <cmath>

#include "template/eval.h"

namespace kiln::tmpl {
namespace {

enum class Flow { normal, break_, continue_ };

// Budgets that turn a runaway template into an error instead of an exhausted server (a prompt is far
// smaller; a 100-turn conversation takes ~1,000 steps).
constexpr size_t kMaxString = Value::kMaxString;  // any string, the output included
constexpr size_t kMaxList = size_t(1) << 22;
constexpr int64_t kMaxSteps = 5'000'000;  // loop iterations plus macro calls, per render
// Expressions and statements being evaluated at once, macro calls included: each expression is at most 256
// deep (the parser's bound) but a macro may call itself from the bottom of one, 200 times. This keeps the
// recursion well inside a thread's stack (~1 KB a level).
constexpr int kMaxEvalNesting = 2000;

void check_size(size_t n, size_t max) {
  if (n > max)
    fail("result too large (over " + std::to_string(max) + (max == kMaxString ? " bytes)" : " items)"));
}

// A TemplateError that already names its line.
class Located : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

[[noreturn]] void rethrow_at(int line, const TemplateError& e) {
  if (dynamic_cast<const Located*>(&e)) throw;
  throw Located("chat template error (line " + std::to_string(line) + "): " + e.what());
}

const char* op_text(Op op) {
  switch (op) {
    case Op::add:
      return "+";
    case Op::sub:
      return "-";
    case Op::mul:
      return "*";
    case Op::div:
      return "/";
    case Op::floordiv:
      return "//";
    case Op::mod:
      return "%";
    case Op::pow:
      return "**";
    default:
      return "?";
  }
}

Value arith(Op op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) {
    const bool fl = a.kind == Kind::floating || b.kind == Kind::floating;
    if (op == Op::add)
      return fl ? Value::floating(a.as_double() + b.as_double())
                : Value::integer(checked_add(a.as_int(), b.as_int()));
    if (op == Op::sub)
      return fl ? Value::floating(a.as_double() - b.as_double())
                : Value::integer(checked_sub(a.as_int(), b.as_int()));
    if (op == Op::mul)
      return fl ? Value::floating(a.as_double() * b.as_double())
                : Value::integer(checked_mul(a.as_int(), b.as_int()));
    if (op == Op::div) {
      if (b.as_double() == 0) fail("division by zero");
      return Value::floating(a.as_double() / b.as_double());
    }
    if (op == Op::floordiv || op == Op::mod) {
      if (b.as_double() == 0)
        fail(op == Op::floordiv ? "integer division or modulo by zero" : "modulo by zero");
      if (fl) {
        const double x = a.as_double(), y = b.as_double();
        const double q = std::floor(x / y);
        return Value::floating(op == Op::floordiv ? q : x - q * y);
      }
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == -1) return Value::integer(op == Op::floordiv ? checked_neg(x) : 0);  // INT64_MIN / -1 traps
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // floor, as Python
      return Value::integer(op == Op::floordiv ? q : x - q * y);
    }
    if (op == Op::pow) {
      if (!fl && b.as_int() >= 0 && b.as_int() < 64) {  // past 64 bits: a float (Python: a big int)
        int64_t r = 1;
        bool fits = true;
        for (int64_t k = 0; k < b.as_int() && fits; ++k) fits = !__builtin_mul_overflow(r, a.as_int(), &r);
        if (fits) return Value::integer(r);
      }
      return Value::floating(std::pow(a.as_double(), b.as_double()));
    }
  }
  if (op == Op::add && a.is_string() && b.is_string()) {
    check_size(a.s->size() + b.s->size(), kMaxString);
    return Value::string(*a.s + *b.s);
  }
  if (op == Op::add && a.is_array() && b.is_array()) {
    check_size(a.a->size() + b.a->size(), kMaxList);
    Array r = *a.a;
    r.insert(r.end(), b.a->begin(), b.a->end());
    Value v = Value::array(std::move(r));
    v.tuple = a.tuple;
    return v;
  }
  if (op == Op::mul && (a.is_string() || a.is_array()) &&
      (b.kind == Kind::integer || b.kind == Kind::boolean)) {
    const int64_t n = b.as_int();
    const size_t unit = a.is_string() ? a.s->size() : a.a->size() * sizeof(Value);
    if (n > 0 && unit > 0 && uint64_t(n) > (uint64_t(1) << 26) / unit) fail("repetition result too large");
    if (a.is_string()) {
      std::string r;
      for (int64_t k = 0; k < n; ++k) r += *a.s;
      return Value::string(std::move(r));
    }
    Array r;
    for (int64_t k = 0; k < n; ++k) r.insert(r.end(), a.a->begin(), a.a->end());
    return Value::array(std::move(r));
  }
  if (op == Op::mul && b.is_string() && a.kind == Kind::integer) return arith(op, b, a);
  if (op == Op::mod && a.is_string()) {  // a tuple supplies the arguments, anything else is the one argument
    if (b.is_array() && b.tuple) return Value::string(py_percent_format(*a.s, *b.a));
    return Value::string(py_percent_format(*a.s, {b}));
  }
  fail(std::string("unsupported operand type(s) for ") + op_text(op) + ": '" + kind_name(a) + "' and '" +
       kind_name(b) + "'");
}

class Evaluator {
 public:
  explicit Evaluator(const Scope* top) : top_(top) {}
  Value eval(const Expr& e, Scope& sc);
  Flow exec(const Body& body, Scope& sc, std::string& out);

 private:
  const Scope* top_;  // the render's top-level scope: alive for the whole render
  int depth_ = 0;     // macro calls in progress (Python would raise RecursionError; we must not overflow)
  int64_t steps_ = 0;
  int nesting_ = 0;  // eval() and exec() frames on the stack
  struct Nesting {
    int& n;
    explicit Nesting(int& x) : n(x) {
      if (++n > kMaxEvalNesting) {
        --n;
        fail("template evaluation nested deeper than " + std::to_string(kMaxEvalNesting) +
             " levels (kiln's limit: expressions within macros calling themselves)");
      }
    }
    ~Nesting() { --n; }
  };
  void step() {
    if (++steps_ > kMaxSteps) fail("render budget exceeded (5,000,000 loop iterations and macro calls)");
  }

  Flow exec_stmt(const Stmt& s, Scope& sc, std::string& out);
  Flow exec_for(const Stmt& s, Scope& sc, std::string& out);
  Value make_macro(const Stmt& s, Scope& sc);
  Value call(const Expr& e, Scope& sc);
  void eval_args(const Expr& e, Scope& sc, std::vector<Value>& args, Kwargs& kwargs) {
    args.reserve(e.args.size());
    for (const auto& x : e.args) args.push_back(eval(*x, sc));
    for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x, sc));
  }
  Value filter(const Expr& f, Value v, Scope& sc) {
    std::vector<Value> args;
    Kwargs kwargs;
    eval_args(f, sc, args, kwargs);
    return apply_filter(f.name, v, args, kwargs);
  }
};

Value Evaluator::eval(const Expr& e, Scope& sc) {
  const Nesting nest(nesting_);
  switch (e.kind) {
    case EK::literal:
      return e.lit;
    case EK::name: {
      const Value* v = sc.lookup(e.name);
      return v ? *v : Value::undefined_ref(e.name, false);
    }
    case EK::list:
    case EK::tuple: {
      Array a;
      a.reserve(e.args.size());
      for (const auto& x : e.args) a.push_back(eval(*x, sc));
      Value v = Value::array(std::move(a));
      v.tuple = e.kind == EK::tuple;
      return v;
    }
    case EK::dict: {
      Value o = Value::object();
      for (const auto& [k, x] : e.items) {
        const Value key = eval(*k, sc);
        o.o->set(to_str(key), eval(*x, sc));
      }
      return o;
    }
    case EK::getattr: {
      const Value obj = eval(*e.a, sc);
      if (obj.is_undefined()) raise_undefined(obj);
      Value r = get_attr(obj, e.name);
      if (r.is_undefined()) r = Value::undefined_ref(e.name, true);
      return r;
    }
    case EK::getitem: {
      const Value obj = eval(*e.a, sc);
      if (obj.is_undefined()) raise_undefined(obj);
      const Value key = eval(*e.b, sc);
      Value r = get_item(obj, key);
      if (r.is_undefined() && e.b->kind == EK::literal && e.b->lit.is_string())
        r = Value::undefined_ref(*e.b->lit.s, true);
      return r;
    }
    case EK::slice: {
      const Value obj = eval(*e.a, sc);
      if (obj.is_undefined()) raise_undefined(obj);
      return slice(obj, e.b ? eval(*e.b, sc) : Value::none(), e.c ? eval(*e.c, sc) : Value::none(),
                   e.d ? eval(*e.d, sc) : Value::none());
    }
    case EK::call:
      return call(e, sc);
    case EK::filter:
      return filter(e, eval(*e.a, sc), sc);
    case EK::test: {
      std::vector<Value> args;
      Kwargs kwargs;
      eval_args(e, sc, args, kwargs);
      return Value::boolean(apply_test(e.name, eval(*e.a, sc), args) != e.negated);
    }
    case EK::unary: {
      const Value v = eval(*e.a, sc);
      if (e.op == Op::not_) return Value::boolean(!truthy(v));
      if (v.is_undefined()) raise_undefined(v);
      if (!v.is_number())
        fail(std::string("bad operand type for unary ") + e.name + ": '" + kind_name(v) + "'");
      if (e.op == Op::pos) return v.kind == Kind::floating ? v : Value::integer(v.as_int());
      return v.kind == Kind::floating ? Value::floating(-v.f) : Value::integer(checked_neg(v.as_int()));
    }
    case EK::binary: {
      if (e.op == Op::and_) {
        Value l = eval(*e.a, sc);
        return truthy(l) ? eval(*e.b, sc) : l;
      }
      if (e.op == Op::or_) {
        Value l = eval(*e.a, sc);
        return truthy(l) ? l : eval(*e.b, sc);
      }
      const Value l = eval(*e.a, sc), r = eval(*e.b, sc);
      if (e.op == Op::concat) {
        std::string s = to_str(l);
        append_str(r, s);
        check_size(s.size(), kMaxString);
        return Value::string(std::move(s));
      }
      return arith(e.op, l, r);
    }
    case EK::compare: {
      Value l = eval(*e.a, sc);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value r = eval(*e.args[k], sc);
        const Op op = e.ops[k];
        bool ok;
        if (op == Op::eq) {
          ok = equal(l, r);
        } else if (op == Op::ne) {
          ok = !equal(l, r);
        } else if (op == Op::in) {
          ok = contains(r, l);
        } else if (op == Op::notin) {
          ok = !contains(r, l);
        } else {
          if (l.is_undefined()) raise_undefined(l);
          if (r.is_undefined()) raise_undefined(r);
          const int c = compare(l, r);
          ok = op == Op::lt ? c < 0 : op == Op::gt ? c > 0 : op == Op::le ? c <= 0 : c >= 0;
        }
        if (!ok) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case EK::cond:
      if (truthy(eval(*e.a, sc))) return eval(*e.b, sc);
      return e.c ? eval(*e.c, sc) : Value::undefined();
  }
  return Value::undefined();
}

Value Evaluator::call(const Expr& e, Scope& sc) {
  std::vector<Value> args;
  Kwargs kwargs;
  if (e.a->kind == EK::getattr) {  // obj.method(...): Python methods of str, dict and list first
    const Value obj = eval(*e.a->a, sc);
    if (obj.is_undefined()) raise_undefined(obj);
    eval_args(e, sc, args, kwargs);
    if (!(obj.is_object() && obj.namespace_)) {
      bool found = false;
      Value r = call_method(obj, e.a->name, args, kwargs, found);
      if (found) return r;
    }
    const Value fn = get_attr(obj, e.a->name);
    if (fn.kind != Kind::function)
      fail("'" + std::string(kind_name(obj)) + "' object has no callable attribute '" + e.a->name + "'");
    return (*fn.fn)(args, kwargs);
  }
  const Value fn = eval(*e.a, sc);
  if (fn.is_undefined()) raise_undefined(fn);
  if (fn.kind != Kind::function) fail("'" + std::string(kind_name(fn)) + "' object is not callable");
  eval_args(e, sc, args, kwargs);
  return (*fn.fn)(args, kwargs);
}

Value Evaluator::make_macro(const Stmt& s, Scope& sc) {
  const Stmt* m = &s;
  // A macro defined at the top level sees that scope live (names set after it, itself for recursion). One
  // defined inside a loop or macro could outlive its frame (stored in a namespace): it keeps a copy of the
  // variables it can see instead of a pointer to the frame.
  const Scope* defining = &sc;
  std::shared_ptr<Scope> snapshot;
  if (&sc != top_) {
    snapshot = std::make_shared<Scope>();
    for (const Scope* f = &sc; f && f != top_; f = f->parent)
      for (const auto& [k, v] : f->vars)
        if (!snapshot->lookup(k)) snapshot->vars.emplace_back(k, v);
    snapshot->parent = top_;
    defining = snapshot.get();
  }
  Evaluator* self = this;
  return Value::function([m, defining, snapshot, self](std::vector<Value>& args, Kwargs& kwargs) -> Value {
    if (self->depth_ >= 200) fail("maximum macro recursion depth (200) exceeded");
    self->step();
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(++x) {}
      ~Depth() { --d; }
    } depth(self->depth_);
    Scope local;
    local.parent = defining;
    const std::string name = m->kind == SK::call_block ? "caller" : m->targets[0];
    if (args.size() > m->params.size())
      fail("macro '" + name + "' takes not more than " + std::to_string(m->params.size()) + " argument(s)");
    Array varargs;
    for (size_t k = 0; k < m->params.size(); ++k) {
      const auto& [name, def] = m->params[k];
      Value v = k < args.size() ? args[k] : Value::undefined(name);
      for (auto& [kn, kv] : kwargs)
        if (kn == name) v = kv;
      if (v.is_undefined() && def) v = self->eval(*def, local);
      local.set(name, std::move(v));
    }
    Value kw = Value::object();
    for (auto& [kn, kv] : kwargs) {
      bool known = false;
      for (const auto& p : m->params) known = known || p.first == kn;
      if (kn == "caller") {
        local.set("caller", kv);
      } else if (!known) {
        kw.o->set(kn, kv);
      }
    }
    local.set("varargs", Value::array(std::move(varargs)));
    local.set("kwargs", kw);
    std::string out;
    self->exec(m->body, local, out);
    return Value::string(std::move(out));
  });
}

Flow Evaluator::exec_for(const Stmt& s, Scope& sc, std::string& out) {
  const Value seq = eval(*s.expr, sc);
  if (seq.is_none()) fail("'NoneType' object is not iterable");
  if (seq.is_number()) fail(std::string("'") + kind_name(seq) + "' object is not iterable");
  std::vector<Value> items = iterate(seq);
  if (s.cond) {  // the loop filter runs before loop.* is computed (loop.length counts kept items)
    std::vector<Value> kept;
    for (auto& it : items) {
      Scope f;
      f.parent = &sc;
      if (s.targets.size() == 1) {
        f.set(s.targets[0], it);
      } else {
        const std::vector<Value> parts = iterate(it);
        for (size_t k = 0; k < s.targets.size() && k < parts.size(); ++k) f.set(s.targets[k], parts[k]);
      }
      if (truthy(eval(*s.cond, f))) kept.push_back(std::move(it));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.else_body, sc, out);
    return Flow::normal;
  }
  const int64_t n = int64_t(items.size());
  // One loop object per loop, updated in place each iteration (its keys are built once).
  auto index = std::make_shared<int64_t>(0);
  Value loop = Value::object();
  auto& li = loop.o->items;
  for (const char* k : {"index0", "index", "revindex0", "revindex", "first", "last", "length", "depth",
                        "depth0", "previtem", "nextitem"})
    li.emplace_back(k, Value());
  li.emplace_back("cycle", Value::function([index](std::vector<Value>& args, Kwargs&) -> Value {
                    if (args.empty()) fail("no items for cycling given");
                    return args[size_t(*index) % args.size()];
                  }));
  static const std::string kPrev = "loop.previtem", kNext = "loop.nextitem";
  for (int64_t k = 0; k < n; ++k) {
    Scope f;
    f.parent = &sc;
    f.vars.reserve(s.targets.size() + 1);
    const Value& it = items[size_t(k)];
    if (s.targets.size() == 1) {
      f.set(s.targets[0], it);
    } else {
      const std::vector<Value> parts = iterate(it);
      if (parts.size() != s.targets.size())
        fail("cannot unpack " + std::to_string(parts.size()) + " values into " +
             std::to_string(s.targets.size()) + " loop variables");
      for (size_t j = 0; j < parts.size(); ++j) f.set(s.targets[j], parts[j]);
    }
    *index = k;
    li[0].second = Value::integer(k);
    li[1].second = Value::integer(k + 1);
    li[2].second = Value::integer(n - k - 1);
    li[3].second = Value::integer(n - k);
    li[4].second = Value::boolean(k == 0);
    li[5].second = Value::boolean(k == n - 1);
    li[6].second = Value::integer(n);
    li[7].second = Value::integer(1);
    li[8].second = Value::integer(0);
    li[9].second = k > 0 ? items[size_t(k - 1)] : Value::undefined_ref(kPrev, false);
    li[10].second = k + 1 < n ? items[size_t(k + 1)] : Value::undefined_ref(kNext, false);
    f.set("loop", loop);
    step();
    if (exec(s.body, f, out) == Flow::break_) break;
  }
  return Flow::normal;
}

Flow Evaluator::exec_stmt(const Stmt& s, Scope& sc, std::string& out) {
  switch (s.kind) {
    case SK::text:
      out += s.text;
      return Flow::normal;
    case SK::output:
      append_str(eval(*s.expr, sc), out);
      return Flow::normal;
    case SK::if_:
      for (const auto& [c, b] : s.branches)
        if (!c || truthy(eval(*c, sc))) return exec(b, sc, out);
      return Flow::normal;
    case SK::for_:
      return exec_for(s, sc, out);
    case SK::set: {
      Value v = eval(*s.expr, sc);
      if (!s.attr.empty()) {
        const Value* ns = sc.lookup(s.targets[0]);
        if (!ns || !ns->is_object() || !ns->namespace_)
          fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
        ns->o->set(s.attr, std::move(v));
      } else if (s.targets.size() == 1) {
        sc.set(s.targets[0], std::move(v));
      } else {
        const std::vector<Value> parts = iterate(v);
        if (parts.size() != s.targets.size())
          fail("cannot unpack " + std::to_string(parts.size()) + " values");
        for (size_t k = 0; k < parts.size(); ++k) sc.set(s.targets[k], parts[k]);
      }
      return Flow::normal;
    }
    case SK::set_block:
    case SK::filter_block: {
      std::string body;
      exec(s.body, sc, body);
      Value v = Value::string(std::move(body));
      for (const auto& f : s.filters) v = filter(*f, std::move(v), sc);
      if (s.kind == SK::set_block) {
        sc.set(s.targets[0], std::move(v));
      } else {
        append_str(v, out);
      }
      return Flow::normal;
    }
    case SK::macro:
      sc.set(s.targets[0], make_macro(s, sc));
      return Flow::normal;
    case SK::call_block: {  // the body becomes caller(), passed to the called macro
      const Value fn = eval(*s.expr->a, sc);
      if (fn.kind != Kind::function) fail("{% call %} needs a macro");
      std::vector<Value> args;
      Kwargs kwargs;
      eval_args(*s.expr, sc, args, kwargs);
      kwargs.emplace_back("caller", make_macro(s, sc));
      append_str((*fn.fn)(args, kwargs), out);
      return Flow::normal;
    }
    case SK::scope: {
      Scope f;
      f.parent = &sc;
      for (const auto& [n, x] : s.params) f.set(n, eval(*x, sc));
      return exec(s.body, f, out);
    }
    case SK::break_:
      return Flow::break_;
    case SK::continue_:
      return Flow::continue_;
  }
  return Flow::normal;
}

Flow Evaluator::exec(const Body& body, Scope& sc, std::string& out) {
  const Nesting nest(nesting_);
  for (const auto& s : body) {
    Flow fl;
    try {
      fl = exec_stmt(*s, sc, out);
    } catch (const TemplateError& e) {
      rethrow_at(s->line, e);
    }
    check_size(out.size(), kMaxString);
    if (fl != Flow::normal) return fl;
  }
  return Flow::normal;
}

}  // namespace

void render_body(const Body& body, Scope& globals, std::string& out) {
  Scope top;
  top.parent = &globals;
  Evaluator ev(&top);
  ev.exec(body, top, out);
}

}  // namespace kiln::tmpl
