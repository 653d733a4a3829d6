#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

#include "kiln/error.h"

namespace kiln::tok {
namespace {

// Length of the valid UTF-8 sequence led by s[i], 0 when it is invalid, or -k (k >= 1) when the input ends
// after k valid bytes of an incomplete sequence. *bad_len gets the length of the maximal invalid subpart.
int seq_len(std::string_view s, size_t i, size_t* bad_len) {
  const auto b = static_cast<uint8_t>(s[i]);
  *bad_len = 1;
  if (b < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + size_t(k) >= s.size()) return -k;
    const auto c = static_cast<uint8_t>(s[i + size_t(k)]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      *bad_len = size_t(k);
      return 0;
    }
  }
  return need + 1;
}

// A code point that starts an NFC-stable segment: canonical combining class 0, no canonical decomposition,
// and never the second half of a canonical composition (marks and conjoining jamo are).
bool nfc_boundary(uint32_t cp) {
  if (cp < 0x300) return true;
  if ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3)) return true;  // CJK, Hangul LV/LVT
  if (cp >= 0x1100 && cp <= 0x11FF) return false;  // conjoining jamo compose with the preceding one
  const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(cp));
  if (p->combining_class != 0) return false;
  if (p->category == UTF8PROC_CATEGORY_MN || p->category == UTF8PROC_CATEGORY_MC ||
      p->category == UTF8PROC_CATEGORY_ME)
    return false;
  // A canonical decomposition (decomp_type 0 with a mapping) means NFC may rewrite it.
  return p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0;
}

void nfc_slow(std::string_view s, std::string& out) {
  utf8proc_uint8_t* res = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &res,
                   utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) KILN_FAIL("NFC normalization failed: ", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(res), size_t(n));
  std::free(res);
}

}  // namespace

size_t utf8_find_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    size_t bad;
    const int l = seq_len(s, i, &bad);
    if (l <= 0) return i;
    i += size_t(l);
  }
  return std::string_view::npos;
}

size_t utf8_lossy_append(std::string_view s, std::string& out, bool final) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < s.size()) {
    size_t bad;
    const int l = seq_len(s, i, &bad);
    if (l > 0) {
      i += size_t(l);
      continue;
    }
    out.append(s.data() + run, i - run);
    if (l < 0) {  // incomplete at the end of the input
      if (!final) return i;
      out.append(kReplacement, 3);
      return s.size();
    }
    out.append(kReplacement, 3);
    i += bad;
    run = i;
  }
  out.append(s.data() + run, i - run);
  return i;
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + size_t(k)]) & 0x3F);
  i += size_t(n);
  return cp;
}

uint32_t utf8_prev(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return utf8_next(s, i);
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

void nfc_append(std::string_view s, std::string& out) {
  // NFC(a + b) == NFC(a) + NFC(b) when b starts at an nfc_boundary code point, so only segments that hold a
  // non-boundary code point (with the boundary before them) need utf8proc.
  size_t copied = 0;  // s[0, copied) is already in out
  size_t start = 0;   // the latest boundary: where a segment that may need NFC begins
  size_t i = 0;
  bool dirty = false;  // s[start, i) holds a non-boundary code point
  while (i < s.size()) {
    const size_t at = i;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
    } else if (!nfc_boundary(utf8_next(s, i))) {
      dirty = true;
      continue;
    }
    if (dirty) {
      out.append(s.data() + copied, start - copied);
      nfc_slow(s.substr(start, at - start), out);
      copied = at;
      dirty = false;
    }
    start = at;
  }
  if (dirty) {
    out.append(s.data() + copied, start - copied);
    nfc_slow(s.substr(start), out);
  } else {
    out.append(s.data() + copied, s.size() - copied);
  }
}

bool is_white_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  if (cp == 0x85) return true;
  const auto c = utf8proc_category(utf8proc_int32_t(cp));
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln::tok
