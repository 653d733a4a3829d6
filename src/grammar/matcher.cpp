// Matcher: the per-request walk (include/kiln/grammar.h), and compile()'s dispatch and cache.
#include <algorithm>
#include <array>
#include <cstring>

#include "grammar/compiled.h"
#include "grammar/front_ends.h"
#include "grammar/parse_state.h"
#include "kiln/grammar.h"

namespace kiln::grammar {

std::shared_ptr<const TokenVocab> make_vocab(std::vector<std::string> token_bytes,
                                             std::vector<int32_t> eos_ids) {
  return std::make_shared<const TokenVocab>(std::move(token_bytes), std::move(eos_ids));
}
size_t vocab_size(const TokenVocab& v) {
  return v.size();
}
size_t mask_words(const TokenVocab& v) {
  return v.mask_words();
}

std::shared_ptr<const CompiledGrammar> compile(GrammarKind kind, std::string_view text,
                                               std::shared_ptr<const TokenVocab> vocab,
                                               const CompileOptions& options) {
  KILN_CHECK(vocab != nullptr, "grammar: no vocabulary");
  Grammar g;
  switch (kind) {
    case GrammarKind::json_schema:
      g = json_schema_grammar(text, options);
      break;
    case GrammarKind::regex:
      g = regex_grammar(text);
      break;
    case GrammarKind::ebnf:
      g = ebnf_grammar(text);
      break;
    case GrammarKind::any_json:
      g = any_json_grammar(options);
      break;
    case GrammarKind::tool_calls:
      g = tool_call_grammar(text, options);
      break;
  }
  auto cg = std::make_shared<const CompiledGrammar>(normalize(std::move(g)), std::move(vocab), options);
  if (options.precompute) cg->precompute_all();
  return cg;
}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(GrammarKind kind, std::string_view text,
                                                         const CompileOptions& o) {
  std::string key = std::to_string(int(kind)) + '/' + std::to_string(o.lenient) + std::to_string(o.strict) +
                    std::to_string(o.precompute) + '/' + std::to_string(o.max_whitespace) + '/' +
                    std::to_string(o.max_depth) + '/' + std::to_string(o.max_stacks) + '/' +
                    std::string(text);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  auto cg = compile(kind, text, vocab_, o);  // outside the lock; a racing twin compiles the same thing
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = entries_.emplace(key, std::move(cg));
  std::shared_ptr<const CompiledGrammar> out = it->second;
  if (added) {
    order_.push_back(std::move(key));
    while (max_entries_ > 0 && entries_.size() > max_entries_) {
      entries_.erase(order_.front());
      order_.pop_front();
    }
  }
  return out;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

struct Matcher::Impl {
  struct Entry {
    ParseState state;
    size_t frames_before;  // the frame arena's size before this entry's token
    bool eos = false;
  };
  std::shared_ptr<const CompiledGrammar> cg;
  Stepper st;
  std::vector<Entry> history;  // [0] is the start state
  ParseState resume, probe;

  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : cg(std::move(g)), st(cg->flat(), cg->options().max_depth, cg->options().max_stacks) {
    history.push_back({{}, st.num_frames(), false});
    st.start(history.back().state);
  }
  const ParseState& cur() const { return history.back().state; }
};

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;

void Matcher::fill_next_token_bitmask(uint32_t* words, size_t n_words) {
  Impl& m = *impl_;
  const TokenVocab& v = m.cg->vocab();
  KILN_CHECK_GE(n_words, v.mask_words(), "grammar: the bitmask is smaller than the vocabulary");
  std::memset(words, 0, n_words * sizeof(uint32_t));
  if (is_terminated()) return;
  const ParseState& cur = m.cur();
  const FlatGrammar& g = m.cg->flat();
  for (const Top& t : cur.tops) m.cg->key(t.pos, t.state).accepted.or_into(words);
  const size_t mark = m.st.num_frames();
  for (const Top& t : cur.tops) {
    const KeyMask& k = m.cg->key(t.pos, t.state);
    if (k.uncertain.empty()) continue;
    // The parser as it is once the top's rule returns: every uncertain token continues from here.
    m.st.truncate(mark);
    if (t.frame == kRootFrame) continue;  // the output ends with the rule: no byte may follow
    const Frame f = m.st.frame(t.frame);
    m.st.after(f.call_pos + 1, f.parent, m.resume);
    if (m.resume.tops.empty()) continue;
    std::array<uint64_t, 4> first{0, 0, 0, 0};
    for (const Top& r : m.resume.tops) {
      const auto& ob = g.lexemes[g.pos[r.pos].id].out_bytes[size_t(r.state)];
      for (int w = 0; w < 4; ++w) first[size_t(w)] |= ob[size_t(w)];
    }
    for (size_t i = 0; i < k.uncertain.size(); ++i) {
      const int32_t id = k.uncertain[i];
      if ((words[size_t(id) >> 5] >> (id & 31)) & 1) continue;
      const std::string& b = v.bytes(id);
      for (uint32_t o = k.offset_begin[i]; o < k.offset_begin[i + 1]; ++o) {
        const uint8_t c = uint8_t(b[k.offsets[o]]);
        if (!((first[c >> 6] >> (c & 63)) & 1)) continue;
        m.probe = m.resume;
        if (m.st.walk(m.probe, std::string_view(b).substr(k.offsets[o]))) {
          words[size_t(id) >> 5] |= 1u << (id & 31);
          break;
        }
      }
    }
  }
  m.st.truncate(mark);
  if (cur.complete)
    for (int32_t e : v.eos_ids()) words[size_t(e) >> 5] |= 1u << (e & 31);
}

bool Matcher::accept_token(int32_t id) {
  Impl& m = *impl_;
  const TokenVocab& v = m.cg->vocab();
  if (is_terminated() || id < 0 || size_t(id) >= v.size()) return false;
  const size_t mark = m.st.num_frames();
  if (v.is_eos(id)) {
    if (!m.cur().complete) return false;
    m.history.push_back({m.cur(), mark, true});
    return true;
  }
  const std::string& b = v.bytes(id);
  if (b.empty()) return false;
  ParseState s = m.cur();
  if (!m.st.walk(s, b)) {
    m.st.truncate(mark);
    return false;
  }
  m.history.push_back({std::move(s), mark, false});
  return true;
}

void Matcher::rollback(size_t n) {
  Impl& m = *impl_;
  KILN_CHECK_LE(n, m.history.size() - 1, "grammar: rollback past the first token");
  for (size_t i = 0; i < n; ++i) {
    m.st.truncate(m.history.back().frames_before);
    m.history.pop_back();
  }
}

bool Matcher::is_complete() const {
  return impl_->cur().complete;
}
bool Matcher::is_terminated() const {
  return impl_->history.back().eos;
}
size_t Matcher::num_accepted() const {
  return impl_->history.size() - 1;
}

size_t Matcher::mask_words() const {
  return impl_->cg->vocab().mask_words();
}

}  // namespace kiln::grammar
