#include "spec/ngram_index.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::spec {
namespace {
uint64_t mix(uint64_t h, int32_t token) {
  // splitmix64 of the running hash and the token.
  uint64_t z = h ^ (uint64_t(uint32_t(token)) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

NgramIndex::NgramIndex(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {
  KILN_CHECK(min_n >= 1 && min_n <= max_n && max_n <= 64, "n-gram match window [", min_n, ", ", max_n,
             "] must satisfy 1 <= min <= max <= 64");
}

void NgramIndex::suffix_keys(size_t end, uint64_t* k) const {
  uint64_t x = 0;
  for (int32_t n = 1; n <= max_n_ && size_t(n) <= end; ++n) {
    x = mix(x, seq_[end - size_t(n)]);
    // n mixed in: the lengths share one table, so equal hashes of different lengths should not be systematic.
    const uint64_t key = x + uint64_t(n) * 0xD6E8FEB86659FD93ull;
    if (n >= min_n_) k[n - min_n_] = key == 0 ? 1 : key;  // 0 marks an empty slot
  }
}

bool NgramIndex::same(size_t end_a, size_t end_b, int32_t n) const {
  return std::equal(seq_.begin() + long(end_a) - n, seq_.begin() + long(end_a),
                    seq_.begin() + long(end_b) - n);
}

size_t NgramIndex::probe(uint64_t key) const {
  const size_t mask = slots_.size() - 1;
  size_t i = size_t(key) & mask;
  while (slots_[i].key != key && slots_[i].key != 0) i = (i + 1) & mask;
  return i;
}

void NgramIndex::reserve(size_t entries) {
  if (2 * entries <= slots_.size()) return;
  size_t cap = std::max<size_t>(slots_.size(), 64);
  while (cap < 2 * entries) cap *= 2;
  std::vector<Slot> old(cap, Slot{0, 0});
  old.swap(slots_);
  for (const Slot& s : old)
    if (s.key != 0) slots_[probe(s.key)] = s;  // keys are unique: probe() ends on an empty slot
}

void NgramIndex::append(int32_t token) {
  // The n-grams ending at the old end become "earlier" occurrences once the sequence grows past it.
  const size_t end = seq_.size();
  reserve(used_ + size_t(max_n_ - min_n_ + 1));
  uint64_t k[64];
  suffix_keys(end, k);
  for (int32_t n = min_n_; n <= max_n_ && size_t(n) <= end; ++n) {
    Slot& s = slots_[probe(k[n - min_n_])];
    used_ += s.key == 0;
    s = {k[n - min_n_], int32_t(end)};
  }
  seq_.push_back(token);
}

void NgramIndex::append(std::span<const int32_t> tokens) {
  // Once for all the tokens (a whole prompt: one allocation), so the appends below never rehash.
  reserve(used_ + tokens.size() * size_t(max_n_ - min_n_ + 1));
  for (int32_t t : tokens) append(t);
}

NgramMatch NgramIndex::longest_match() const {
  const size_t end = seq_.size();
  if (slots_.empty()) return {};
  uint64_t k[64];
  suffix_keys(end, k);
  // An earlier occurrence of an n-gram ends at some e with n <= e < end.
  const int32_t top = int32_t(std::min<int64_t>(max_n_, int64_t(end) - 1));
  for (int32_t n = top; n >= min_n_; --n) {
    // The slot holds the latest end of any n-gram with this key: when the tokens there are this n-gram, no
    // later occurrence of it exists (it would have overwritten the slot), whatever collided with it.
    const Slot& s = slots_[probe(k[n - min_n_])];
    if (s.key == k[n - min_n_] && s.end >= n && same(size_t(s.end), end, n)) return {n, s.end};
  }
  return {};
}

std::vector<int32_t> NgramIndex::propose(int32_t k) const {
  if (k <= 0) return {};
  const NgramMatch m = longest_match();
  if (m.n == 0) return {};
  // The sequence read on from the occurrence's end; past the sequence's end the draft copies itself (the
  // text repeats with period size() - end, as a run or a loop does), so a match always drafts k tokens.
  const size_t L = seq_.size(), e = size_t(m.end);
  std::vector<int32_t> draft(static_cast<size_t>(k));
  for (size_t i = 0; i < draft.size(); ++i) draft[i] = e + i < L ? seq_[e + i] : draft[e + i - L];
  return draft;
}

}  // namespace kiln::spec
