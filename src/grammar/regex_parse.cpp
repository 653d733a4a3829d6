// The regex parser (dialect: regex.h).
#include <algorithm>
#include <cctype>

#include "grammar/regex.h"
#include "kiln/error.h"

namespace kiln::grammar {

namespace {

constexpr int kMaxRepeat = 10000;

CharSet range(uint32_t lo, uint32_t hi) {
  CharSet s;
  s.add(lo, hi);
  return s;
}
CharSet digit_set() {
  return range('0', '9');
}
CharSet word_set() {
  CharSet s;
  s.add('0', '9'), s.add('A', 'Z'), s.add('a', 'z'), s.add('_', '_');
  return s;
}
CharSet space_set() {
  CharSet s;
  s.add('\t', '\r'), s.add(' ', ' '), s.add(0xA0, 0xA0), s.add(0x1680, 0x1680), s.add(0x2000, 0x200A);
  s.add(0x2028, 0x2029), s.add(0x202F, 0x202F), s.add(0x205F, 0x205F), s.add(0x3000, 0x3000);
  s.add(0xFEFF, 0xFEFF);
  s.normalize();
  return s;
}

class Parser {
 public:
  Parser(std::string_view p) : p_(p) {}

  // Top level: alternatives, each possibly anchored at its ends.
  Re parse_top(bool search) {
    std::vector<Re> alts;
    for (;;) {
      bool start_anchor = false, end_anchor = false;
      if (peek('^')) ++i_, start_anchor = true;
      std::vector<Re> seq;
      while (i_ < p_.size() && p_[i_] != '|') {
        if (p_[i_] == '$') {
          ++i_;
          KILN_CHECK(i_ == p_.size() || p_[i_] == '|',
                     "pattern: `$` inside the expression is not supported (only at the end)");
          end_anchor = true;
          break;
        }
        KILN_CHECK(p_[i_] != ')', "pattern: unbalanced `)` at offset ", i_);
        seq.push_back(parse_repeat());
      }
      Re body = re_concat(std::move(seq));
      if (body.kind == Re::Kind::concat && body.kids.empty()) body = Re{};
      if (search) {
        std::vector<Re> parts;
        if (!start_anchor) parts.push_back(re_repeat(re_chars(range(0, kMaxCpCopy)), 0, -1));
        parts.push_back(std::move(body));
        if (!end_anchor) parts.push_back(re_repeat(re_chars(range(0, kMaxCpCopy)), 0, -1));
        body = re_concat(std::move(parts));
      }
      alts.push_back(std::move(body));
      if (i_ == p_.size()) break;
      ++i_;  // '|'
    }
    return re_alt(std::move(alts));
  }

 private:
  static constexpr uint32_t kMaxCpCopy = 0x10FFFF;
  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;

  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }

  Re parse_alt() {
    std::vector<Re> alts;
    for (;;) {
      std::vector<Re> seq;
      while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
        KILN_CHECK(p_[i_] != '^' && p_[i_] != '$', "pattern: anchor `", p_[i_],
                   "` inside the expression is not supported (only at the ends)");
        seq.push_back(parse_repeat());
      }
      alts.push_back(seq.empty() ? Re{} : re_concat(std::move(seq)));
      if (!peek('|')) break;
      ++i_;
    }
    return re_alt(std::move(alts));
  }

  bool parse_int(int& out) {
    const size_t s = i_;
    int64_t v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9' && v <= kMaxRepeat) v = v * 10 + (p_[i_++] - '0');
    if (i_ == s) return false;
    KILN_CHECK(v <= kMaxRepeat, "pattern: repetition count above ", kMaxRepeat, " (the limit)");
    out = int(v);
    return true;
  }

