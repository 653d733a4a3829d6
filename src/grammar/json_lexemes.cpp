// JSON lexemes: whitespace, strings, numbers (with bounds), and string formats, as regular expressions.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "grammar/front_ends.h"

namespace kiln::grammar {

namespace {

Re rx(std::string_view src) {
  return parse_regex(src, false);
}

// Decimal strings of equal length, lo <= hi: a regex for the integers between them (no leading zeros
// unless lo starts with them, which callers arrange only for the lone "0").
std::string digits_between(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 0) return "";
  if (lo == hi) return lo;
  if (lo[0] == hi[0]) return lo[0] + digits_between(lo.substr(1), hi.substr(1));
  const std::string all0(n - 1, '0'), all9(n - 1, '9');
  const std::string any = n > 1 ? "[0-9]{" + std::to_string(n - 1) + "}" : "";
  if (lo.substr(1) == all0 && hi.substr(1) == all9) return std::string("[") + lo[0] + "-" + hi[0] + "]" + any;
  std::string out = "(?:" + std::string(1, lo[0]) + digits_between(lo.substr(1), all9);
  if (hi[0] - lo[0] > 1) out += std::string("|[") + char(lo[0] + 1) + "-" + char(hi[0] - 1) + "]" + any;
  out += "|" + std::string(1, hi[0]) + digits_between(all0, hi.substr(1)) + ")";
  return out;
}

// Non-negative integers in [lo, hi] (hi < 0: unbounded).
std::string uint_range(int64_t lo, int64_t hi) {
  const std::string a = std::to_string(lo);
  std::string out;
  auto add = [&](const std::string& p) { out += (out.empty() ? "" : "|") + p; };
  if (hi < 0) {
    add(digits_between(a, std::string(a.size(), '9')));
    add("[1-9][0-9]{" + std::to_string(a.size()) + ",}");
    return "(?:" + out + ")";
  }
  const std::string b = std::to_string(hi);
  for (size_t len = a.size(); len <= b.size(); ++len) {
    const std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string to = len == b.size() ? b : std::string(len, '9');
    add(digits_between(from, to));
  }
  return "(?:" + out + ")";
}

// A decimal bound split into integer digits and fraction digits (trailing zeros dropped).
struct Decimal {
  bool negative = false;
  std::string int_part, frac;
};
Decimal parse_decimal(const std::string& text, const char* keyword) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  while (i < text.size() && std::isdigit(uint8_t(text[i]))) d.int_part += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(uint8_t(text[i]))) d.frac += text[i++];
  }
  // Exponents and magnitudes past 1e18 are refused by name rather than approximated.
  if (i != text.size() || d.int_part.empty() || d.int_part.size() > 18) throw UnsupportedKeyword(keyword);
  while (d.int_part.size() > 1 && d.int_part[0] == '0') d.int_part.erase(0, 1);
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  if (d.int_part == "0" && d.frac.empty()) d.negative = false;
  return d;
}

// Non-empty digit strings d with 0.d >= 0.b (> when excl); b has no trailing zeros.
std::string frac_digits_ge(const std::string& b, bool excl) {
  if (b.empty()) return excl ? "[0-9]*[1-9][0-9]*" : "[0-9]+";
  std::string out;
  if (b[0] < '9') out += std::string("[") + char(b[0] + 1) + "-9][0-9]*|";
  const std::string rest = b.substr(1);
  out += std::string(1, b[0]) +
         (rest.empty() ? (excl ? "[0-9]*[1-9][0-9]*" : "[0-9]*") : frac_digits_ge(rest, excl));
  return "(?:" + out + ")";
}
// Optional fractions (?:\.d)? with value <= 0.b (< when excl).
std::string frac_le(const std::string& b, bool excl);
// Non-empty digit strings d with 0.d <= 0.b (< when excl); b non-empty, no trailing zeros.
std::string frac_digits_le(const std::string& b, bool excl) {
  std::string out;
  if (b[0] > '0') out += std::string("[0-") + char(b[0] - 1) + "][0-9]*|";
  const std::string rest = b.substr(1);
  if (rest.empty())
    out += excl ? std::string("") : std::string(1, b[0]) + "0*";
  else
    out += std::string(1, b[0]) + "(?:" + frac_digits_le(rest, excl) + "|0*)";
  if (!out.empty() && out.back() == '|') out.pop_back();
  return out.empty() ? "[]" : "(?:" + out + ")";
}
std::string frac_le(const std::string& b, bool excl) {
  if (b.empty()) return excl ? "[]" : "(?:\\.0+)?";
  return "(?:\\." + frac_digits_le(b, excl) + ")?";
}
std::string frac_ge(const std::string& b, bool excl) {
  if (b.empty() && !excl) return "(?:\\.[0-9]+)?";
  return "\\." + frac_digits_ge(b, excl);
}
int64_t to_int(const std::string& digits) {
  return std::stoll(digits);
}

