// Jinja's lexer rules for data, tags, comments and raw blocks; see lexer.h.
#include "template/lexer.h"

#include <cstdlib>
#include <cstring>

#include "template/value.h"

namespace kiln::tmpl {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    // keep_trailing_newline=False: one trailing newline of the source is not part of the template.
    if (!src_.empty() && src_.back() == '\n')
      src_.remove_suffix(src_.size() >= 2 && src_[src_.size() - 2] == '\r' ? 2 : 1);
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t k = find_tag(pos);
      std::string_view text = src_.substr(pos, k - pos);
      if (k == src_.size()) {
        emit_text(text, pos);
        break;
      }
      const char kind = src_[k + 1];  // '{', '%' or '#'
      const char mod = k + 2 < src_.size() ? src_[k + 2] : 0;
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: drop the spaces between the line start and the tag.
        size_t b = text.size();
        while (b > 0 && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\f' ||
                         text[b - 1] == '\v' || text[b - 1] == '\r'))
          --b;
        const size_t at = pos + b;
        if (at == 0 || src_[at - 1] == '\n') text = text.substr(0, b);
      }
      emit_text(text, pos);
      size_t p = k + 2 + (mod == '-' || mod == '+');
      if (kind == '#') {
        const size_t e = src_.find("#}", p);
        line_at(k);
        if (e == std::string_view::npos) err(k, "unterminated comment");
        pos = after_tag(e + 2, e > p && src_[e - 1] == '-', e > p && src_[e - 1] == '+', true);
        continue;
      }
      if (kind == '%' && try_raw(p, k, pos)) continue;
      out_.push_back({kind == '{' ? Tok::var_begin : Tok::block_begin, "", 0, 0, line_at(k)});
      pos = lex_tag(p, kind == '{');
    }
    out_.push_back({Tok::eof, "", 0, 0, line_at(src_.size())});
    return std::move(out_);
  }

 private:
  std::string_view src_;
  std::vector<Token> out_;
  int line_ = 1;  // the line of src_[line_pos_]
  size_t line_pos_ = 0;

  int line_at(size_t pos) {  // positions only move forward
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) line_ += src_[line_pos_] == '\n';
    return line_;
  }

  [[noreturn]] void err(size_t at, const std::string& msg) {
    fail("template syntax error (line " + std::to_string(line_at(at)) + "): " + msg);
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  void emit_text(std::string_view text, size_t pos) {
    if (text.empty()) return;
    out_.push_back({Tok::text, normalize_newlines(text), 0, 0, line_at(pos)});
  }

  // Position after a tag's closing delimiter: `-` strips all following whitespace; trim_blocks drops one
  // newline after block and comment tags unless `+` asks to keep it.
  size_t after_tag(size_t p, bool strip, bool keep, bool block) {
    if (strip) {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (block && !keep && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    return p;
  }

  // {% raw %}...{% endraw %}: the text in between is data.
  bool try_raw(size_t p, size_t tag_start, size_t& pos) {
    size_t q = p;
    while (q < src_.size() && is_space(src_[q])) ++q;
    if (src_.compare(q, 3, "raw") != 0 ||
        (q + 3 < src_.size() && (is_name_start(src_[q + 3]) || is_digit(src_[q + 3]))))
      return false;
    q += 3;
    while (q < src_.size() && is_space(src_[q])) ++q;
    const bool strip = q < src_.size() && src_[q] == '-';
    if (strip || (q < src_.size() && src_[q] == '+')) ++q;
    if (src_.compare(q, 2, "%}") != 0) err(tag_start, "expected '%}' after 'raw'");
    size_t body = after_tag(q + 2, strip, /*keep=*/true, true);  // Jinja: no trim_blocks after {% raw %}
    for (size_t s = body; (s = src_.find("{%", s)) != std::string_view::npos; s += 2) {
      size_t r = s + 2;
      const bool lstrip = r < src_.size() && src_[r] == '-';
      if (lstrip || (r < src_.size() && src_[r] == '+')) ++r;
      while (r < src_.size() && is_space(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && is_space(src_[r])) ++r;
      const bool rstrip = r < src_.size() && src_[r] == '-';
      const bool keep = r < src_.size() && src_[r] == '+';
      if (rstrip || keep) ++r;
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string_view text = src_.substr(body, s - body);
      if (lstrip)
        while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      emit_text(text, body);
      pos = after_tag(r + 2, rstrip, keep, true);
      return true;
    }
    err(tag_start, "unterminated raw block");
  }

  size_t lex_tag(size_t p, bool var) {
    int depth = 0;  // brackets open: a closing delimiter inside them is not the tag's end
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      line_at(p);
      if (p >= src_.size())
        err(p,
            var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      const char* close = var ? "}}" : "%}";
      if (depth == 0) {
        const bool mod = (src_[p] == '-' || (!var && src_[p] == '+')) && src_.compare(p + 1, 2, close) == 0;
        if (mod || src_.compare(p, 2, close) == 0) {
          out_.push_back({var ? Tok::var_end : Tok::block_end, "", 0, 0, line_});
          return after_tag(p + 2 + mod, mod && src_[p] == '-', mod && src_[p] == '+', !var);
        }
      }
      const char c = src_[p];
      if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        out_.push_back({Tok::name, std::string(src_.substr(p, e - p)), 0, 0, line_});
        p = e;
      } else if (is_digit(c)) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                    ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        const char* hit = nullptr;
        for (const char* o : ops)
          if (src_.compare(p, std::strlen(o), o) == 0) {
            hit = o;
            break;
          }
        if (!hit) err(p, std::string("unexpected character '") + c + "'");
        if (*hit == '(' || *hit == '[' || *hit == '{') ++depth;
        if ((*hit == ')' || *hit == ']' || *hit == '}') && depth > 0) --depth;
        out_.push_back({Tok::op, hit, 0, 0, line_});
        p += std::strlen(hit);
      }
    }
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    std::string digits;
    auto run = [&] {
      while (e < src_.size() &&
             (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && is_digit(src_[e + 1]))))
        if (src_[e++] != '_') digits += src_[e - 1];
    };
    run();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      digits += src_[e++];
      run();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        digits += 'e';
        digits.append(src_.substr(e + 1, q - e - 1));
        e = q;
        run();
      }
    }
    Token t{is_float ? Tok::floating : Tok::integer, digits, 0, 0, line_};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);  // past the double range: inf or 0, as Python
    } else {
      try {
        t.i = std::stoll(digits);
      } catch (const std::exception&) {
        err(p, "integer literal out of range");
      }
    }
    out_.push_back(std::move(t));
    return e;
  }

  size_t lex_string(size_t p) {
    const char q = src_[p];
    std::string v;
    size_t i = p + 1;
    for (; i < src_.size() && src_[i] != q; ++i) {
      if (src_[i] != '\\' || i + 1 >= src_.size()) {
        v += src_[i];
        continue;
      }
      const char c = src_[++i];
      switch (c) {
        case 'n':
          v += '\n';
          break;
        case 't':
          v += '\t';
          break;
        case 'r':
          v += '\r';
          break;
        case '0':
          v += '\0';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'v':
          v += '\v';
          break;
        case 'a':
          v += '\a';
          break;
        case '\\':
        case '\'':
        case '"':
          v += c;
          break;
        case '\n':
          break;  // a backslash-newline continues the literal
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          if (i + n >= src_.size()) err(p, "truncated \\" + std::string(1, c) + " escape");
          uint32_t cp = 0;
          for (size_t k = 1; k <= n; ++k) {  // exactly n hex digits, as Python reads them
            const char h = src_[i + k];
            const int d = h >= '0' && h <= '9'   ? h - '0'
                          : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                 : -1;
            if (d < 0)
              err(p, "bad \\" + std::string(1, c) + " escape: expected " + std::to_string(n) + " hex digits");
            cp = cp * 16 + uint32_t(d);
          }
          if (cp > 0x10FFFF) err(p, "\\U escape out of range");
          append_utf8(cp, v);
          i += n;
          break;
        }
        default:
          v += '\\';
          v += c;
      }
    }
    if (i >= src_.size()) err(p, "unterminated string literal");
    out_.push_back({Tok::string, normalize_newlines(v), 0, 0, line_at(p)});
    return i + 1;
  }
};

}  // namespace

std::vector<Token> lex(std::string_view src) {
  return Lexer(src).run();
}

}  // namespace kiln::tmpl