  Re parse_repeat() {
    Re atom = parse_atom();
    for (;;) {
      int lo = 0, hi = -1;
      if (peek('*')) {
        ++i_;
      } else if (peek('+')) {
        ++i_, lo = 1;
      } else if (peek('?')) {
        ++i_, hi = 1;
      } else if (peek('{')) {
        const size_t save = i_++;
        if (!parse_int(lo)) {  // ECMA: a `{` that starts no quantifier is a literal
          i_ = save;
          return atom;
        }
        hi = lo;
        if (peek(',')) {
          ++i_;
          hi = -1;
          parse_int(hi);
        }
        if (!peek('}')) {
          i_ = save;
          return atom;
        }
        ++i_;
        KILN_CHECK(hi < 0 || hi >= lo, "pattern: quantifier {", lo, ",", hi, "} has max below min");
      } else {
        return atom;
      }
      if (peek('?')) ++i_;  // lazy: the same language
      if (re_nullable(atom) && hi < 0) {
        // (x?)* and friends: the nullable part adds nothing to the loop's language; keep the loop ε-free.
        atom = re_repeat(strip_nullable(std::move(atom)), 0, -1);
        continue;
      }
      atom = re_repeat(std::move(atom), lo, hi);
    }
  }

  // A language L' with L' ∪ {ε} = L ∪ {ε}, built so that L' has no ε (used under an unbounded loop).
  static Re strip_nullable(Re r) {
    if (!re_nullable(r)) return r;
    switch (r.kind) {
      case Re::Kind::repeat:
        if (r.max < 0 || r.max > 1) return re_repeat(strip_nullable(std::move(r.kids[0])), 1, r.max);
        return strip_nullable(std::move(r.kids[0]));
      case Re::Kind::alt: {
        std::vector<Re> kids;
        for (auto& k : r.kids)
          if (!(k.kind == Re::Kind::empty || (k.kind == Re::Kind::concat && k.kids.empty())))
            kids.push_back(re_nullable(k) ? strip_nullable(std::move(k)) : std::move(k));
        if (kids.empty()) return re_chars(CharSet{});
        return re_alt(std::move(kids));
      }
      case Re::Kind::concat:
        KILN_FAIL("pattern: a repeated group whose every part may be empty is not supported");
      default:
        return re_chars(CharSet{});  // empty: nothing but ε
    }
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      KILN_CHECK(i_ < p_.size() && std::isxdigit(uint8_t(p_[i_])), "pattern: bad hex escape at offset ", i_);
      const char c = p_[i_++];
      v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    return v;
  }

