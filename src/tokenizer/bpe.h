// Byte-level BPE (GPT-2 style, as Qwen3 uses): a pre-token's UTF-8 bytes become one symbol each, then the
// adjacent pair with the lowest merge rank is merged, leftmost first, until no pair has a rank. Words up to
// kNaiveMax (24) symbols use a direct scan; longer ones a heap over a linked list (O(n log n)), so one huge
// pre-token (100k letters, spaces, digits) stays fast.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::tok {

// GPT-2's bytes_to_unicode: byte -> code point of the printable stand-in char used in vocab strings.
const std::array<uint32_t, 256>& byte_to_char();
// The inverse for code points < 324 (-1 where a code point is no stand-in).
int char_to_byte(uint32_t cp);
// A fast 64-bit hash of a short byte string (vocab lookups, the per-call word cache).
uint64_t hash_bytes(std::string_view s);

class BpeModel {
 public:
  // vocab: id -> token string (byte-level chars), merges in rank order as (left, right) token strings.
  BpeModel(const std::vector<std::pair<std::string, int32_t>>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges);

  // Appends the ids of one pre-token given as raw bytes (not byte-level chars).
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

  int32_t vocab_size() const { return int32_t(id_to_token_.size()); }  // max model id + 1
  const std::string& token(int32_t id) const { return id_to_token_[size_t(id)]; }
  bool has_id(int32_t id) const {
    return id >= 0 && size_t(id) < id_to_token_.size() && !id_to_token_[size_t(id)].empty();
  }
  int32_t find(std::string_view token) const;  // -1 when absent
  int32_t byte_id(uint8_t b) const { return byte_id_[b]; }

 private:
  static constexpr size_t kNaiveMax = 24;
  struct MergeSlot {
    uint64_t key = ~0ull;  // (left << 32) | right; ~0 = empty
    uint32_t rank = 0;
    int32_t id = 0;
  };
  const MergeSlot* lookup(int32_t a, int32_t b) const;
  void merge_heap(std::vector<int32_t>& sym) const;

  std::vector<std::string> id_to_token_;
  struct VocabSlot {
    uint64_t hash = 0;
    int32_t id = -1;  // -1: empty
  };
  std::vector<VocabSlot> vocab_slots_;  // open addressing over id_to_token_, power-of-two size
  std::array<int32_t, 256> byte_id_{};
  std::vector<MergeSlot> merges_;  // open addressing, power-of-two size
  uint64_t mask_ = 0;
};

}  // namespace kiln::tok
