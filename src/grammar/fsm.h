// Byte-level automata: the terminals of every grammar. Front ends build an NFA (Thompson construction over
// byte ranges), determinize() turns it into a DFA whose every state can still reach an accepting state, so a
// live DFA state always has a completion. Limits are explicit and named in the error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::grammar {

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    uint32_t to;
  };
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<uint32_t>> eps;
  size_t max_states = 400000;  // NFA size limit (bounded repetitions are unrolled)

  uint32_t add_state();
  void add_edge(uint32_t from, uint8_t lo, uint8_t hi, uint32_t to) { edges[from].push_back({lo, hi, to}); }
  void add_eps(uint32_t from, uint32_t to) { eps[from].push_back(to); }
};

// A fragment of an NFA: one entry state and one exit state.
struct Frag {
  uint32_t start, end;
};

struct Dfa {
  std::array<uint8_t, 256> byte_class{};  // byte -> column
  uint32_t n_classes = 1;
  int32_t start = -1;         // -1: the empty language
  std::vector<int32_t> next;  // [state * n_classes + class]; -1 = dead
  std::vector<uint8_t> accepting;
  std::vector<uint8_t> has_out;                    // the state has a live transition
  std::vector<std::array<uint64_t, 4>> out_bytes;  // the bytes with a live transition, per state
  uint64_t hash = 0;                               // of the content (two equal DFAs hash equal)

  size_t num_states() const { return accepting.size(); }
  int32_t step(int32_t s, uint8_t b) const { return next[size_t(s) * n_classes + byte_class[b]]; }
  bool byte_allowed(int32_t s, uint8_t b) const { return (out_bytes[size_t(s)][b >> 6] >> (b & 63)) & 1; }
};

// Subset construction, dead-state pruning and minimization. Throws kiln::Error past max_states.
Dfa determinize(const Nfa& nfa, Frag frag, size_t max_states = 20000);
// A DFA from a table over byte columns: next[s * n_cols + col_of[byte]] (-1 dead), state 0 the start;
// pruned, minimized and compressed as determinize() does.
Dfa dfa_from_table(const std::vector<int32_t>& next, const std::vector<uint8_t>& accepting,
                   const std::array<uint8_t, 256>& col_of, uint32_t n_cols);
// Strings accepted by a and not by b.
Dfa dfa_difference(const Dfa& a, const Dfa& b, size_t max_states = 20000);
// Strings accepted by both.
Dfa dfa_intersection(const Dfa& a, const Dfa& b, size_t max_states = 20000);

}  // namespace kiln::grammar
