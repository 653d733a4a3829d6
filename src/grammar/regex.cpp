#include "grammar/regex.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::grammar {

constexpr uint32_t kMaxCp = 0x10FFFF;

void CharSet::add(uint32_t lo, uint32_t hi) {
  if (lo <= hi) ranges.push_back({lo, std::min(hi, kMaxCp)});
}
void CharSet::add(const CharSet& o) {
  ranges.insert(ranges.end(), o.ranges.begin(), o.ranges.end());
}
void CharSet::normalize() {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto r : ranges) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  ranges = std::move(out);
}
CharSet CharSet::complement() const {
  CharSet c = *this;
  c.normalize();
  CharSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : c.ranges) {
    if (lo > next) out.add(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCp) out.add(next, kMaxCp);
  return out;
}

Re re_chars(CharSet s) {
  Re r;
  r.kind = Re::Kind::chars;
  s.normalize();
  r.set = std::move(s);
  return r;
}
Re re_bytes(std::string_view b) {
  Re r;
  r.kind = Re::Kind::bytes;
  r.bytes = std::string(b);
  return r;
}
Re re_concat(std::vector<Re> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Re r;
  r.kind = Re::Kind::concat;
  r.kids = std::move(kids);
  return r;
}
Re re_alt(std::vector<Re> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Re r;
  r.kind = Re::Kind::alt;
  r.kids = std::move(kids);
  return r;
}
Re re_repeat(Re kid, int min, int max) {
  Re r;
  r.kind = Re::Kind::repeat;
  r.kids.push_back(std::move(kid));
  r.min = min;
  r.max = max;
  return r;
}
bool re_nullable(const Re& r) {
  switch (r.kind) {
    case Re::Kind::empty:
      return true;
    case Re::Kind::chars:
      return false;
    case Re::Kind::bytes:
      return r.bytes.empty();
    case Re::Kind::concat:
      return std::all_of(r.kids.begin(), r.kids.end(), [](const Re& k) { return re_nullable(k); });
    case Re::Kind::alt:
      return std::any_of(r.kids.begin(), r.kids.end(), [](const Re& k) { return re_nullable(k); });
    case Re::Kind::repeat:
      return r.min == 0 || re_nullable(r.kids[0]);
  }
  return false;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] into ranges whose UTF-8 encodings are byte-wise ranges of equal length.
