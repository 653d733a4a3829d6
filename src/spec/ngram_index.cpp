#include "spec/ngram_index.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::spec {
namespace {
uint64_t mix(uint64_t h, int32_t token) {
  // splitmix64 of the running hash and the token: n-grams of different lengths land in different maps,
  // so only same-length collisions matter.
  uint64_t z = h ^ (uint64_t(uint32_t(token)) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

NgramIndex::NgramIndex(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {
  KILN_CHECK(min_n >= 1 && min_n <= max_n && max_n <= 64, "n-gram match window [", min_n, ", ", max_n,
             "] must satisfy 1 <= min <= max <= 64");
  last_end_.resize(size_t(max_n - min_n + 1));
}

void NgramIndex::suffix_hashes(size_t end, uint64_t* h) const {
  uint64_t x = 0;
  for (int32_t n = 1; n <= max_n_ && size_t(n) <= end; ++n) {
    x = mix(x, seq_[end - size_t(n)]);
    if (n >= min_n_) h[n - min_n_] = x;
  }
}

bool NgramIndex::same(size_t end_a, size_t end_b, int32_t n) const {
  return std::equal(seq_.begin() + long(end_a) - n, seq_.begin() + long(end_a),
                    seq_.begin() + long(end_b) - n);
}

void NgramIndex::append(int32_t token) {
  // The n-grams ending at the old end become "earlier" occurrences once the sequence grows past it.
  const size_t end = seq_.size();
  uint64_t h[64];
  suffix_hashes(end, h);
  for (int32_t n = min_n_; n <= max_n_ && size_t(n) <= end; ++n)
    last_end_[size_t(n - min_n_)][h[n - min_n_]] = int32_t(end);
  seq_.push_back(token);
}

void NgramIndex::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) append(t);
}

NgramMatch NgramIndex::longest_match() const {
  const size_t end = seq_.size();
  uint64_t h[64];
  suffix_hashes(end, h);
  // An earlier occurrence of an n-gram ends at some e with n <= e < end.
  const int32_t top = int32_t(std::min<int64_t>(max_n_, int64_t(end) - 1));
  for (int32_t n = top; n >= min_n_; --n) {
    const auto& m = last_end_[size_t(n - min_n_)];
    auto it = m.find(h[n - min_n_]);
    if (it != m.end() && same(size_t(it->second), end, n)) return {n, it->second};
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