  uint32_t utf8_char() {
    const uint8_t c = uint8_t(p_[i_]);
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    KILN_CHECK(c < 0x80 || (c >= 0xC2 && c <= 0xF4), "pattern: invalid UTF-8 at offset ", i_);
    KILN_CHECK(i_ + size_t(n) <= p_.size(), "pattern: truncated UTF-8 at offset ", i_);
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      const uint8_t d = uint8_t(p_[i_ + size_t(k)]);
      KILN_CHECK((d & 0xC0) == 0x80, "pattern: invalid UTF-8 at offset ", i_);
      cp = (cp << 6) | (d & 0x3F);
    }
    i_ += size_t(n);
    return cp;
  }

  // One escape after `\`; in_class: inside [...] (where \b is backspace). Returns a set.
  CharSet parse_escape(bool in_class) {
    KILN_CHECK(i_ < p_.size(), "pattern: trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        return digit_set();
      case 'D':
        return digit_set().complement();
      case 'w':
        return word_set();
      case 'W':
        return word_set().complement();
      case 's':
        return space_set();
      case 'S':
        return space_set().complement();
      case 'n':
        return range('\n', '\n');
      case 'r':
        return range('\r', '\r');
      case 't':
        return range('\t', '\t');
      case 'f':
        return range('\f', '\f');
      case 'v':
        return range('\v', '\v');
      case '0':
        return range(0, 0);
      case 'x': {
        const uint32_t v = hex(2);
        return range(v, v);
      }
      case 'u': {
        uint32_t v;
        if (peek('{')) {
          ++i_;
          v = 0;
          int n = 0;
          while (i_ < p_.size() && p_[i_] != '}' && n++ < 6) v = v * 16 + hex(1);
          KILN_CHECK(peek('}') && v <= 0x10FFFF, "pattern: bad \\u{...} escape");
          ++i_;
        } else {
          v = hex(4);
        }
        return range(v, v);
      }
      case 'c': {
        KILN_CHECK(i_ < p_.size() && std::isalpha(uint8_t(p_[i_])), "pattern: bad \\c escape");
        const uint32_t v = uint32_t(p_[i_++]) % 32;
        return range(v, v);
      }
      case 'b':
        KILN_CHECK(in_class, "pattern: word boundary \\b is not supported");
        return range('\b', '\b');
      default:
        break;
    }
    KILN_CHECK(!(c >= '1' && c <= '9'), "pattern: backreference \\", c, " is not supported");
    KILN_CHECK(c != 'B' && c != 'p' && c != 'P' && c != 'k', "pattern: escape \\", c, " is not supported");
    KILN_CHECK(!std::isalnum(uint8_t(c)), "pattern: unknown escape \\", c);
    --i_;
    const uint32_t cp = utf8_char();
    return range(cp, cp);
  }

  CharSet parse_class() {  // after '['
    bool negate = false;
    if (peek('^')) ++i_, negate = true;
    CharSet s;
    for (;;) {
      KILN_CHECK(i_ < p_.size(), "pattern: unterminated character class");
      if (p_[i_] == ']') {
        ++i_;
        break;
      }
      auto single = [&](CharSet& item) -> bool {  // returns whether item is one code point
        if (p_[i_] == '\\') {
          ++i_;
          item = parse_escape(true);
        } else {
          const uint32_t cp = utf8_char();
          item = range(cp, cp);
        }
        return item.ranges.size() == 1 && item.ranges[0].first == item.ranges[0].second;
      };
      CharSet a;
      const bool a_single = single(a);
      if (a_single && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        CharSet b;
        const bool b_single = single(b);
        KILN_CHECK(b_single, "pattern: a class range ends in a class escape");
        KILN_CHECK(a.ranges[0].first <= b.ranges[0].first, "pattern: class range out of order");
        s.add(a.ranges[0].first, b.ranges[0].first);
      } else {
        s.add(a);
      }
    }
    s.normalize();
    return negate ? s.complement() : s;
  }

  Re parse_atom() {
    KILN_CHECK(i_ < p_.size(), "pattern: unexpected end");
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      KILN_CHECK(++depth_ <= 200, "pattern: groups nested deeper than 200 (the limit)");
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          while (i_ < p_.size() && p_[i_] != '>') ++i_;
          KILN_CHECK(peek('>'), "pattern: unterminated group name");
          ++i_;
        } else {
          KILN_FAIL("pattern: lookaround or group flag `(?", (i_ < p_.size() ? p_[i_] : ' '),
                    "` is not supported");
        }
      }
      Re r = parse_alt();
      KILN_CHECK(peek(')'), "pattern: missing `)`");
      ++i_;
      --depth_;
      return r;
    }
    KILN_CHECK(c != '*' && c != '+' && c != '?', "pattern: quantifier `", c, "` with nothing to repeat");
    if (c == '[') {
      ++i_;
      return re_chars(parse_class());
    }
    if (c == '.') {
      ++i_;
      CharSet s;
      s.add('\n', '\n'), s.add('\r', '\r'), s.add(0x2028, 0x2029);
      return re_chars(s.complement());
    }
    if (c == '\\') {
      ++i_;
      return re_chars(parse_escape(false));
    }
    const uint32_t cp = utf8_char();
    return re_chars(range(cp, cp));
  }
};

}  // namespace

Re parse_regex(std::string_view pattern, bool search) {
  Parser p(pattern);
  return p.parse_top(search);
}

}  // namespace kiln::grammar
