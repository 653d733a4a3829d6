#include "tokenizer/pretokenizer.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH \
  8  // the CMake target defines it too; builds of single files (fuzzers) need it here
#endif
#include <pcre2.h>

#include "kiln/error.h"

namespace kiln::tok {
namespace {

// Unicode White_Space (what Oniguruma's \s matches in UTF-8 mode): TAB..CR, NEL and the separators Z*.
constexpr std::string_view kSpaceClass = "\\t-\\r\\x{85}\\p{Z}";
constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kDigitClass = "\\p{Nd}";
constexpr std::string_view kHexClass = "0-9a-fA-F";

std::string pcre2_error(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      std::string_view cls;
      bool neg = false;
      switch (e) {
        case 's':
          cls = kSpaceClass;
          break;
        case 'S':
          cls = kSpaceClass, neg = true;
          break;
        case 'w':
          cls = kWordClass;
          break;
        case 'W':
          cls = kWordClass, neg = true;
          break;
        case 'd':
          cls = kDigitClass;
          break;
        case 'D':
          cls = kDigitClass, neg = true;
          break;
        case 'h':
          cls = kHexClass;
          break;
        case 'H':
          cls = kHexClass, neg = true;
          break;
        default:
          out += '\\';
          out += e;
          continue;
      }
      if (in_class) {
        KILN_CHECK(!neg, "pre-tokenizer regex: a negated class escape \\", e,
                   " inside [...] has no PCRE2 translation: ", p);
        out += cls;
      } else {
        out += neg ? "[^" : "[";
        out += cls;
        out += ']';
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal in both dialects.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[')
      KILN_FAIL("pre-tokenizer regex: nested character classes are not supported: ", p);
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  KILN_CHECK(!in_class, "pre-tokenizer regex: unterminated character class: ", p);
  return out;
}

struct SplitRegex::Code {
  pcre2_code* re = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(re); }
};

SplitRegex::SplitRegex(std::string_view onig_pattern, std::string_view behavior, bool invert)
    : code_(std::make_unique<Code>()), invert_(invert) {
  if (behavior == "Isolated") {
    behavior_ = Behavior::kIsolated;
  } else if (behavior == "Removed") {
    behavior_ = Behavior::kRemoved;
  } else if (behavior == "MergedWithPrevious") {
    behavior_ = Behavior::kMergedWithPrevious;
  } else if (behavior == "MergedWithNext") {
    behavior_ = Behavior::kMergedWithNext;
  } else if (behavior == "Contiguous") {
    behavior_ = Behavior::kContiguous;
  } else {
    KILN_FAIL("pre-tokenizer Split: unknown behavior '", behavior, "'");
  }
  const std::string pat = onig_to_pcre2(onig_pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), PCRE2_UTF | PCRE2_UCP, &err,
                            &off, nullptr);
  KILN_CHECK(code_->re != nullptr, "pre-tokenizer regex does not compile at offset ", off, ": ",
             pcre2_error(err), " (pattern ", pat, ")");
  code_->jit = pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE) == 0;  // the interpreter still works without
}

SplitRegex::~SplitRegex() = default;

void SplitRegex::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const {
  // Matches (and, unless inverted, the gaps between them) as HF's Split does, then combined per behavior.
  struct Span {
    size_t b, e;
    bool match;
  };
  std::vector<Span> spans;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->re, nullptr);
  KILN_CHECK(md != nullptr, "out of memory creating regex match data");
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, prev = 0;
  while (pos <= text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->re, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx)
                        : pcre2_match(code_->re, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && stack == nullptr) {  // very long runs: retry with a large stack
      stack = pcre2_jit_stack_create(1 << 16, 64 << 20, nullptr);
      mctx = pcre2_match_context_create(nullptr);
      KILN_CHECK(stack && mctx, "out of memory creating a regex stack");
      pcre2_jit_stack_assign(mctx, nullptr, stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      pcre2_match_context_free(mctx);
      pcre2_jit_stack_free(stack);
      KILN_FAIL("pre-tokenizer regex failed at byte ", pos, ": ", pcre2_error(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (b == e) {  // empty match: not a piece (as in HF); step over one character
      if (b >= text.size()) break;
      pos = b + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (b > prev) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = pos = e;
  }
  pcre2_match_data_free(md);
  pcre2_match_context_free(mctx);
  pcre2_jit_stack_free(stack);
  if (prev < text.size()) spans.push_back({prev, text.size(), false});

  if (invert_)
    for (auto& s : spans) s.match = !s.match;
  switch (behavior_) {
    case Behavior::kIsolated:
      for (const auto& s : spans) pieces.emplace_back(s.b, s.e);
      break;
    case Behavior::kRemoved:
      for (const auto& s : spans)
        if (!s.match) pieces.emplace_back(s.b, s.e);
      break;
    case Behavior::kMergedWithPrevious:
      for (size_t k = 0; k < spans.size(); ++k) {
        if (spans[k].match && !pieces.empty() && k > 0 && !spans[k - 1].match)
          pieces.back().second = spans[k].e;
        else
          pieces.emplace_back(spans[k].b, spans[k].e);
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t k = 0; k < spans.size(); ++k) {
        if (k > 0 && spans[k - 1].match && !spans[k].match)
          pieces.back().second = spans[k].e;
        else
          pieces.emplace_back(spans[k].b, spans[k].e);
      }
      break;
    case Behavior::kContiguous:
      for (size_t k = 0; k < spans.size(); ++k) {
        if (k > 0 && spans[k - 1].match == spans[k].match)
          pieces.back().second = spans[k].e;
        else
          pieces.emplace_back(spans[k].b, spans[k].e);
      }
      break;
  }
}

}  // namespace kiln::tok
