// NgramIndex: prompt lookup (n-gram) drafting over one request's own tokens, prompt and output.
//
// The match: the longest n in [min_n, max_n] such that the sequence's last n tokens also occur ending at an
// earlier position e (e < size()); among those occurrences the most recent (largest e). The draft: the k
// tokens that followed it, the sequence read on from e, where past its end the draft continues from itself
// (draft[i] = seq[e + i] for e + i < size(), else draft[e + i - size()]: the text repeats with period
// size() - e, as a run or a loop does). No match, no draft.
// (vLLM's prompt_lookup_min / prompt_lookup_max and SGLang's min / max match window are [min_n, max_n].)
//
// Incremental: append() indexes the n-grams (n in [min_n, max_n]) that end where the sequence ended before
// the new token, O(max_n) hash-map updates per token; propose() does at most max_n - min_n + 1 lookups, each
// checked against the tokens (a 64-bit hash collision can lose a match, never make a wrong one). Memory:
// (max_n - min_n + 1) map entries per token.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln::spec {

struct NgramMatch {
  int32_t n = 0;    // matched length; 0: no match
  int32_t end = 0;  // the earlier occurrence ends here (exclusive): the draft starts at tokens()[end]
};

class NgramIndex {
 public:
  // 1 <= min_n <= max_n <= 64; throws kiln::Error otherwise.
  NgramIndex(int32_t min_n, int32_t max_n);

  void append(int32_t token);
  void append(std::span<const int32_t> tokens);
  const std::vector<int32_t>& tokens() const { return seq_; }
  size_t size() const { return seq_.size(); }

  NgramMatch longest_match() const;
  // k tokens after the longest match (empty without one, or when k <= 0).
  std::vector<int32_t> propose(int32_t k) const;

 private:
  // Hash of the n-gram ending at `end` (exclusive), for n = min_n .. max_n, into h[n - min_n] (n <= end).
  void suffix_hashes(size_t end, uint64_t* h) const;
  bool same(size_t end_a, size_t end_b, int32_t n) const;

  int32_t min_n_, max_n_;
  std::vector<int32_t> seq_;
  // [max_n - min_n + 1]: hash of an n-gram -> the latest end (exclusive) of an occurrence, < size()
  std::vector<std::unordered_map<uint64_t, int32_t>> last_end_;
};

}  // namespace kiln::spec
