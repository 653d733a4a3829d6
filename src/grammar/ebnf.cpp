// EBNF (GBNF / XGrammar syntax) -> grammar. Regular sub-expressions (no rule reference inside) become one
// lexeme each; repetition of non-regular parts becomes right-recursive helper rules (tail calls).
#include <cctype>
#include <map>
#include <memory>

#include "grammar/front_ends.h"
#include "kiln/error.h"

namespace kiln::grammar {

namespace {

constexpr int kMaxDepth = 200;

struct Node {
  enum class Kind { alt, seq, repeat, terminal, ref };
  Kind kind;
  std::vector<Node> kids;
  Re re;             // terminal
  std::string name;  // ref
  int min = 0, max = -1;
  size_t offset = 0;
};

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view s) : s_(s) {}

  std::vector<std::pair<std::string, Node>> parse() {
    std::vector<std::pair<std::string, Node>> rules;
    skip();
    while (i_ < s_.size()) {
      const size_t at = i_;
      std::string name = ident();
      KILN_CHECK(!name.empty(), "ebnf: expected a rule name at offset ", at);
      skip();
      KILN_CHECK(s_.substr(i_, 3) == "::=", "ebnf: expected `::=` after `", name, "` at offset ", i_);
      i_ += 3;
      rules.push_back({name, alternatives(0)});
      skip();
    }
    return rules;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;

  void skip() {
    while (i_ < s_.size()) {
      if (s_[i_] == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r') {
        ++i_;
      } else {
        break;
      }
    }
  }
  static bool ident_char(char c) { return std::isalnum(uint8_t(c)) || c == '_' || c == '-' || c == '.'; }
  std::string ident() {
    const size_t b = i_;
    while (i_ < s_.size() && ident_char(s_[i_])) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }
  bool at_rule_start() {  // `name ::=` ahead: the current rule ends here
    size_t j = i_;
    while (j < s_.size() && ident_char(s_[j])) ++j;
    if (j == i_) return false;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\n' || s_[j] == '\r')) ++j;
    return s_.substr(j, 3) == "::=";
  }

  Node alternatives(int depth) {
    KILN_CHECK(depth < kMaxDepth, "ebnf: groups nested deeper than ", kMaxDepth, " (the limit)");
    Node alt{Node::Kind::alt, {}, {}, {}, 0, -1, i_};
    for (;;) {
      Node seq{Node::Kind::seq, {}, {}, {}, 0, -1, i_};
      for (;;) {
        skip();
        if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')' || at_rule_start()) break;
        seq.kids.push_back(repeat(depth));
      }
      alt.kids.push_back(std::move(seq));
      skip();
      if (i_ < s_.size() && s_[i_] == '|') {
        ++i_;
        continue;
      }
      return alt;
    }
  }

  int number() {
    int v = 0, n = 0;
    while (i_ < s_.size() && std::isdigit(uint8_t(s_[i_])) && n++ < 6) v = v * 10 + (s_[i_++] - '0');
    KILN_CHECK(n > 0, "ebnf: expected a number at offset ", i_);
    KILN_CHECK(v <= 10000, "ebnf: repetition count above 10000 (the limit)");
    return v;
  }

  Node repeat(int depth) {
    Node n = primary(depth);
    for (;;) {
      if (i_ >= s_.size()) return n;
      int lo = 0, hi = -1;
      const char c = s_[i_];
      if (c == '*') {
        ++i_;
      } else if (c == '+') {
        ++i_, lo = 1;
      } else if (c == '?') {
        ++i_, hi = 1;
      } else if (c == '{') {
        ++i_;
        skip();
        lo = hi = number();
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          skip();
          hi = (i_ < s_.size() && s_[i_] == '}') ? -1 : number();
          skip();
        }
        KILN_CHECK(i_ < s_.size() && s_[i_] == '}', "ebnf: expected `}` at offset ", i_);
        ++i_;
        KILN_CHECK(hi < 0 || hi >= lo, "ebnf: repetition {", lo, ",", hi, "} has max below min");
      } else {
        return n;
      }
      Node r{Node::Kind::repeat, {}, {}, {}, lo, hi, i_};
      r.kids.push_back(std::move(n));
      n = std::move(r);
    }
  }

  uint32_t escape() {  // after a backslash, inside a string or a class
    KILN_CHECK(i_ < s_.size(), "ebnf: trailing backslash");
    const char c = s_[i_++];
    auto hexn = [&](int n) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        KILN_CHECK(i_ < s_.size() && std::isxdigit(uint8_t(s_[i_])), "ebnf: bad hex escape at offset ", i_);
        const char h = s_[i_++];
        v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 32) - 'a' + 10);
      }
      KILN_CHECK(v <= 0x10FFFF, "ebnf: code point out of range");
      return v;
    };
    switch (c) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '0':
        return 0;
      case 'x':
        return hexn(2);
      case 'u':
        return hexn(4);
      case 'U':
        return hexn(8);
      default:
        return uint8_t(c);
    }
  }

  Node primary(int depth) {
    const size_t at = i_;
    const char c = s_[i_];
    if (c == '"') {
      ++i_;
      std::string bytes;
      while (i_ < s_.size() && s_[i_] != '"') {
        if (s_[i_] == '\\') {
          ++i_;
          append_utf8(escape(), bytes);
        } else {
          bytes += s_[i_++];
        }
      }
      KILN_CHECK(i_ < s_.size(), "ebnf: unterminated string at offset ", at);
      ++i_;
      return {Node::Kind::terminal, {}, re_bytes(bytes), {}, 0, -1, at};
    }
    if (c == '[') {
      // The class is handed to the regex parser, which shares this syntax (ranges, negation, escapes).
      size_t j = i_ + 1;
      while (j < s_.size() && s_[j] != ']') j += (s_[j] == '\\') ? 2 : 1;
      KILN_CHECK(j < s_.size(), "ebnf: unterminated character class at offset ", at);
      std::string cls(s_.substr(i_, j + 1 - i_));
      i_ = j + 1;
      return {Node::Kind::terminal, {}, parse_regex(cls, false), {}, 0, -1, at};
    }
    if (c == '(') {
      ++i_;
      Node n = alternatives(depth + 1);
      skip();
      KILN_CHECK(i_ < s_.size() && s_[i_] == ')', "ebnf: missing `)` for the group at offset ", at);
      ++i_;
      return n;
    }
    if (c == '.') {
      ++i_;
      return {Node::Kind::terminal, {}, parse_regex("[\\s\\S]", false), {}, 0, -1, at};
    }
    std::string name = ident();
    KILN_CHECK(!name.empty(), "ebnf: unexpected `", c, "` at offset ", at);
    return {Node::Kind::ref, {}, {}, name, 0, -1, at};
  }
};

