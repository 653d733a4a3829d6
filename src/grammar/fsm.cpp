#include "grammar/fsm.h"

#include <algorithm>
#include <map>

#include "kiln/error.h"

namespace kiln::grammar {

uint32_t Nfa::add_state() {
  KILN_CHECK(edges.size() < max_states, "grammar: an automaton needs more than ", max_states,
             " NFA states (the limit): shrink the repetition counts or the pattern");
  edges.emplace_back();
  eps.emplace_back();
  return uint32_t(edges.size() - 1);
}

namespace {

using Row = std::array<int32_t, 256>;

// Keeps only states reachable from start that can reach an accepting state, merges equivalent states
// (Moore refinement), and compresses the byte columns into classes.
Dfa finish(const std::vector<Row>& raw, const std::vector<uint8_t>& acc, int32_t start) {
  const size_t n = raw.size();
  std::vector<std::vector<int32_t>> rev(n);
  for (size_t s = 0; s < n; ++s) {
    int32_t last = -2;
    for (int b = 0; b < 256; ++b) {
      const int32_t t = raw[s][size_t(b)];
      if (t >= 0 && t != last) rev[size_t(t)].push_back(int32_t(s));
      last = t;
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> work;
  for (size_t s = 0; s < n; ++s)
    if (acc[s]) live[s] = 1, work.push_back(int32_t(s));
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (int32_t s : rev[size_t(t)])
      if (!live[size_t(s)]) live[size_t(s)] = 1, work.push_back(s);
  }
  Dfa d;
  if (start < 0 || !live[size_t(start)]) {
    d.hash = 0x9e3779b97f4a7c15ull;
    return d;
  }
  // Forward reachability through live states.
  std::vector<int32_t> order, id(n, -1);
  id[size_t(start)] = 0;
  order.push_back(start);
  for (size_t i = 0; i < order.size(); ++i)
    for (int b = 0; b < 256; ++b) {
      const int32_t t = raw[size_t(order[i])][size_t(b)];
      if (t >= 0 && live[size_t(t)] && id[size_t(t)] < 0)
        id[size_t(t)] = int32_t(order.size()), order.push_back(t);
    }
  const size_t m = order.size();
  auto target = [&](size_t i, int b) {
    const int32_t t = raw[size_t(order[i])][size_t(b)];
    return (t >= 0 && live[size_t(t)]) ? id[size_t(t)] : -1;
  };
  // Moore refinement: block of a state = (accepting, blocks of its 256 successors), until stable.
  std::vector<int32_t> block(m);
  for (size_t i = 0; i < m; ++i) block[i] = acc[size_t(order[i])] ? 1 : 0;
  size_t n_blocks = 0;
  for (;;) {
    std::map<std::vector<int32_t>, int32_t> sig_ids;
    std::vector<int32_t> nb(m);
    std::vector<int32_t> sig(257);
    for (size_t i = 0; i < m; ++i) {
      sig[0] = block[i];
      for (int b = 0; b < 256; ++b) {
        const int32_t t = target(i, b);
        sig[size_t(b) + 1] = t < 0 ? -1 : block[size_t(t)];
      }
      nb[i] = sig_ids.emplace(sig, int32_t(sig_ids.size())).first->second;
    }
    const bool stable = sig_ids.size() == n_blocks;
    n_blocks = sig_ids.size();
    block = std::move(nb);
    if (stable) break;
  }
  // Renumber blocks so the start state is 0 and the order is deterministic (first appearance).
  std::vector<int32_t> renum(n_blocks, -1);
  int32_t next_id = 0;
  for (size_t i = 0; i < m; ++i)
    if (renum[size_t(block[i])] < 0) renum[size_t(block[i])] = next_id++;
  std::vector<Row> min_rows(n_blocks);
  std::vector<uint8_t> min_acc(n_blocks, 0);
  for (size_t i = 0; i < m; ++i) {
    const size_t s = size_t(renum[size_t(block[i])]);
    min_acc[s] = acc[size_t(order[i])];
    for (int b = 0; b < 256; ++b) {
      const int32_t t = target(i, b);
      min_rows[s][size_t(b)] = t < 0 ? -1 : renum[size_t(block[size_t(t)])];
    }
  }
  // Byte classes: bytes whose columns are equal share a class.
  std::map<std::vector<int32_t>, uint8_t> col_ids;
  std::vector<int32_t> col(n_blocks);
  for (int b = 0; b < 256; ++b) {
    for (size_t s = 0; s < n_blocks; ++s) col[s] = min_rows[s][size_t(b)];
    d.byte_class[size_t(b)] = col_ids.emplace(col, uint8_t(col_ids.size())).first->second;
  }
  d.n_classes = uint32_t(col_ids.size());
  d.start = 0;
  d.next.assign(n_blocks * d.n_classes, -1);
  d.accepting = min_acc;
  d.has_out.assign(n_blocks, 0);
  d.out_bytes.assign(n_blocks, {0, 0, 0, 0});
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (size_t s = 0; s < n_blocks; ++s) {
    mix(min_acc[s]);
    for (int b = 0; b < 256; ++b) {
      const int32_t t = min_rows[s][size_t(b)];
      d.next[s * d.n_classes + d.byte_class[size_t(b)]] = t;
      mix(uint64_t(int64_t(t)) + 7);
      if (t >= 0) d.has_out[s] = 1, d.out_bytes[s][size_t(b) >> 6] |= 1ull << (b & 63);
    }
  }
  d.hash = h ^ (uint64_t(n_blocks) << 40);
  return d;
}

}  // namespace

Dfa determinize(const Nfa& nfa, Frag frag, size_t max_states) {
  // Byte classes of the NFA's edges: subset construction moves on one representative byte per class.
  std::array<uint8_t, 257> cut{};
  cut[0] = 1;
  for (const auto& es : nfa.edges)
    for (const auto& e : es) cut[e.lo] = 1, cut[size_t(e.hi) + 1] = 1;
  std::vector<std::pair<int, int>> classes;  // [lo, hi]
  for (int b = 0; b < 256;) {
    int e = b + 1;
    while (e < 256 && !cut[size_t(e)]) ++e;
    classes.push_back({b, e - 1});
    b = e;
  }
  std::vector<uint32_t> mark(nfa.edges.size(), 0);
  uint32_t stamp = 0;
  auto close = [&](std::vector<uint32_t>& set) {
    ++stamp;
    std::vector<uint32_t> stack = set;
    set.clear();
    while (!stack.empty()) {
      const uint32_t s = stack.back();
      stack.pop_back();
      if (mark[s] == stamp) continue;
      mark[s] = stamp;
      set.push_back(s);
      for (uint32_t t : nfa.eps[s]) stack.push_back(t);
    }
    std::sort(set.begin(), set.end());
  };
  std::map<std::vector<uint32_t>, int32_t> ids;
  std::vector<std::vector<uint32_t>> sets;
  std::vector<Row> rows;
  std::vector<uint8_t> acc;
  auto intern = [&](std::vector<uint32_t> set) -> int32_t {
    if (set.empty()) return -1;
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    KILN_CHECK(sets.size() < max_states, "grammar: an automaton needs more than ", max_states,
               " DFA states (the limit): simplify the pattern or shrink its repetition counts");
    const int32_t id = int32_t(sets.size());
    acc.push_back(std::binary_search(set.begin(), set.end(), frag.end) ? 1 : 0);
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    rows.emplace_back();
    return id;
  };
  std::vector<uint32_t> init{frag.start};
  close(init);
  intern(init);
  for (size_t i = 0; i < sets.size(); ++i) {
    for (auto [lo, hi] : classes) {
      std::vector<uint32_t> moved;
      for (uint32_t s : sets[i])
        for (const auto& e : nfa.edges[s])
          if (e.lo <= lo && hi <= e.hi) moved.push_back(e.to);
      std::sort(moved.begin(), moved.end());
      moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
      close(moved);
      const int32_t t = intern(std::move(moved));
      for (int b = lo; b <= hi; ++b) rows[i][size_t(b)] = t;
    }
  }
  return finish(rows, acc, 0);
}

namespace {
Dfa product(const Dfa& a, const Dfa& b, bool intersect, size_t max_states) {
  if (a.start < 0) return a;
  if (intersect && b.start < 0) return b;
  std::map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::vector<Row> rows;
  std::vector<uint8_t> acc;
  auto intern = [&](int32_t x, int32_t y) -> int32_t {
    if (x < 0 || (intersect && y < 0)) return -1;
    auto it = ids.find({x, y});
    if (it != ids.end()) return it->second;
    KILN_CHECK(pairs.size() < max_states,
               "grammar: a combined automaton (pattern with lengths, or property names) needs more than ",
               max_states, " states (the limit)");
    const int32_t id = int32_t(pairs.size());
    ids.emplace(std::make_pair(x, y), id);
    pairs.push_back({x, y});
    const bool in_b = y >= 0 && b.accepting[size_t(y)];
    acc.push_back(a.accepting[size_t(x)] && (intersect ? in_b : !in_b) ? 1 : 0);
    rows.emplace_back();
    return id;
  };
  intern(a.start, b.start);
  for (size_t i = 0; i < pairs.size(); ++i)
    for (int c = 0; c < 256; ++c) {
      const auto [x, y] = pairs[i];
      const int32_t nx = a.step(x, uint8_t(c));
      const int32_t ny = y < 0 ? -1 : b.step(y, uint8_t(c));
      const int32_t t = intern(nx, ny);
      rows[i][size_t(c)] = t;
    }
  return finish(rows, acc, 0);
}
}  // namespace

Dfa dfa_difference(const Dfa& a, const Dfa& b, size_t max_states) {
  return product(a, b, false, max_states);
}
Dfa dfa_intersection(const Dfa& a, const Dfa& b, size_t max_states) {
  return product(a, b, true, max_states);
}

}  // namespace kiln::grammar
