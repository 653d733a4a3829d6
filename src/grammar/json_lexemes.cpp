// JSON lexemes: whitespace, strings, numbers (with bounds), and string formats, as regular expressions.
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

int64_t as_int_bound(double v, const char* keyword) {
  if (!(std::fabs(v) <= 1e18) || v != std::floor(v)) throw UnsupportedKeyword(keyword);
  return int64_t(v);
}

// Texts `D[.F]` (no sign, no exponent) of values x with lo <(=) x <(=) hi; hi_open: no upper bound.
std::string nonneg_number(int64_t lo, bool lo_excl, int64_t hi, bool hi_excl, bool hi_open) {
  const std::string any = "(?:\\.[0-9]+)?", zero = "(?:\\.0+)?", nonzero = "\\.[0-9]*[1-9][0-9]*";
  std::string out;
  auto add = [&](const std::string& p) { out += (out.empty() ? "" : "|") + p; };
  if (!hi_open && hi == lo) {
    if (!lo_excl && !hi_excl) add(std::to_string(lo) + zero);
  } else {
    add(std::to_string(lo) + (lo_excl ? nonzero : any));
    if (hi_open)
      add(uint_range(lo + 1, -1) + any);
    else if (hi - 1 >= lo + 1)
      add(uint_range(lo + 1, hi - 1) + any);
    if (!hi_open && !hi_excl) add(std::to_string(hi) + zero);
  }
  return out.empty() ? "" : "(?:" + out + ")";
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

Re json_number_re(bool integer) {
  return rx(integer ? "-?(0|[1-9][0-9]*)" : "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
}

Re json_bounded_number_re(bool integer, const NumberBounds& b) {
  if (!b.has_min && !b.has_max) return json_number_re(integer);
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
    if (out.empty()) return re_chars(CharSet{});  // an empty range: nothing matches
    return rx(out);
  }
  const char* lo_kw = b.min_exclusive ? "exclusiveMinimum" : "minimum";
  const char* hi_kw = b.max_exclusive ? "exclusiveMaximum" : "maximum";
  const int64_t lo = b.has_min ? as_int_bound(b.min, lo_kw) : 0;
  const int64_t hi = b.has_max ? as_int_bound(b.max, hi_kw) : 0;
  if (b.has_min && b.has_max && (lo > hi || (lo == hi && (b.min_exclusive || b.max_exclusive))))
    return re_chars(CharSet{});
  // Non-negative side: x >= max(lo, 0).
  if (!b.has_max || hi >= 0) {
    const bool from_zero = !b.has_min || lo < 0;
    add(nonneg_number(from_zero ? 0 : lo, from_zero ? false : b.min_exclusive, hi, b.max_exclusive,
                      !b.has_max));
  }
  // Negative side: x = -y, y > 0, -hi <= y <= -lo.
  if (!b.has_min || lo < 0) {
    const bool from_zero = !b.has_max || hi >= 0;
    const int64_t ylo = from_zero ? 0 : -hi;
    const bool ylo_excl = from_zero ? true : b.max_exclusive;
    const std::string neg = nonneg_number(ylo, ylo_excl, b.has_min ? -lo : 0, b.min_exclusive, !b.has_min);
    if (!neg.empty()) add("-" + neg);
  }
  if (out.empty()) return re_chars(CharSet{});
  return rx(out);
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
