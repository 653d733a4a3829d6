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

constexpr size_t kMinimizeLimit = 96;

// A DFA under construction: rows of nc columns; col_of maps each byte to its column.
struct RawDfa {
  uint32_t nc = 0;
  std::array<uint8_t, 256> col_of{};
  std::vector<int32_t> next;  // [state * nc + column]; -1 dead
  std::vector<uint8_t> acc;
  size_t size() const { return acc.size(); }
  int32_t at(size_t s, uint32_t c) const { return next[s * nc + c]; }
};

// Keeps only states reachable from state 0 that can reach an accepting state, merges equivalent states
// (Moore refinement), and compresses the columns into byte classes.
Dfa finish(const RawDfa& raw) {
  const size_t n = raw.size();
  const uint32_t nc = raw.nc;
  std::vector<std::vector<int32_t>> rev(n);
  for (size_t s = 0; s < n; ++s)
    for (uint32_t c = 0; c < nc; ++c) {
      const int32_t t = raw.at(s, c);
      if (t >= 0) rev[size_t(t)].push_back(int32_t(s));
    }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> work;
  for (size_t s = 0; s < n; ++s)
    if (raw.acc[s]) live[s] = 1, work.push_back(int32_t(s));
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (int32_t s : rev[size_t(t)])
      if (!live[size_t(s)]) live[size_t(s)] = 1, work.push_back(s);
  }
  Dfa d;
  if (n == 0 || !live[0]) {
    d.hash = 0x9e3779b97f4a7c15ull;
    return d;
  }
  std::vector<int32_t> order, id(n, -1);
  id[0] = 0;
  order.push_back(0);
  for (size_t i = 0; i < order.size(); ++i)
    for (uint32_t c = 0; c < nc; ++c) {
      const int32_t t = raw.at(size_t(order[i]), c);
      if (t >= 0 && live[size_t(t)] && id[size_t(t)] < 0)
        id[size_t(t)] = int32_t(order.size()), order.push_back(t);
    }
  const size_t m = order.size();
  auto target = [&](size_t i, uint32_t c) {
    const int32_t t = raw.at(size_t(order[i]), c);
    return (t >= 0 && live[size_t(t)]) ? id[size_t(t)] : -1;
  };
  // Moore refinement: block of a state = (its block, blocks of its successors), until the count is stable.
  // It takes up to m rounds (long chains: bounded repetitions), so big automata stay as built: subset
  // construction of our regexes is near-minimal, and an unminimized DFA is just as correct.
  std::vector<int32_t> block(m);
  size_t n_blocks = 0;
  const bool minimize = m <= kMinimizeLimit;
  for (size_t i = 0; i < m; ++i) block[i] = minimize ? (raw.acc[size_t(order[i])] ? 1 : 0) : int32_t(i);
  if (!minimize) n_blocks = m;
  // Rows of signatures in one flat array, grouped by sorting row indices: no allocation per state.
  const size_t w = nc + 1;
  std::vector<int32_t> sig(m * w);
  std::vector<uint32_t> idx(m);
  auto row_less = [&](uint32_t a, uint32_t b) {
    return std::lexicographical_compare(sig.begin() + ptrdiff_t(a * w), sig.begin() + ptrdiff_t(a * w + w),
                                        sig.begin() + ptrdiff_t(b * w), sig.begin() + ptrdiff_t(b * w + w));
  };
  auto row_eq = [&](uint32_t a, uint32_t b) {
    return std::equal(sig.begin() + ptrdiff_t(a * w), sig.begin() + ptrdiff_t(a * w + w),
                      sig.begin() + ptrdiff_t(b * w));
  };
  for (; minimize;) {
    for (size_t i = 0; i < m; ++i) {
      sig[i * w] = block[i];
      for (uint32_t c = 0; c < nc; ++c) {
        const int32_t t = target(i, c);
        sig[i * w + c + 1] = t < 0 ? -1 : block[size_t(t)];
      }
      idx[i] = uint32_t(i);
    }
    std::sort(idx.begin(), idx.end(), row_less);
    std::vector<int32_t> nb(m);
    int32_t next_block = -1;
    for (size_t k = 0; k < m; ++k) {
      if (k == 0 || !row_eq(idx[k - 1], idx[k])) ++next_block;
      nb[idx[k]] = next_block;
    }
    const size_t count = size_t(next_block + 1);
    const bool stable = count == n_blocks;
    n_blocks = count;
    block = std::move(nb);
    if (stable) break;
  }
  std::vector<int32_t> renum(n_blocks, -1);
  int32_t next_id = 0;
  for (size_t i = 0; i < m; ++i)
    if (renum[size_t(block[i])] < 0) renum[size_t(block[i])] = next_id++;
  std::vector<int32_t> rows(n_blocks * nc, -1);
  std::vector<uint8_t> min_acc(n_blocks, 0);
  for (size_t i = 0; i < m; ++i) {
    const size_t s = size_t(renum[size_t(block[i])]);
    min_acc[s] = raw.acc[size_t(order[i])];
    for (uint32_t c = 0; c < nc; ++c) {
      const int32_t t = target(i, c);
      rows[s * nc + c] = t < 0 ? -1 : renum[size_t(block[size_t(t)])];
    }
  }
  // Byte classes: columns that are equal after minimization share a class.
  std::map<std::vector<int32_t>, uint8_t> col_ids;
  std::vector<uint8_t> class_of_col(nc);
  std::vector<int32_t> col(n_blocks);
  for (uint32_t c = 0; c < nc; ++c) {
    for (size_t s = 0; s < n_blocks; ++s) col[s] = rows[s * nc + c];
    class_of_col[c] = col_ids.emplace(col, uint8_t(col_ids.size())).first->second;
  }
  for (int b = 0; b < 256; ++b) d.byte_class[size_t(b)] = class_of_col[raw.col_of[size_t(b)]];
  d.n_classes = uint32_t(col_ids.size());
  d.start = 0;
  d.next.assign(n_blocks * d.n_classes, -1);
  d.accepting = min_acc;
  d.has_out.assign(n_blocks, 0);
  d.out_bytes.assign(n_blocks, {0, 0, 0, 0});
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (size_t s = 0; s < n_blocks; ++s)
    for (int b = 0; b < 256; ++b) {
      const int32_t t = rows[s * nc + raw.col_of[size_t(b)]];
      d.next[s * d.n_classes + d.byte_class[size_t(b)]] = t;
      if (t >= 0) d.has_out[s] = 1, d.out_bytes[s][size_t(b) >> 6] |= 1ull << (b & 63);
    }
  // The content hash: classes, table and accepting flags (the DFA is canonical once built this way).
  for (int b = 0; b < 256; ++b) mix(d.byte_class[size_t(b)]);
  for (int32_t t : d.next) mix(uint64_t(int64_t(t)) + 7);
  for (uint8_t a : min_acc) mix(a);
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
  RawDfa raw;
  raw.nc = uint32_t(classes.size());
  for (uint32_t c = 0; c < raw.nc; ++c)
    for (int b = classes[c].first; b <= classes[c].second; ++b) raw.col_of[size_t(b)] = uint8_t(c);
  auto intern = [&](std::vector<uint32_t> set) -> int32_t {
    if (set.empty()) return -1;
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    KILN_CHECK(sets.size() < max_states, "grammar: an automaton needs more than ", max_states,
               " DFA states (the limit): simplify the pattern or shrink its repetition counts");
    const int32_t id = int32_t(sets.size());
    raw.acc.push_back(std::binary_search(set.begin(), set.end(), frag.end) ? 1 : 0);
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    raw.next.resize(raw.next.size() + raw.nc, -1);
    return id;
  };
  std::vector<uint32_t> init{frag.start};
  close(init);
  intern(init);
  for (size_t i = 0; i < sets.size(); ++i) {
    for (uint32_t c = 0; c < raw.nc; ++c) {
      const auto [lo, hi] = classes[c];
      std::vector<uint32_t> moved;
      for (uint32_t s : sets[i])
        for (const auto& e : nfa.edges[s])
          if (e.lo <= lo && hi <= e.hi) moved.push_back(e.to);
      std::sort(moved.begin(), moved.end());
      moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
      close(moved);
      const int32_t t = intern(std::move(moved));
      raw.next[i * raw.nc + c] = t;
    }
  }
  return finish(raw);
}