class Lowering {
 public:
  Grammar run(std::vector<std::pair<std::string, Node>> rules) {
    for (auto& [name, node] : rules) {
      KILN_CHECK(!ids_.count(name), "ebnf: rule `", name, "` is defined twice");
      ids_[name] = b_.new_rule(name);
    }
    KILN_CHECK(ids_.count("root"), "ebnf: no `root` rule");
    for (auto& [name, node] : rules) add_alts(ids_[name], node);
    return b_.finish(ids_["root"]);
  }

 private:
  GrammarBuilder b_;
  std::map<std::string, uint32_t> ids_;
  int helpers_ = 0;

  static bool regular(const Node& n) {
    if (n.kind == Node::Kind::ref) return false;
    for (const auto& k : n.kids)
      if (!regular(k)) return false;
    return true;
  }
  static Re to_re(const Node& n) {
    switch (n.kind) {
      case Node::Kind::terminal:
        return n.re;
      case Node::Kind::repeat:
        return re_repeat(to_re(n.kids[0]), n.min, n.max);
      default: {
        std::vector<Re> kids;
        for (const auto& k : n.kids) kids.push_back(to_re(k));
        if (kids.empty()) return Re{};
        return n.kind == Node::Kind::alt ? re_alt(std::move(kids)) : re_concat(std::move(kids));
      }
    }
  }
  void add_alts(uint32_t rule, const Node& n) {
    if (n.kind == Node::Kind::alt) {
      for (const auto& k : n.kids) b_.add_alt(rule, elements(k));
    } else {
      b_.add_alt(rule, elements(n));
    }
  }
  uint32_t helper(const std::string& why) { return b_.new_rule(why + "#" + std::to_string(helpers_++)); }

  // The element sequence of one alternative.
  std::vector<Element> elements(const Node& n) {
    std::vector<Element> out;
    if (n.kind != Node::Kind::seq) {
      append(n, out);
      return out;
    }
    std::vector<Re> run;  // consecutive regular items: one lexeme
    auto flush = [&] {
      if (!run.empty()) out.push_back(b_.lexeme(re_concat(std::move(run))));
      run.clear();
    };
    for (const auto& k : n.kids) {
      if (regular(k)) {
        run.push_back(to_re(k));
      } else {
        flush();
        append(k, out);
      }
    }
    flush();
    return out;
  }

  void append(const Node& n, std::vector<Element>& out) {
    if (regular(n)) {
      out.push_back(b_.lexeme(to_re(n)));
      return;
    }
    switch (n.kind) {
      case Node::Kind::ref: {
        auto it = ids_.find(n.name);
        KILN_CHECK(it != ids_.end(), "ebnf: undefined rule `", n.name, "` at offset ", n.offset);
        out.push_back(b_.call(it->second));
        return;
      }
      case Node::Kind::seq: {
        auto e = elements(n);
        out.insert(out.end(), e.begin(), e.end());
        return;
      }
      case Node::Kind::alt: {
        const uint32_t h = helper("group");
        add_alts(h, n);
        out.push_back(b_.call(h));
        return;
      }
      case Node::Kind::repeat: {
        const Node& kid = n.kids[0];
        for (int i = 0; i < n.min; ++i) append(kid, out);
        if (n.max < 0) {  // star: h ::= kid h | ε
          const uint32_t h = helper("star");
          auto body = elements(kid);
          body.push_back(b_.call(h));
          b_.add_alt(h, body);
          b_.add_alt(h, {});
          out.push_back(b_.call(h));
        } else if (n.max > n.min) {  // nested optionals: h_k ::= kid h_{k-1} | ε
          uint32_t inner = helper("opt");
          b_.add_alt(inner, elements(kid));
          b_.add_alt(inner, {});
          for (int k = n.min + 1; k < n.max; ++k) {
            const uint32_t h = helper("opt");
            auto body = elements(kid);
            body.push_back(b_.call(inner));
            b_.add_alt(h, body);
            b_.add_alt(h, {});
            inner = h;
          }
          out.push_back(b_.call(inner));
        }
        return;
      }
      case Node::Kind::terminal:
        return;  // regular: handled above
    }
  }
};

}  // namespace

Grammar ebnf_grammar(std::string_view text) {
  EbnfParser p(text);
  Lowering l;
  return l.run(p.parse());
}

}  // namespace kiln::grammar