// Number texts (no exponent) with value >= d (> when excl).
std::string at_least(const Decimal& d, bool excl) {
  const std::string any = "(?:\\.[0-9]+)?";
  const int64_t i = to_int(d.int_part);
  if (!d.negative)
    return "(?:" + uint_range(i + 1, -1) + any + "|" + d.int_part + frac_ge(d.frac, excl) + ")";
  // Every non-negative number, and negatives of magnitude <= |d|.
  std::string out = "(?:" + uint_range(0, -1) + any;
  if (i > 0) out += "|-" + uint_range(0, i - 1) + any;
  return out + "|-" + d.int_part + frac_le(d.frac, excl) + ")";
}
// Number texts (no exponent) with value <= d (< when excl).
std::string at_most(const Decimal& d, bool excl) {
  const std::string any = "(?:\\.[0-9]+)?";
  const int64_t i = to_int(d.int_part);
  if (d.negative)
    return "(?:-" + uint_range(i + 1, -1) + any + "|-" + d.int_part + frac_ge(d.frac, excl) + ")";
  std::string out = "(?:-" + uint_range(0, -1) + any;
  if (i > 0) out += "|" + uint_range(0, i - 1) + any;
  return out + "|" + d.int_part + frac_le(d.frac, excl) + ")";
}

}  // namespace

Re json_ws_re(int max_whitespace) {
  CharSet ws;
  ws.add(' ', ' '), ws.add('\t', '\t'), ws.add('\n', '\n'), ws.add('\r', '\r');
  return re_repeat(re_chars(ws), 0, max_whitespace);
}

Re json_string_char_re() {
  return rx("[^\"\\\\\\x00-\\x1f]|\\\\([\"\\\\/bfnrt]|u[0-9a-fA-F]{4})");
}

Re json_string_re(int min_chars, int max_chars) {
  return re_concat({re_bytes("\""), re_repeat(json_string_char_re(), min_chars, max_chars), re_bytes("\"")});
}

Dfa json_string_dfa(int min_chars, int max_chars) {
  // Built directly from the one-character DFA, copy k for "k characters written": the subset construction
  // of the unrolled regex costs ~10x more for maxLength in the tens.
  static const Dfa kChar = compile_re(json_string_char_re());
  const int32_t c0 = kChar.start;
  int32_t fin = -1;
  for (size_t q = 0; q < kChar.num_states(); ++q)
    if (kChar.accepting[q]) {
      if (fin >= 0 || kChar.has_out[q]) return compile_re(json_string_re(min_chars, max_chars));
      fin = int32_t(q);
    }
  // Columns: the character DFA's byte classes, with `"` in a column of its own (it also closes the string).
  std::array<uint8_t, 256> col = kChar.byte_class;
  uint32_t nc = kChar.n_classes;
  const uint8_t quote_col = uint8_t(nc++);
  col['"'] = quote_col;
  std::array<uint8_t, 256> rep{};  // a byte of each column
  for (int b = 255; b >= 0; --b) rep[col[size_t(b)]] = uint8_t(b);
  const int copies = max_chars < 0 ? min_chars + 1 : max_chars + 1;
  const int32_t per = int32_t(kChar.num_states());
  // States: 0 before the opening quote, 1 after the closing one, then copies x per.
  auto id = [&](int k, int32_t q) { return 2 + k * per + q; };
  const size_t n = size_t(2 + copies * per);
  std::vector<int32_t> next(n * nc, -1);
  std::vector<uint8_t> acc(n, 0);
  acc[1] = 1;
  next[quote_col] = id(0, c0);
  for (int k = 0; k < copies; ++k) {
    for (int32_t q = 0; q < per; ++q) {
      if (q == fin) continue;
      for (uint32_t c = 0; c < nc; ++c) {
        const int32_t t = kChar.step(q, rep[c]);
        if (t < 0) continue;
        int32_t to;
        if (t == fin) {
          const int nk = max_chars < 0 ? std::min(k + 1, min_chars) : k + 1;
          to = nk < copies ? id(nk, c0) : -1;
        } else {
          to = id(k, t);
        }
        next[size_t(id(k, q)) * nc + c] = to;
      }
    }
    if (k >= min_chars) next[size_t(id(k, c0)) * nc + quote_col] = 1;
  }
  return dfa_from_table(next, acc, col, nc);
}

