#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "kiln/error.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_char() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? b : 256 + extra++;
    }
    return t;
  }();
  return table;
}

int char_to_byte(uint32_t cp) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_char()[size_t(b)]] = int16_t(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

BpeModel::BpeModel(const std::vector<std::pair<std::string, int32_t>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    KILN_CHECK(id >= 0, "tokenizer.json: negative id ", id, " for token '", tok, "'");
    KILN_CHECK(!tok.empty(), "tokenizer.json: empty token string for id ", id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(size_t(max_id + 1));
  for (const auto& [tok, id] : vocab) {
    KILN_CHECK(id_to_token_[size_t(id)].empty(), "tokenizer.json: id ", id, " appears twice in the vocab");
    id_to_token_[size_t(id)] = tok;
  }
  size_t vcap = 16;
  while (vcap < vocab.size() * 2) vcap <<= 1;
  vocab_slots_.assign(vcap, VocabSlot{});
  for (int32_t id = 0; id <= max_id; ++id) {
    const std::string& t = id_to_token_[size_t(id)];
    if (t.empty()) continue;
    const uint64_t h = hash_bytes(t);
    size_t k = h & (vcap - 1);
    while (vocab_slots_[k].id >= 0) {
      KILN_CHECK(id_to_token_[size_t(vocab_slots_[k].id)] != t, "tokenizer.json: token '", t,
                 "' appears twice in the vocab");
      k = (k + 1) & (vcap - 1);
    }
    vocab_slots_[k] = {h, id};
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(byte_to_char()[size_t(b)], ch);
    byte_id_[size_t(b)] = find(ch);
    KILN_CHECK(byte_id_[size_t(b)] >= 0, "tokenizer.json: byte-level BPE vocab lacks the token for byte ", b);
  }

  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  merges_.assign(cap, MergeSlot{});
  mask_ = cap - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [l, r] = merges[rank];
    const int32_t a = find(l), b = find(r), m = find(l + r);
    KILN_CHECK(a >= 0 && b >= 0, "tokenizer.json: merge ", rank, " ('", l, "', '", r,
               "') uses a token not in the vocab");
    KILN_CHECK(m >= 0, "tokenizer.json: merge ", rank, " result '", l + r, "' is not in the vocab");
    const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t h = mix(key) & mask_;
    while (merges_[h].key != ~0ull && merges_[h].key != key) h = (h + 1) & mask_;
    merges_[h] = {key, uint32_t(rank), m};  // a repeated merge takes its last rank, as HF's map insert does
  }
}

int32_t BpeModel::find(std::string_view token) const {
  const uint64_t h = hash_bytes(token);
  const size_t mask = vocab_slots_.size() - 1;
  for (size_t k = h & mask;; k = (k + 1) & mask) {
    const VocabSlot& s = vocab_slots_[k];
    if (s.id < 0) return -1;
    if (s.hash == h && id_to_token_[size_t(s.id)] == token) return s.id;
  }
}

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  __builtin_memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 29);
}

const BpeModel::MergeSlot* BpeModel::lookup(int32_t a, int32_t b) const {
  const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  for (size_t h = mix(key) & mask_;; h = (h + 1) & mask_) {
    const MergeSlot& s = merges_[h];
    if (s.key == key) return &s;
    if (s.key == ~0ull) return nullptr;
  }
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  const size_t n0 = bytes.size();
  if (n0 == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  if (n0 > kNaiveMax) {
    std::vector<int32_t> sym(n0);
    for (size_t i = 0; i < n0; ++i) sym[i] = byte_id_[static_cast<uint8_t>(bytes[i])];
    merge_heap(sym);
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  // Short words (nearly all of them): arrays on the stack, a scan for the lowest rank per merge.
  constexpr uint32_t kNone = UINT32_MAX;
  std::array<int32_t, kNaiveMax> sym;
  std::array<uint32_t, kNaiveMax> rank;
  std::array<int32_t, kNaiveMax> merged;
  size_t n = n0;
  for (size_t i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<uint8_t>(bytes[i])];
  auto fill = [&](size_t i) {
    const MergeSlot* s = lookup(sym[i], sym[i + 1]);
    rank[i] = s ? s->rank : kNone;
    merged[i] = s ? s->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) fill(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNone) break;
    sym[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      sym[i] = sym[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) fill(best - 1);
    if (best + 1 < n) fill(best);
  }
  out.insert(out.end(), sym.begin(), sym.begin() + long(n));
}

void BpeModel::merge_heap(std::vector<int32_t>& sym) const {
  const auto n = int32_t(sym.size());
  std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    prev[size_t(i)] = i - 1;
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    uint32_t rank;
    int32_t pos, left, right, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t i) {
    const int32_t j = next[size_t(i)];
    if (i < 0 || j < 0) return;
    if (const MergeSlot* s = lookup(sym[size_t(i)], sym[size_t(j)]))
      heap.push({s->rank, i, sym[size_t(i)], sym[size_t(j)], s->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(static_cast<size_t>(n), false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int32_t j = next[size_t(c.pos)];
    // Stale when a neighbour merged since the push: the pair at pos is no longer (left, right).
    if (dead[size_t(c.pos)] || j < 0 || sym[size_t(c.pos)] != c.left || sym[size_t(j)] != c.right) continue;
    sym[size_t(c.pos)] = c.id;
    dead[size_t(j)] = true;
    next[size_t(c.pos)] = next[size_t(j)];
    if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = c.pos;
    if (prev[size_t(c.pos)] >= 0) push(prev[size_t(c.pos)]);
    push(c.pos);
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(sym[size_t(i)]);
  sym.swap(out);
}

}  // namespace kiln::tok