namespace {
Dfa product(const Dfa& a, const Dfa& b, bool intersect, size_t max_states) {
  if (a.start < 0) return a;
  if (intersect && b.start < 0) return b;
  std::map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  RawDfa raw;
  std::map<std::pair<uint8_t, uint8_t>, uint8_t> cols;
  std::vector<uint8_t> rep;  // a byte of each column
  for (int c = 0; c < 256; ++c) {
    const auto key = std::make_pair(a.byte_class[size_t(c)], b.byte_class[size_t(c)]);
    auto it = cols.find(key);
    if (it == cols.end()) {
      it = cols.emplace(key, uint8_t(cols.size())).first;
      rep.push_back(uint8_t(c));
    }
    raw.col_of[size_t(c)] = it->second;
  }
  raw.nc = uint32_t(cols.size());
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
    raw.acc.push_back(a.accepting[size_t(x)] && (intersect ? in_b : !in_b) ? 1 : 0);
    raw.next.resize(raw.next.size() + raw.nc, -1);
    return id;
  };
  intern(a.start, b.start);
  for (size_t i = 0; i < pairs.size(); ++i)
    for (uint32_t c = 0; c < raw.nc; ++c) {
      const auto [x, y] = pairs[i];
      const int32_t nx = a.step(x, rep[c]);
      const int32_t ny = y < 0 ? -1 : b.step(y, rep[c]);
      const int32_t t = intern(nx, ny);
      raw.next[i * raw.nc + c] = t;
    }
  return finish(raw);
}
}  // namespace

Dfa dfa_from_table(const std::vector<int32_t>& next, const std::vector<uint8_t>& accepting,
                   const std::array<uint8_t, 256>& col_of, uint32_t n_cols) {
  RawDfa raw;
  raw.nc = n_cols;
  raw.col_of = col_of;
  raw.next = next;
  raw.acc = accepting;
  return finish(raw);
}

Dfa dfa_difference(const Dfa& a, const Dfa& b, size_t max_states) {
  return product(a, b, false, max_states);
}
Dfa dfa_intersection(const Dfa& a, const Dfa& b, size_t max_states) {
  return product(a, b, true, max_states);
}

}  // namespace kiln::grammar
