#include "grammar/parse_state.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::grammar {

void KeyTable::grow(size_t cap) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, {0, 0, 0});
  const uint32_t live = stamp_;
  size_ = 0;
  for (const auto& s : old)
    if (s.stamp == live) {
      bool ins;
      find_or_insert(s.key, s.value, ins);
    }
}

uint32_t KeyTable::find_or_insert(uint64_t key, uint32_t value, bool& inserted) {
  if ((size_ + 1) * 2 > slots_.size()) grow(slots_.size() * 2);
  const size_t mask = slots_.size() - 1;
  size_t i = size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  for (;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.stamp != stamp_) {
      s = {key, value, stamp_};
      ++size_;
      inserted = true;
      return value;
    }
    if (s.key == key) {
      inserted = false;
      return s.value;
    }
  }
}

Stepper::Stepper(const FlatGrammar& g, uint32_t max_depth, size_t max_tops)
    : g_(g), max_depth_(max_depth), max_tops_(max_tops) {
  frames_.push_back({0, kRootFrame, 0});
  frames_.push_back({0, kBottomFrame, 0});
}

void Stepper::finish(ParseState& out) const {
  if (out.tops.size() > 1) {
    std::sort(out.tops.begin(), out.tops.end());
    out.tops.erase(std::unique(out.tops.begin(), out.tops.end()), out.tops.end());
  }
  KILN_CHECK(out.tops.size() <= max_tops_, "grammar: more than ", max_tops_,
             " parse stacks at once (the limit): the grammar is too ambiguous");
}

void Stepper::pop(uint32_t frame, ParseState& out) {
  if (frame == kRootFrame) {
    out.complete = true;
  } else if (frame == kBottomFrame) {
    out.exited = true;
  } else {
    const Frame f = frames_[frame];
    close(f.call_pos + 1, f.parent, out);
  }
}

void Stepper::close(uint32_t pos, uint32_t frame, ParseState& out) {
  bool inserted;
  visited_.find_or_insert((uint64_t(pos) << 32) | frame, 0, inserted);
  if (!inserted) return;
  const Position& p = g_.pos[pos];
  switch (p.kind) {
    case Position::Kind::end:
      pop(frame, out);
      return;
    case Position::Kind::lexeme: {
      const Dfa& d = g_.lexemes[p.id];
      if (d.has_out[size_t(d.start)]) out.tops.push_back({pos, d.start, frame});
      if (d.accepting[size_t(d.start)]) close(pos + 1, frame, out);
      return;
    }
    case Position::Kind::call: {
      uint32_t callee_frame = frame;
      if (!p.tail) {  // tail calls return straight to the caller's caller: no frame, no growth
        const uint32_t depth = frames_[frame].depth + 1;
        if (depth > max_depth_) return;  // nesting limit: this path ends
        const uint32_t fresh = uint32_t(frames_.size());
        callee_frame = interned_.find_or_insert((uint64_t(pos) << 32) | frame, fresh, inserted);
        if (inserted) frames_.push_back({pos, frame, depth});
      }
      for (uint32_t s : g_.alt_starts[p.id]) close(s, callee_frame, out);
      return;
    }
  }
}

void Stepper::start(ParseState& out) {
  out.clear();
  visited_.clear(), interned_.clear();
  for (uint32_t s : g_.alt_starts[g_.root]) close(s, kRootFrame, out);
  finish(out);
}

void Stepper::after(uint32_t pos, uint32_t frame, ParseState& out) {
  out.clear();
  visited_.clear(), interned_.clear();
  close(pos, frame, out);
  finish(out);
}

void Stepper::step(const ParseState& in, uint8_t b, ParseState& out) {
  out.clear();
  visited_.clear(), interned_.clear();
  for (const Top& t : in.tops) {
    const Dfa& d = g_.lexemes[g_.pos[t.pos].id];
    const int32_t s = d.step(t.state, b);
    if (s < 0) continue;
    if (d.has_out[size_t(s)]) out.tops.push_back({t.pos, s, t.frame});
    if (d.accepting[size_t(s)]) close(t.pos + 1, t.frame, out);
  }
  finish(out);
}

bool Stepper::walk(ParseState& st, std::string_view bytes) {
  for (char c : bytes) {
    if (st.tops.empty()) return false;
    step(st, uint8_t(c), scratch_);
    std::swap(st, scratch_);
    if (!st.alive() && !st.exited) return false;
  }
  return true;
}

}  // namespace kiln::grammar
