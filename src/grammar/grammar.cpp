#include "grammar/grammar.h"

#include <functional>

#include "kiln/error.h"

namespace kiln::grammar {

namespace {
bool same_dfa(const Dfa& a, const Dfa& b) {
  return a.hash == b.hash && a.n_classes == b.n_classes && a.start == b.start &&
         a.byte_class == b.byte_class && a.next == b.next && a.accepting == b.accepting;
}
}  // namespace

uint32_t GrammarBuilder::new_rule(std::string name) {
  KILN_CHECK(g_.rules.size() < kMaxElements, "grammar: more than ", kMaxElements, " rules (the limit)");
  g_.rules.push_back({std::move(name), {}});
  return uint32_t(g_.rules.size() - 1);
}

void GrammarBuilder::add_alt(uint32_t rule, std::vector<Element> seq) {
  g_.rules[rule].alts.push_back(std::move(seq));
}

Element GrammarBuilder::lexeme(Dfa d) {
  for (size_t i = 0; i < g_.lexemes.size(); ++i)
    if (same_dfa(g_.lexemes[i], d)) return {Element::Kind::lexeme, uint32_t(i)};
  g_.lexemes.push_back(std::move(d));
  return {Element::Kind::lexeme, uint32_t(g_.lexemes.size() - 1)};
}

Element GrammarBuilder::lexeme(const Re& r, bool json_escape) {
  return lexeme(compile_re(r, json_escape));
}

Element GrammarBuilder::literal(std::string_view bytes) {
  return lexeme(re_bytes(bytes));
}

Grammar GrammarBuilder::finish(uint32_t root) {
  g_.root = root;
  return std::move(g_);
}

FlatGrammar normalize(Grammar g) {
  const size_t nr = g.rules.size();
  KILN_CHECK(g.root < nr, "grammar: root rule ", g.root, " does not exist");
  // Productive rules (can derive a finite byte string): a fixpoint.
  std::vector<uint8_t> productive(nr, 0);
  auto elem_productive = [&](const Element& e) {
    return e.kind == Element::Kind::lexeme ? g.lexemes[e.id].start >= 0 : productive[e.id] != 0;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r) {
      if (productive[r]) continue;
      for (const auto& alt : g.rules[r].alts) {
        bool ok = true;
        for (const auto& e : alt) ok = ok && elem_productive(e);
        if (ok) {
          productive[r] = 1, changed = true;
          break;
        }
      }
    }
  }
  KILN_CHECK(productive[g.root], "grammar can never finish: rule `", g.rules[g.root].name,
             "` derives no complete output");
  for (auto& rule : g.rules) {
    std::vector<std::vector<Element>> keep;
    for (auto& alt : rule.alts) {
      bool ok = true;
      for (const auto& e : alt) ok = ok && elem_productive(e);
      if (ok) keep.push_back(std::move(alt));
    }
    rule.alts = std::move(keep);
  }
  // Nullable rules, then left recursion: a rule that reaches itself through calls preceded only by
  // nullable elements would make the parser's closure endless.
  std::vector<uint8_t> nullable(nr, 0);
  auto elem_nullable = [&](const Element& e) {
    return e.kind == Element::Kind::lexeme ? g.lexemes[e.id].accepting[size_t(g.lexemes[e.id].start)] != 0
                                           : nullable[e.id] != 0;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : g.rules[r].alts) {
        bool all = true;
        for (const auto& e : alt) all = all && elem_nullable(e);
        if (all) {
          nullable[r] = 1, changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> left(nr);
  for (size_t r = 0; r < nr; ++r)
    for (const auto& alt : g.rules[r].alts)
      for (const auto& e : alt) {
        if (e.kind == Element::Kind::rule) left[r].push_back(e.id);
        if (!elem_nullable(e)) break;
      }
  std::vector<uint8_t> color(nr, 0);  // 0 new, 1 on the DFS path, 2 done
  std::function<void(uint32_t)> visit = [&](uint32_t r) {
    color[r] = 1;
    for (uint32_t c : left[r]) {
      KILN_CHECK(color[c] != 1, "grammar: left recursion through rule `", g.rules[c].name,
                 "` is not supported (rewrite it with repetition)");
      if (color[c] == 0) visit(c);
    }
    color[r] = 2;
  };
  for (uint32_t r = 0; r < nr; ++r)
    if (color[r] == 0) visit(r);

  FlatGrammar f;
  f.alt_starts.resize(nr);
  for (uint32_t r = 0; r < nr; ++r) {
    f.rule_names.push_back(g.rules[r].name);
    for (const auto& alt : g.rules[r].alts) {
      f.alt_starts[r].push_back(uint32_t(f.pos.size()));
      for (size_t i = 0; i < alt.size(); ++i) {
        const auto& e = alt[i];
        Position p{e.kind == Element::Kind::lexeme ? Position::Kind::lexeme : Position::Kind::call, e.id, r,
                   e.kind == Element::Kind::rule && i + 1 == alt.size()};
        f.pos.push_back(p);
      }
      f.pos.push_back({Position::Kind::end, 0, r, false});
    }
  }
  f.key_base.assign(f.pos.size(), 0);
  for (size_t p = 0; p < f.pos.size(); ++p)
    if (f.pos[p].kind == Position::Kind::lexeme) {
      f.key_base[p] = f.num_keys;
      f.num_keys += uint32_t(g.lexemes[f.pos[p].id].num_states());
    }
  // FIRST and FOLLOW byte sets (fixpoints): an exit from a rule followed by a byte outside FOLLOW(rule) can
  // never continue, whatever the context, so the mask cache rejects it instead of deferring it.
  using Bytes = std::array<uint64_t, 4>;
  auto add = [](Bytes& a, const Bytes& b) {
    bool grew = false;
    for (int i = 0; i < 4; ++i) {
      const uint64_t v = a[size_t(i)] | b[size_t(i)];
      grew = grew || v != a[size_t(i)];
      a[size_t(i)] = v;
    }
    return grew;
  };
  std::vector<Bytes> first(nr, Bytes{0, 0, 0, 0});
  auto elem_first = [&](const Element& e) {
    if (e.kind == Element::Kind::rule) return first[e.id];
    const Dfa& d = g.lexemes[e.id];
    return d.out_bytes[size_t(d.start)];
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r)
      for (const auto& alt : g.rules[r].alts)
        for (const auto& e : alt) {
          changed = add(first[r], elem_first(e)) || changed;
          if (!elem_nullable(e)) break;
        }
  }
  f.follow.assign(nr, Bytes{0, 0, 0, 0});
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r)
      for (const auto& alt : g.rules[r].alts)
        for (size_t i = 0; i < alt.size(); ++i) {
          if (alt[i].kind != Element::Kind::rule) continue;
          Bytes fo{0, 0, 0, 0};
          bool rest_nullable = true;
          for (size_t j = i + 1; j < alt.size() && rest_nullable; ++j) {
            add(fo, elem_first(alt[j]));
            rest_nullable = elem_nullable(alt[j]);
          }
          if (rest_nullable) add(fo, f.follow[r]);
          changed = add(f.follow[alt[i].id], fo) || changed;
        }
  }
  f.lexemes = std::move(g.lexemes);
  f.root = g.root;
  return f;
}

}  // namespace kiln::grammar