void utf8_split(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) utf8_split(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_split(0xE000, hi, out);
    return;
  }
  static const uint32_t kMaxOfLen[3] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t m : kMaxOfLen)
    if (lo <= m && hi > m) {
      utf8_split(lo, m, out);
      utf8_split(m + 1, hi, out);
      return;
    }
  if (hi < 0x80) {
    out.push_back({{uint8_t(lo), uint8_t(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(lo, a);
  append_utf8(hi, b);
  ByteRanges seq;
  for (size_t i = 0; i < a.size(); ++i) seq.push_back({uint8_t(a[i]), uint8_t(b[i])});
  out.push_back(seq);
}

Frag emit_seq(Nfa& nfa, const ByteRanges& seq, Frag f) {
  uint32_t cur = f.start;
  for (size_t i = 0; i < seq.size(); ++i) {
    const uint32_t to = i + 1 == seq.size() ? f.end : nfa.add_state();
    nfa.add_edge(cur, seq[i].first, seq[i].second, to);
    cur = to;
  }
  return f;
}

Frag emit_literal(Nfa& nfa, std::string_view s, Frag f) {
  ByteRanges seq;
  for (char c : s) seq.push_back({uint8_t(c), uint8_t(c)});
  if (seq.empty()) {
    nfa.add_eps(f.start, f.end);
    return f;
  }
  return emit_seq(nfa, seq, f);
}

const char* json_short_escape(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      return nullptr;
  }
}

Frag emit_chars(Nfa& nfa, const CharSet& set, bool json_escape, Frag f) {
  CharSet plain;
  for (auto [lo, hi] : set.ranges) {
    if (!json_escape) {
      plain.add(lo, hi);
      continue;
    }
    for (uint32_t cp = lo; cp <= std::min(hi, 0x5Cu); ++cp) {  // the escaped ones all lie below 0x5D
      if (cp >= 0x20 && cp != '"' && cp != '\\') continue;
      if (const char* e = json_short_escape(cp)) {
        emit_literal(nfa, e, f);
      } else {  // \u00XX, hex digits in either case
        const uint32_t a = nfa.add_state(), b = nfa.add_state(), c = nfa.add_state(), d = nfa.add_state();
        emit_literal(nfa, "\\u00", {f.start, a});
        const char hex[] = "0123456789abcdef";
        const char hi_d = hex[cp >> 4], lo_d = hex[cp & 15];
        nfa.add_edge(a, uint8_t(hi_d), uint8_t(hi_d), b);
        nfa.add_edge(b, uint8_t(lo_d), uint8_t(lo_d), c);
        if (lo_d >= 'a') nfa.add_edge(b, uint8_t(lo_d - 32), uint8_t(lo_d - 32), c);
        nfa.add_eps(c, d);
        nfa.add_eps(d, f.end);
      }
    }
    CharSet drop;
    drop.add(0, 0x1F), drop.add('"', '"'), drop.add('\\', '\\');
    CharSet allowed = drop.complement();  // the characters a JSON string holds as they are
    for (auto [a, b] : allowed.ranges) {
      const uint32_t x = std::max(a, lo), y = std::min(b, hi);
      if (x <= y) plain.add(x, y);
    }
  }
  plain.normalize();
  std::vector<ByteRanges> seqs;
  for (auto [lo, hi] : plain.ranges) utf8_split(lo, hi, seqs);
  for (const auto& s : seqs) emit_seq(nfa, s, f);
  return f;
}

Frag emit_into(Nfa& nfa, const Re& r, bool json, Frag f) {
  switch (r.kind) {
    case Re::Kind::empty:
      nfa.add_eps(f.start, f.end);
      return f;
    case Re::Kind::chars:
      return emit_chars(nfa, r.set, json, f);
    case Re::Kind::bytes:
      return emit_literal(nfa, r.bytes, f);
    case Re::Kind::alt:
      for (const auto& k : r.kids) emit_into(nfa, k, json, f);
      return f;
    case Re::Kind::concat: {
      uint32_t cur = f.start;
      for (size_t i = 0; i < r.kids.size(); ++i) {
        const uint32_t to = i + 1 == r.kids.size() ? f.end : nfa.add_state();
        emit_into(nfa, r.kids[i], json, {cur, to});
        cur = to;
      }
      if (r.kids.empty()) nfa.add_eps(f.start, f.end);
      return f;
    }
    case Re::Kind::repeat: {
      uint32_t cur = f.start;
      for (int i = 0; i < r.min; ++i) {
        const uint32_t to = nfa.add_state();
        emit_into(nfa, r.kids[0], json, {cur, to});
        cur = to;
      }
      if (r.max < 0) {  // a loop state: the kid from it back to it
        const uint32_t loop = nfa.add_state(), body = nfa.add_state();
        nfa.add_eps(cur, loop);
        nfa.add_eps(loop, body);
        const uint32_t back = nfa.add_state();
        emit_into(nfa, r.kids[0], json, {body, back});
        nfa.add_eps(back, loop);
        nfa.add_eps(loop, f.end);
      } else {
        for (int i = r.min; i < r.max; ++i) {  // each optional copy may end the repetition
          nfa.add_eps(cur, f.end);
          const uint32_t to = nfa.add_state();
          emit_into(nfa, r.kids[0], json, {cur, to});
          cur = to;
        }
        nfa.add_eps(cur, f.end);
      }
      return f;
    }
  }
  return f;
}

}  // namespace

Frag emit_re(Nfa& nfa, const Re& r, bool json_escape) {
  const Frag f{nfa.add_state(), nfa.add_state()};
  return emit_into(nfa, r, json_escape, f);
}

Dfa compile_re(const Re& r, bool json_escape) {
  Nfa nfa;
  const Frag f = emit_re(nfa, r, json_escape);
  return determinize(nfa, f);
}

}  // namespace kiln::grammar
