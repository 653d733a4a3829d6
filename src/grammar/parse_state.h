// The parser: a set of persistent stacks over the flattened grammar (GLR-like, tree-structured). A stack is
// a Top (a lexeme position, its DFA state) over a chain of Frames (call positions to return to). Frames are
// immutable and appended to an arena, so a ParseState is a small vector and earlier states stay valid:
// rollback is dropping the states after it and truncating the arena.
//
// Invariants: every Top's DFA state has a live transition (states that can only accept are closed over at
// once); tops are sorted and unique; frames are interned within one step so equal stacks share frames.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace kiln::grammar {

struct Top {
  uint32_t pos;
  int32_t state;
  uint32_t frame;
  auto operator<=>(const Top&) const = default;
};

struct Frame {
  uint32_t call_pos;
  uint32_t parent;
  uint32_t depth;
};

// Frame 0 is the root's caller (returning to it completes the output); frame 1 stands for "whatever lies
// below" in the mask cache's context-free walks (returning to it is an exit from the walked rule).
constexpr uint32_t kRootFrame = 0;
constexpr uint32_t kBottomFrame = 1;

struct ParseState {
  std::vector<Top> tops;
  bool complete = false;  // the whole output may end here
  bool exited = false;    // a walk under kBottomFrame returned through it at this byte
  void clear() {
    tops.clear();
    complete = exited = false;
  }
  bool alive() const { return !tops.empty() || complete; }
};

// Open addressing over 64-bit keys, cleared in O(1) by a generation stamp.
class KeyTable {
 public:
  KeyTable() { grow(64); }
  void clear() { ++stamp_, size_ = 0; }
  // Returns the value for key, inserting `value` if absent; `inserted` says which.
  uint32_t find_or_insert(uint64_t key, uint32_t value, bool& inserted);

 private:
  struct Slot {
    uint64_t key;
    uint32_t value, stamp;
  };
  void grow(size_t cap);
  std::vector<Slot> slots_;
  uint32_t stamp_ = 1;
  size_t size_ = 0;
};

class Stepper {
 public:
  Stepper(const FlatGrammar& g, uint32_t max_depth, size_t max_tops);

  void start(ParseState& out);                                  // the root rule, before any byte
  void after(uint32_t pos, uint32_t frame, ParseState& out);    // closure from a position (fresh step)
  void pop(uint32_t frame, ParseState& out);                    // closure after returning to frame
  void step(const ParseState& in, uint8_t b, ParseState& out);  // one byte
  // Steps over bytes from st (st is overwritten); false as soon as the state dies.
  bool walk(ParseState& st, std::string_view bytes);
  const Frame& frame(uint32_t f) const { return frames_[f]; }
  size_t num_frames() const { return frames_.size(); }
  void truncate(size_t n) { frames_.resize(n); }
  const FlatGrammar& grammar() const { return g_; }

 private:
  void close(uint32_t pos, uint32_t frame, ParseState& out);
  void finish(ParseState& out) const;
  const FlatGrammar& g_;
  uint32_t max_depth_;
  size_t max_tops_;
  std::vector<Frame> frames_;
  KeyTable visited_, interned_;
  ParseState scratch_;
};

}  // namespace kiln::grammar
