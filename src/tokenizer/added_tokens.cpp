#include "tokenizer/added_tokens.h"

#include <cstring>

#include "kiln/error.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

void AddedMatcher::build(std::vector<AddedToken> tokens, const std::vector<std::string>& patterns) {
  tokens_ = std::move(tokens);
  nodes_.assign(1, Node{});
  nodes_[0].next.fill(-1);
  first_.fill(false);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& p = patterns[t];
    KILN_CHECK(!p.empty(), "added token ", tokens_[t].id, " has empty content");
    first_[static_cast<uint8_t>(p[0])] = true;
    int32_t n = 0;
    for (char c : p) {
      const auto b = static_cast<uint8_t>(c);
      if (nodes_[size_t(n)].next[b] < 0) {
        nodes_[size_t(n)].next[b] = int32_t(nodes_.size());
        nodes_.push_back(Node{});
        nodes_.back().next.fill(-1);
      }
      n = nodes_[size_t(n)].next[b];
    }
    // Two tokens with the same pattern: HF's automaton reports the first one added.
    if (nodes_[size_t(n)].token < 0) nodes_[size_t(n)].token = int32_t(t);
  }
}

void AddedMatcher::split(std::string_view s, std::vector<AddedSplit>& out) const {
  size_t start_offset = 0;  // end of the last emitted piece
  size_t pos = 0;           // where the automaton resumes (matches never overlap)
  while (pos < s.size()) {
    // Leftmost start with any match, then the longest match from there.
    size_t b = pos;
    int32_t tok = -1;
    size_t e = 0;
    for (; b < s.size(); ++b) {
      if (!first_[static_cast<uint8_t>(s[b])]) continue;
      int32_t n = 0;
      for (size_t k = b; k < s.size(); ++k) {
        n = nodes_[size_t(n)].next[static_cast<uint8_t>(s[k])];
        if (n < 0) break;
        if (nodes_[size_t(n)].token >= 0) {
          tok = nodes_[size_t(n)].token;
          e = k + 1;
        }
      }
      if (tok >= 0) break;
    }
    if (tok < 0) break;
    pos = e;
    const AddedToken& t = tokens_[size_t(tok)];
    size_t start = b, stop = e;
    if (t.single_word) {
      const bool start_ok = start == 0 || !is_word_char(utf8_prev(s, start));
      size_t k = stop;
      const bool stop_ok = stop == s.size() || !is_word_char(utf8_next(s, k));
      if (!start_ok || !stop_ok) continue;  // discarded; the search resumes after it, as in HF
    }
    if (t.lstrip) {
      size_t ns = start;
      while (ns > start_offset && is_white_space(utf8_prev(s, ns))) {
        do --ns;
        while ((static_cast<uint8_t>(s[ns]) & 0xC0) == 0x80);
      }
      start = ns;
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!is_white_space(utf8_next(s, k))) break;
        stop = k;
      }
      pos = stop;  // the stripped whitespace belongs to this token
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace kiln::tok
