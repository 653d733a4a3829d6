// The adaptive token-mask cache (compiled.h): classifying the vocabulary for one (lexeme position, DFA
// state).
#include <algorithm>
#include <array>
#include <deque>

#include "grammar/compiled.h"
#include "grammar/parse_state.h"
#include "kiln/error.h"

namespace kiln::grammar {

namespace {

// Walks the trie below the exits of one lexeme with the parser positioned after the lexeme, inside its rule
// (the rule's caller is kBottomFrame: reaching it means the token leaves the rule).
class ContextWalk {
 public:
  // follow: the bytes that may come after the rule ends (FOLLOW); an exit is kept only for those.
  ContextWalk(const TokenVocab& v, Stepper& st, const std::array<uint64_t, 4>& follow)
      : v_(v), st_(st), follow_(follow) {}
  std::vector<int32_t> accepted;
  std::vector<uint64_t> uncertain;  // (token << 16) | offset where it leaves the rule

  // pending: the depth of an exit right at node n (-1: none), applied to the children it may continue into.
  void below(uint32_t n, const ParseState& from, int pending) {
    std::vector<uint16_t> exits;
    walk(n, from, exits, pending, 0);
  }
  void all_below(uint32_t n, std::vector<uint16_t>& exits, int pending) {
    const TrieNode& node = v_.trie()[n];
    for (uint32_t c = node.first_child; c < node.first_child + node.n_children; ++c) {
      const TrieNode& ch = v_.trie()[c];
      const bool with = pending >= 0 && follows(ch.byte);
      if (with) exits.push_back(uint16_t(pending));
      for (uint32_t k = ch.tok_lo; k < ch.tok_hi; ++k)
        for (uint16_t e : exits) uncertain.push_back((uint64_t(uint32_t(v_.sorted()[k])) << 16) | e);
      if (with) exits.pop_back();
    }
  }

 private:
  bool follows(uint8_t b) const { return (follow_[b >> 6] >> (b & 63)) & 1; }

  void walk(uint32_t n, const ParseState& from, std::vector<uint16_t>& exits, int pending, size_t level) {
    if (states_.size() <= level) states_.resize(level + 1);
    const TrieNode& node = v_.trie()[n];
    for (uint32_t c = node.first_child; c < node.first_child + node.n_children; ++c) {
      const TrieNode& ch = v_.trie()[c];
      const bool with = pending >= 0 && follows(ch.byte);
      if (with) exits.push_back(uint16_t(pending));
      ParseState& nx = states_[level];
      st_.step(from, ch.byte, nx);
      const bool live = !nx.tops.empty(), exited_here = nx.exited;
      if (live || exited_here || !exits.empty()) {
        for (uint32_t k = ch.tok_lo; k < ch.tok_mid; ++k) {
          if (live || exited_here) {
            accepted.push_back(v_.sorted()[k]);
          } else {
            for (uint16_t e : exits) uncertain.push_back((uint64_t(uint32_t(v_.sorted()[k])) << 16) | e);
          }
        }
        const int next_pending = exited_here ? int(ch.depth) : -1;
        if (ch.n_children != 0) {
          if (live)
            walk(c, nx, exits, next_pending, level + 1);
          else
            all_below(c, exits, next_pending);
        }
      }
      if (with) exits.pop_back();
    }
  }
  const TokenVocab& v_;
  Stepper& st_;
  const std::array<uint64_t, 4>& follow_;
  std::deque<ParseState> states_;  // per depth; a deque so growing it keeps `from` valid
};

}  // namespace

CompiledGrammar::CompiledGrammar(FlatGrammar g, std::shared_ptr<const TokenVocab> vocab,
                                 const CompileOptions& options)
    : g_(std::move(g)), vocab_(std::move(vocab)), options_(options) {
  keys_.reset(new std::atomic<const KeyMask*>[g_.num_keys]);
  for (uint32_t i = 0; i < g_.num_keys; ++i) keys_[i].store(nullptr, std::memory_order_relaxed);
}

size_t CompiledGrammar::num_keys_computed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owned_.size();
}

const KeyMask& CompiledGrammar::key(uint32_t pos, int32_t state) const {
  const uint32_t k = g_.key_base[pos] + uint32_t(state);
  if (const KeyMask* m = keys_[k].load(std::memory_order_acquire)) return *m;
  std::unique_ptr<KeyMask> fresh = compute(pos, state);  // outside the lock: workers compute in parallel
  std::lock_guard<std::mutex> lock(mu_);
  if (const KeyMask* m = keys_[k].load(std::memory_order_acquire)) return *m;
  owned_.push_back(std::move(fresh));
  keys_[k].store(owned_.back().get(), std::memory_order_release);
  return *owned_.back();
}

void CompiledGrammar::precompute_all() const {
  for (uint32_t p = 0; p < g_.pos.size(); ++p) {
    if (g_.pos[p].kind != Position::Kind::lexeme) continue;
    const Dfa& d = g_.lexemes[g_.pos[p].id];
    for (size_t s = 0; s < d.num_states(); ++s)
      if (d.has_out[s]) key(p, int32_t(s));
  }
}

std::unique_ptr<KeyMask> CompiledGrammar::compute(uint32_t pos, int32_t state) const {
  const Dfa& d = g_.lexemes[g_.pos[pos].id];
  const auto walk = vocab_->dfa_walk(d, state);
  Stepper st(g_, options_.max_depth, options_.max_stacks);
  ParseState after;
  st.after(pos + 1, kBottomFrame, after);
  ContextWalk cw(*vocab_, st, g_.follow[g_.pos[pos].rule]);
  std::vector<uint16_t> none;
  for (uint32_t e : walk->exits) {
    const int pending = after.exited ? int(vocab_->trie()[e].depth) : -1;
    if (!after.tops.empty())
      cw.below(e, after, pending);
    else if (pending >= 0)
      cw.all_below(e, none, pending);
  }
  auto m = std::make_unique<KeyMask>();
  if (cw.accepted.empty()) {
    m->accepted = walk->accepted;
  } else {
    std::vector<int32_t> ids = std::move(cw.accepted);
    if (!walk->accepted.words.empty()) {
      for (size_t w = 0; w < walk->accepted.words.size(); ++w)
        for (uint32_t bits = walk->accepted.words[w]; bits; bits &= bits - 1)
          ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
    } else {
      ids.insert(ids.end(), walk->accepted.ids.begin(), walk->accepted.ids.end());
    }
    m->accepted = TokenSet::from_ids(std::move(ids), vocab_->size());
  }
  auto& unc = cw.uncertain;
  std::sort(unc.begin(), unc.end());
  unc.erase(std::unique(unc.begin(), unc.end()), unc.end());
  for (size_t i = 0; i < unc.size();) {
    const int32_t tok = int32_t(unc[i] >> 16);
    size_t j = i;
    while (j < unc.size() && int32_t(unc[j] >> 16) == tok) ++j;
    if (!m->accepted.contains(tok)) {
      m->uncertain.push_back(tok);
      m->offset_begin.push_back(uint32_t(m->offsets.size()));
      for (size_t k = i; k < j; ++k) m->offsets.push_back(uint16_t(unc[k] & 0xFFFF));
    }
    i = j;
  }
  m->offset_begin.push_back(uint32_t(m->offsets.size()));
  return m;
}

}  // namespace kiln::grammar
