#include "grammar/vocab.h"

#include <algorithm>
#include <bit>
#include <deque>

#include "kiln/error.h"

namespace kiln::grammar {

namespace {
// Portable SWAR popcount: without -mpopcnt, std::popcount is a libgcc call that dominated profiles.
inline uint32_t popcount32(uint32_t v) {
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return (((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24;
}
}  // namespace

TokenSet TokenSet::from_ids(std::vector<int32_t> ids, size_t vocab_size) {
  TokenSet t;
  if (ids.size() * 32 > vocab_size) {  // more than about one id per mask word: a bitmask is smaller
    t.words.assign((vocab_size + 31) / 32, 0);
    for (int32_t id : ids) t.words[size_t(id) >> 5] |= 1u << (id & 31);
  } else {
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    t.ids = std::move(ids);
  }
  return t;
}

TokenSet TokenSet::from_words(std::vector<uint32_t> words) {
  size_t n = 0;
  for (uint32_t w : words) n += size_t(popcount32(w));
  TokenSet t;
  if (n > words.size()) {  // more than one id per word: keep the bitmask
    t.words = std::move(words);
    return t;
  }
  t.ids.reserve(n);
  for (size_t i = 0; i < words.size(); ++i)
    for (uint32_t bits = words[i]; bits; bits &= bits - 1)
      t.ids.push_back(int32_t(i * 32 + size_t(std::countr_zero(bits))));
  return t;
}

void TokenSet::or_into(uint32_t* mask) const {
  const size_t n = words.size();
  const uint32_t* w = words.data();
  for (size_t i = 0; i < n; ++i) mask[i] |= w[i];
  for (int32_t id : ids) mask[size_t(id) >> 5] |= 1u << (id & 31);
}

bool TokenSet::contains(int32_t id) const {
  if (!words.empty()) return (words[size_t(id) >> 5] >> (id & 31)) & 1;
  return std::binary_search(ids.begin(), ids.end(), id);
}

size_t TokenSet::count() const {
  size_t n = ids.size();
  for (uint32_t w : words) n += size_t(popcount32(w));
  return n;
}

TokenVocab::TokenVocab(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_(std::move(eos_ids)) {
  KILN_CHECK(bytes_.size() < (1u << 30), "grammar: vocabulary too large");
  for (int32_t e : eos_)
    KILN_CHECK(e >= 0 && size_t(e) < bytes_.size(), "grammar: eos id ", e, " out of range");
  for (int32_t e : eos_) bytes_[size_t(e)].clear();  // EOS is never a byte string
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (!bytes_[i].empty()) sorted_.push_back(int32_t(i));
    for (char c : bytes_[i]) h = (h ^ uint8_t(c)) * 1099511628211ull;
    h = (h ^ 0x1FF) * 1099511628211ull;
  }
  for (int32_t e : eos_) h = (h ^ uint64_t(e)) * 1099511628211ull;
  hash_ = h;
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  // Breadth-first, so each node's children are contiguous.
  trie_.push_back({0, 0, 0, 0, uint32_t(sorted_.size()), 0, 0});
  std::deque<uint32_t> queue{0};
  while (!queue.empty()) {
    const uint32_t n = queue.front();
    queue.pop_front();
    const uint32_t d = trie_[n].depth;
    uint32_t i = trie_[n].tok_lo;
    const uint32_t hi = trie_[n].tok_hi;
    while (i < hi && bytes_[size_t(sorted_[i])].size() == d) ++i;
    trie_[n].tok_mid = i;
    trie_[n].first_child = uint32_t(trie_.size());
    while (i < hi) {
      const uint8_t b = uint8_t(bytes_[size_t(sorted_[i])][d]);
      uint32_t j = i;
      while (j < hi && uint8_t(bytes_[size_t(sorted_[j])][d]) == b) ++j;
      TrieNode c;
      c.tok_lo = i, c.tok_hi = j, c.depth = d + 1, c.byte = b;
      queue.push_back(uint32_t(trie_.size()));
      trie_.push_back(c);
      ++trie_[n].n_children;
      i = j;
    }
  }
}

bool TokenVocab::is_eos(int32_t id) const {
  return std::find(eos_.begin(), eos_.end(), id) != eos_.end();
}

// A hash of the automaton as seen from one state (its reachable states numbered in breadth-first order, every
// byte's target): states of different DFAs with the same future share one walk -- the name part of a
// property-name DFA and a plain string, or the tails of strings with different maxLength.
static uint64_t state_hash(const Dfa& d, int32_t state) {
  std::vector<int32_t> order{state};
  std::vector<int32_t> id(d.num_states(), -1);
  id[size_t(state)] = 0;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = order[i];
    mix(d.accepting[size_t(s)]);
    for (int b = 0; b < 256; ++b) {
      const int32_t t = d.step(s, uint8_t(b));
      if (t >= 0 && id[size_t(t)] < 0) id[size_t(t)] = int32_t(order.size()), order.push_back(t);
      mix(uint64_t(int64_t(t < 0 ? -1 : id[size_t(t)])) + 3);
    }
  }
  return h ^ (uint64_t(order.size()) << 48);
}

std::shared_ptr<const DfaWalk> TokenVocab::dfa_walk(const Dfa& d, int32_t state) const {
  uint64_t rooted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rooted_.find({d.hash, state});
    rooted = it != rooted_.end() ? it->second : 0;
  }
  if (rooted == 0) {
    rooted = state_hash(d, state) | 1;
    std::lock_guard<std::mutex> lock(mu_);
    rooted_[{d.hash, state}] = rooted;
  }
  const auto key = std::make_pair(rooted, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = walks_.find(key);
    if (it != walks_.end()) return it->second;
  }
  auto w = std::make_shared<DfaWalk>();
  std::vector<uint32_t> words(mask_words(), 0);
  // Depth-first with an explicit stack of child ranges; a child is entered only while the DFA is alive.
  struct Level {
    uint32_t child, end;
    int32_t state;
  };
  std::vector<Level> stack;
  stack.reserve(64);
  stack.push_back({trie_[0].first_child, trie_[0].first_child + trie_[0].n_children, state});
  const TrieNode* trie = trie_.data();
  const int32_t* sorted = sorted_.data();
  const int32_t* next = d.next.data();
  const uint8_t* cls = d.byte_class.data();
  const uint8_t* accepting = d.accepting.data();
  const uint8_t* has_out = d.has_out.data();
  const size_t nc = d.n_classes;
  uint32_t* bits = words.data();
  while (!stack.empty()) {
    Level& top = stack.back();
    if (top.child == top.end) {
      stack.pop_back();
      continue;
    }
    const TrieNode& ch = trie[top.child++];
    const int32_t t = next[size_t(top.state) * nc + cls[ch.byte]];
    if (t < 0) continue;
    for (uint32_t k = ch.tok_lo; k < ch.tok_mid; ++k) bits[size_t(sorted[k]) >> 5] |= 1u << (sorted[k] & 31);
    if (ch.n_children == 0) continue;
    if (accepting[t]) w->exits.push_back(uint32_t(&ch - trie));
    if (has_out[t]) stack.push_back({ch.first_child, ch.first_child + ch.n_children, t});
  }
  w->accepted = TokenSet::from_words(std::move(words));
  std::lock_guard<std::mutex> lock(mu_);
  return walks_.emplace(key, std::move(w)).first->second;
}

}  // namespace kiln::grammar
