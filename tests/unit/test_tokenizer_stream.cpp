// StreamDecoder: fed one id at a time, it emits only complete UTF-8, and everything it emits, concatenated,
// equals decode(all ids) — with and without skip_special_tokens, for ids that split characters.
#include <random>

#include "test_tokenizer_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/unicode.h"

namespace {

using kiln::test::fixture;

// The single-byte token for b (encode never emits one alone for a non-ASCII byte, so look it up).
int32_t byte_token(const kiln::Tokenizer& tk, uint8_t b) {
  std::string ch;
  kiln::tok::utf8_append(kiln::tok::byte_to_char()[b], ch);
  return *tk.token_id(ch);
}

std::string stream_all(const kiln::Tokenizer& tk, const std::vector<int32_t>& ids, bool skip) {
  kiln::StreamDecoder sd(tk, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    EXPECT_EQ(kiln::tok::utf8_find_invalid(piece), std::string_view::npos) << "emitted invalid UTF-8";
    all += piece;
  }
  const std::string rest = sd.flush();
  EXPECT_EQ(kiln::tok::utf8_find_invalid(rest), std::string_view::npos);
  return all + rest;
}

TEST(StreamDecoder, ConcatenationEqualsDecodeOnGoldens) {
  KILN_REQUIRE_QWEN3();
  const auto hf = fixture("goldens_hf.json");
  for (const auto& g : hf["goldens"]) {
    const auto ids = g["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(stream_all(*tk, ids, false), g["decoded"].get<std::string>());
    EXPECT_EQ(stream_all(*tk, ids, true), g["decoded_skip"].get<std::string>());
  }
}

TEST(StreamDecoder, HoldsBackASplitCharacterUntilComplete) {
  KILN_REQUIRE_QWEN3();
  // "😀" is four bytes; byte-level tokens for its bytes are emitted as one character once all four arrived.
  const std::string smile = "\xF0\x9F\x98\x80";
  std::vector<int32_t> ids;
  for (char c : smile) ids.push_back(byte_token(*tk, static_cast<uint8_t>(c)));
  kiln::StreamDecoder sd(*tk, false);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.push(ids[3]), smile);
  EXPECT_EQ(sd.flush(), "");
  // An interrupted sequence becomes U+FFFD as soon as it is known to be invalid, like decode().
  kiln::StreamDecoder sd2(*tk, false);
  EXPECT_EQ(sd2.push(ids[0]), "");
  EXPECT_EQ(sd2.push(*tk->token_id("a")),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(sd2.push(ids[0]), "");
  EXPECT_EQ(sd2.flush(), "\xEF\xBF\xBD");
}

TEST(StreamDecoder, RandomIdSequencesMatchDecode) {
  KILN_REQUIRE_QWEN3();
  // Random mixes of single-byte tokens (which split characters), ordinary tokens and special tokens.
  std::mt19937 rng(7);
  std::vector<int32_t> byte_ids;
  for (int b = 0; b < 256; ++b) byte_ids.push_back(byte_token(*tk, uint8_t(b)));
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ids(rng() % 12);
    for (auto& id : ids) {
      const unsigned r = rng() % 10;
      id = r < 6 ? byte_ids[rng() % 256] : r < 9 ? int32_t(rng() % 151643) : int32_t(151643 + rng() % 26);
    }
    for (bool skip : {false, true})
      ASSERT_EQ(stream_all(*tk, ids, skip), tk->decode(ids, skip)) << nlohmann::json(ids).dump();
  }
}

TEST(StreamDecoder, RejectsOutOfRangeIds) {
  KILN_REQUIRE_QWEN3();
  kiln::StreamDecoder sd(*tk, false);
  EXPECT_THROW(sd.push(-5), kiln::Error);
  EXPECT_THROW(sd.push(int32_t(tk->vocab_size())), kiln::Error);
}

}  // namespace
