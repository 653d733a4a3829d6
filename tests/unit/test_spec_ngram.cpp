// spec::NgramIndex against a brute-force search, at every length of random sequences (small vocabularies so
// that matches of every length occur), and the option parsing of spec/spec_options.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>

#include "kiln/error.h"
#include "spec/ngram_index.h"
#include "spec/spec_options.h"

namespace kiln::spec {
namespace {

// The definition, searched directly: the longest n in [min_n, max_n] whose last-n suffix occurs ending at an
// earlier e, the latest such e; then k tokens: the sequence extended token by token by copying from e on.
std::vector<int32_t> brute_force(const std::vector<int32_t>& s, int32_t min_n, int32_t max_n, int32_t k,
                                 NgramMatch* match) {
  const int64_t L = int64_t(s.size());
  *match = {};
  for (int32_t n = max_n; n >= min_n; --n) {
    for (int64_t e = L - 1; e >= n; --e) {
      bool eq = true;
      for (int32_t i = 1; i <= n && eq; ++i) eq = s[size_t(e - i)] == s[size_t(L - i)];
      if (!eq) continue;
      *match = {n, int32_t(e)};
      std::vector<int32_t> ext = s;  // the sequence extended by copying from e on
      for (int32_t i = 0; i < k; ++i) ext.push_back(ext[size_t(e + i)]);
      return std::vector<int32_t>(ext.begin() + L, ext.end());
    }
  }
  return {};
}

TEST(SpecNgram, MatchesBruteForceAtEveryLength) {
  std::mt19937_64 rng(20261206);
  struct Case {
    int32_t vocab, min_n, max_n, k;
  };
  int64_t matched = 0, checked = 0;
  for (const Case c :
       {Case{2, 1, 4, 3}, Case{3, 2, 5, 5}, Case{5, 1, 12, 8}, Case{8, 3, 3, 1}, Case{4, 1, 1, 2}}) {
    for (int rep = 0; rep < 4; ++rep) {
      NgramIndex idx(c.min_n, c.max_n);
      std::vector<int32_t> s;
      for (int i = 0; i < 400; ++i) {
        // Stretches copied from earlier in the sequence, as code edits quote text back.
        const int32_t t =
            (i > 20 && rng() % 4 == 0) ? s[size_t(rng() % s.size())] : int32_t(rng() % uint64_t(c.vocab));
        s.push_back(t);
        idx.append(t);
        NgramMatch want;
        const std::vector<int32_t> draft = brute_force(s, c.min_n, c.max_n, c.k, &want);
        const NgramMatch got = idx.longest_match();
        ASSERT_EQ(got.n, want.n) << "vocab " << c.vocab << " length " << s.size();
        ASSERT_EQ(got.end, want.end) << "vocab " << c.vocab << " length " << s.size();
        ASSERT_EQ(idx.propose(c.k), draft) << "vocab " << c.vocab << " length " << s.size();
        matched += want.n > 0;
        ++checked;
      }
    }
  }
  EXPECT_GT(matched, checked / 2);  // the comparison covered matches, not only misses
}

// Random text over `vocab` tokens, with stretches copied from earlier in it (so long matches occur too).
std::vector<int32_t> quoting_text(std::mt19937_64& rng, int32_t vocab, size_t len) {
  std::vector<int32_t> s;
  size_t src = 0, copy = 0;
  while (s.size() < len) {
    if (copy == 0 && s.size() > 8 && rng() % 8 == 0) src = rng() % s.size(), copy = 1 + rng() % 24;
    s.push_back(copy > 0 ? s[src++] : int32_t(rng() % uint64_t(vocab)));
    copy -= copy > 0;
  }
  return s;
}

// The one flat table holds every length and grows by rehashing: from empty, through appends one token at a
// time and in spans (append(span) reserves up front), the answers match the definition after every append.
TEST(SpecNgram, MatchesBruteForceThroughTableGrowth) {
  std::mt19937_64 rng(20261207);
  struct Window {
    int32_t min_n, max_n;
  };
  int64_t matched = 0, checked = 0;
  for (const int32_t vocab : {2, 3, 50}) {
    for (const Window w : {Window{1, 12}, Window{2, 6}, Window{3, 3}, Window{1, 1}, Window{4, 64}}) {
      const std::vector<int32_t> text = quoting_text(rng, vocab, 1500);
      NgramIndex idx(w.min_n, w.max_n);
      std::vector<int32_t> s;
      while (s.size() < text.size()) {
        // Mostly one token, else a span of up to 40 (an empty one too).
        const size_t len = std::min(text.size() - s.size(), rng() % 4 ? size_t(1) : size_t(rng() % 41));
        const std::span<const int32_t> part(text.data() + s.size(), len);
        if (len == 1 && rng() % 2) {
          idx.append(part[0]);
        } else {
          idx.append(part);
        }
        s.insert(s.end(), part.begin(), part.end());
        ASSERT_EQ(idx.tokens(), s);
        const int32_t k = 1 + int32_t(rng() % 10);
        NgramMatch want;
        const std::vector<int32_t> draft = brute_force(s, w.min_n, w.max_n, k, &want);
        const NgramMatch got = idx.longest_match();
        const std::string where = "vocab " + std::to_string(vocab) + " window [" + std::to_string(w.min_n) +
                                  ", " + std::to_string(w.max_n) + "] length " + std::to_string(s.size());
        ASSERT_EQ(got.n, want.n) << where;
        ASSERT_EQ(got.end, want.end) << where;
        ASSERT_EQ(idx.propose(k), draft) << where;
        matched += want.n > 0;
        ++checked;
      }
    }
  }
  EXPECT_GT(matched, checked / 2);
}

// 100k tokens over 4 tokens: the table grows many times (token by token) or is reserved once (one span); both
// keep the definition's answers, compared at checkpoints.
TEST(SpecNgram, GrowthKeepsResults) {
  std::mt19937_64 rng(7);
  const std::vector<int32_t> text = quoting_text(rng, 4, 100000);
  NgramIndex idx(1, 12);
  std::vector<int32_t> s;
  int32_t long_matches = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    idx.append(text[i]);
    s.push_back(text[i]);
    if (i % 997 != 0 && i + 1 != text.size()) continue;
    NgramMatch want;
    const std::vector<int32_t> draft = brute_force(s, 1, 12, 6, &want);
    const NgramMatch got = idx.longest_match();
    ASSERT_EQ(got.n, want.n) << "length " << s.size();
    ASSERT_EQ(got.end, want.end) << "length " << s.size();
    ASSERT_EQ(idx.propose(6), draft) << "length " << s.size();
    long_matches += want.n == 12;
  }
  EXPECT_GT(long_matches, 10);  // the copied stretches made full-window matches at some checkpoints
  NgramIndex whole(1, 12);
  whole.append(text);
  EXPECT_EQ(whole.tokens(), idx.tokens());
  EXPECT_EQ(whole.longest_match().n, idx.longest_match().n);
  EXPECT_EQ(whole.longest_match().end, idx.longest_match().end);
  EXPECT_EQ(whole.propose(9), idx.propose(9));
}

TEST(SpecNgram, DraftsTheContinuationOfTheLatestLongestMatch) {
  NgramIndex idx(1, 3);
  idx.append(std::vector<int32_t>{1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3});
  const NgramMatch m = idx.longest_match();
  EXPECT_EQ(m.n, 3);
  EXPECT_EQ(m.end, 7);  // "1 2 3" twice before: the later one, followed by 7 5
  EXPECT_EQ(idx.propose(2), (std::vector<int32_t>{7, 5}));
  // Past the end the draft repeats itself: the text from position 7 on has period 5.
  EXPECT_EQ(idx.propose(8), (std::vector<int32_t>{7, 5, 1, 2, 3, 7, 5, 1}));
  NgramIndex run(1, 4);
  run.append(std::vector<int32_t>{3, 8, 8, 8});
  EXPECT_EQ(run.propose(5), (std::vector<int32_t>{8, 8, 8, 8, 8}));  // "8 8 8" ends at 3: a run of period 1
  EXPECT_TRUE(idx.propose(0).empty());
  NgramIndex fresh(2, 4);
  fresh.append(std::vector<int32_t>{4, 5, 6});
  EXPECT_TRUE(fresh.propose(4).empty());  // nothing repeats
  EXPECT_THROW(NgramIndex(0, 3), Error);
  EXPECT_THROW(NgramIndex(4, 3), Error);
}

TEST(SpecOptions, ParsesVllmJsonAndRejectsBadFields) {
  SpecOptions o;
  apply_vllm_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4})",
                                &o);
  EXPECT_EQ(o.algorithm, SpecAlgorithm::ngram);
  EXPECT_EQ(o.num_draft_tokens, 5);
  EXPECT_EQ(o.ngram_min, 4);  // vLLM: one bound sets the other
  EXPECT_EQ(o.ngram_max, 4);
  EXPECT_NO_THROW(validate_spec_options(o));
  EXPECT_THROW(apply_vllm_speculative_config(R"({"method": "eagle3"})", &o), Error);
  EXPECT_THROW(apply_vllm_speculative_config(R"({"method": "ngram", "model": "x"})", &o), Error);
  EXPECT_THROW(apply_vllm_speculative_config(R"({"num_speculative_tokens": 3})", &o), Error);
  EXPECT_THROW(apply_vllm_speculative_config("{not json", &o), Error);
  EXPECT_EQ(parse_spec_algorithm("NGRAM"), SpecAlgorithm::ngram);
  EXPECT_EQ(parse_spec_algorithm("EAGLE3"), SpecAlgorithm::eagle3);
  SpecOptions e;
  e.algorithm = SpecAlgorithm::eagle3;
  EXPECT_THROW(validate_spec_options(e), Error) << "EAGLE3 without a draft path";
  e.draft_model_path = "/some/draft";
  EXPECT_NO_THROW(validate_spec_options(e));
  EXPECT_EQ(parse_spec_algorithm(""), SpecAlgorithm::none);
  SpecOptions bad;
  bad.algorithm = SpecAlgorithm::ngram;
  bad.num_draft_tokens = 0;
  EXPECT_THROW(validate_spec_options(bad), Error);
  bad.num_draft_tokens = 3;
  bad.ngram_min = 5;
  bad.ngram_max = 2;
  EXPECT_THROW(validate_spec_options(bad), Error);
  SpecOptions neg;
  neg.algorithm = SpecAlgorithm::ngram;
  neg.ragged_verify_factor = -1.0;
  EXPECT_THROW(validate_spec_options(neg), Error);
}

TEST(SpecOptions, RaggedVerifyWhereTheGraphWouldMostlyComputeFill) {
  SpecOptions o;  // factor 2, from 8 sequences
  // 32 sequences, k = 4: the graph computes 32 x 5 = 160 rows.
  EXPECT_TRUE(ragged_verify_rows(o, 32, 8, 32, 5)) << "two sequences drafted: 40 rows of 160";
  EXPECT_TRUE(ragged_verify_rows(o, 32, 48, 32, 5)) << "80 rows: exactly half";
  EXPECT_FALSE(ragged_verify_rows(o, 32, 49, 32, 5));
  EXPECT_FALSE(ragged_verify_rows(o, 32, 128, 32, 5)) << "every sequence drafted";
  EXPECT_FALSE(ragged_verify_rows(o, 4, 1, 4, 5)) << "below the sequence floor the graph always runs";
  EXPECT_TRUE(ragged_verify_rows(o, 24, 4, 32, 5)) << "the bucket's padding counts as fill";
  o.ragged_verify_factor = 0.0;
  EXPECT_FALSE(ragged_verify_rows(o, 32, 0, 32, 5)) << "factor 0: off";
}

}  // namespace
}  // namespace kiln::spec
