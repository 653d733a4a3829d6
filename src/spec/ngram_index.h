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
// the new token, max_n - min_n + 1 hash-table writes per token; propose() does at most max_n - min_n + 1
// lookups, each checked against the tokens (a 64-bit hash collision can lose a match, never make a wrong
// one). The table is flat, one for all lengths: open addressing, linear probing, power-of-two capacity, load
// factor at most 1/2, key the n-gram's hash with n mixed in. Per-length std::unordered_maps (a node allocated
// per insert) cost too much: serving 256 1024-token prompts at concurrency 32 with n-gram drafting spent
// 0.45 s of a 2.0 s run drafting, almost all of it in append() (H100, 2026-12-07, `550e8bc`, docs/PERF.md
// SP4). append(span) reserves for the tokens it brings, so a prompt rehashes at most once. Memory: one entry
// per distinct n-gram, at most max_n - min_n + 1 per token, in 16-byte slots, under 4 slots per (token,
// length): 512 KiB for a 1024-token prompt with the window [1, 12].
#pragma once

#include <cstdint>
#include <span>
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
  struct Slot {
    uint64_t key;  // 0: empty (a key of 0 is stored as 1)
    int32_t end;   // the latest end (exclusive) of an n-gram with this key, < size()
  };
  // Key of the n-gram ending at `end` (exclusive), for n = min_n .. max_n, into k[n - min_n] (n <= end).
  void suffix_keys(size_t end, uint64_t* k) const;
  bool same(size_t end_a, size_t end_b, int32_t n) const;
  // Room for `entries` keys at load factor <= 1/2 (rehashing into a larger power of two when short).
  void reserve(size_t entries);
  // The slot holding `key`, else the empty slot ending its probe run.
  size_t probe(uint64_t key) const;

  int32_t min_n_, max_n_;
  std::vector<int32_t> seq_;
  std::vector<Slot> slots_;  // a power of two, or none before the first append
  size_t used_ = 0;          // slots holding a key
};

}  // namespace kiln::spec