Re json_number_re(bool integer) {
  return rx(integer ? "-?(0|[1-9][0-9]*)" : "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
}

Dfa json_bounded_number_dfa(bool integer, const NumberBounds& b) {
  if (!b.has_min && !b.has_max) return compile_re(json_number_re(integer));
  std::string out;
  auto add = [&](const std::string& p) {
    if (!p.empty()) out += (out.empty() ? "" : "|") + p;
  };
  if (integer) {
    // Integer bounds: round inward, then split at zero.
    const bool has_lo = b.has_min, has_hi = b.has_max;
    int64_t lo = 0, hi = 0;
    if (has_lo) {
      if (!(std::fabs(b.min) <= 1e18))
        throw UnsupportedKeyword(b.min_exclusive ? "exclusiveMinimum" : "minimum");
      lo = int64_t(b.min_exclusive ? std::floor(b.min) + 1 : std::ceil(b.min));
    }
    if (has_hi) {
      if (!(std::fabs(b.max) <= 1e18))
        throw UnsupportedKeyword(b.max_exclusive ? "exclusiveMaximum" : "maximum");
      hi = int64_t(b.max_exclusive ? std::ceil(b.max) - 1 : std::floor(b.max));
    }
    const int64_t from = has_lo ? std::max<int64_t>(lo, 0) : 0;
    if (!has_hi || hi >= from) add(uint_range(from, has_hi ? hi : -1));
    if (!has_lo || lo < 0) {  // negatives -1 down to lo
      const int64_t top = has_hi ? std::min<int64_t>(hi, -1) : -1;
      if (!has_lo || lo <= top) add("-" + uint_range(-top, has_lo ? -lo : -1));
    }
    if (out.empty()) return Dfa{};  // an empty range: nothing matches
    return compile_re(rx(out));
  }
  // Numbers: the texts above the lower bound intersected with those below the upper one (no exponent).
  Dfa d = compile_re(
      rx(b.has_min ? at_least(parse_decimal(b.min_text, b.min_exclusive ? "exclusiveMinimum" : "minimum"),
                              b.min_exclusive)
                   : "-?(0|[1-9][0-9]*)(\\.[0-9]+)?"));
  if (b.has_max)
    d = dfa_intersection(
        d, compile_re(rx(at_most(parse_decimal(b.max_text, b.max_exclusive ? "exclusiveMaximum" : "maximum"),
                                 b.max_exclusive))));
  return d;
}

Re json_format_re(std::string_view format) {
  const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  const std::string time =
      "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  const std::string label = "[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?";
  const std::string host = label + "(\\." + label + ")*";
  const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  const std::string atext = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]";
  if (format == "date") return rx(date);
  if (format == "time") return rx(time);
  if (format == "date-time") return rx(date + "[Tt]" + time);
  if (format == "uuid")
    return rx("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}");
  if (format == "email") return rx(atext + "+(\\." + atext + "+)*@" + host);
  if (format == "hostname") return rx(host);
  if (format == "ipv4") return rx(octet + "(\\." + octet + "){3}");
  if (format == "uri") return rx("[a-zA-Z][a-zA-Z0-9+.-]*:[^\\s\"\\\\<>^`{|}\\x00-\\x1f]*");
  if (format == "duration")
    return rx("P(([0-9]+Y)?([0-9]+M)?([0-9]+W)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+(\\.[0-9]+)?S)?)?)");
  throw UnsupportedKeyword("format");
}

}  // namespace kiln::grammar
