// The MoE expert-kernel tuner's pure parts (ops/moe_tune_table.h): the threshold chosen from a table of
// times, the cache line's format and parse, the cache file's round trip, and malformed or unwritable files.
#include "ops/moe_tune_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::ops {
namespace {

MoeTuneTimes times(std::vector<double> gemv, std::vector<double> grouped) {
  MoeTuneTimes t;
  for (size_t i = 0; i < gemv.size(); ++i) t.tokens.push_back(kMoeTuneLadder[i]);
  t.gemv_us = std::move(gemv);
  t.grouped_us = std::move(grouped);
  return t;
}

TEST(MoeTuneTable, GroupedFromIsTheFirstTOfTheWinningTail) {
  // The GEMV wins up to 4, the grouped GEMM from 8 on.
  EXPECT_EQ(
      moe_grouped_from(times({10, 12, 15, 30, 50, 90, 160, 300}, {20, 21, 22, 25, 30, 40, 60, 90}), 256), 8);
  // A tie counts for the grouped GEMM.
  EXPECT_EQ(moe_grouped_from(times({10, 12, 15, 25}, {20, 21, 15, 25}), 256), 4);
  // Everywhere faster: from the first T.
  EXPECT_EQ(moe_grouped_from(times({10, 12}, {5, 6}), 129), 1);
}

// Within kMoeTuneGroupedMargin the grouped GEMM wins: 30B-A3B's experts timed on an H100 (2026-12-07,
// `69cacb3`; us at T = 1 .. 128) give the thresholds its decode steps measured best (FP8 8, bf16 64).
TEST(MoeTuneTable, ANearTieGoesToTheGroupedGemm) {
  EXPECT_EQ(moe_grouped_from(times({39.8, 67.3, 105.9, 169.7, 274.2, 439.1, 709.3, 1237.9},
                                   {57.2, 75.9, 115.5, 171.0, 240.5, 315.3, 348.9, 347.3}),
                             256),
            8);
  EXPECT_EQ(moe_grouped_from(times({44.8, 71.6, 112.9, 184.1, 286.6, 400.0, 552.8, 934.2},
                                   {66.5, 89.2, 150.3, 236.6, 354.3, 472.0, 529.8, 534.8}),
                             129),
            64);
  EXPECT_EQ(moe_grouped_from(times({100, 100}, {105, 105.1}), 256), 256);  // past the margin: the GEMV
  EXPECT_EQ(moe_grouped_from(times({100, 100}, {105.1, 105}), 256), 2);
}

TEST(MoeTuneTable, AnIsolatedWinDoesNotMoveTheThreshold) {
  // The grouped GEMM wins at 2 alone, then loses at 4: it takes nothing before 8.
  EXPECT_EQ(moe_grouped_from(times({10, 12, 15, 30, 50}, {20, 11, 22, 25, 30}), 256), 8);
  // It loses at the top of the ladder: never, whatever it won below.
  EXPECT_EQ(moe_grouped_from(times({10, 12, 15, 30}, {5, 6, 7, 33}), 129), 129);
  EXPECT_EQ(moe_grouped_from(times({}, {}), 256), 256);
}

MoeTuneKey key_30b(bool fp8) {
  return {.gpu = "NVIDIA H100 80GB HBM3",
          .sms = 132,
          .shape = {.E = 128, .local = 128, .k = 8, .H = 2048, .I = 768, .fp8 = fp8},
          .below = fp8 ? 256 : 129};
}

TEST(MoeTuneTable, LineRoundTrip) {
  const MoeTuneKey key = key_30b(true);
  MoeTuneEntry e{.grouped_from = 8, .times = times({25.1, 30.0}, {31.25, 29.0})};
  const std::string line = format_moe_tune_line(key, e);
  EXPECT_EQ(line,
            "gpu=NVIDIA_H100_80GB_HBM3 sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256 "
            "grouped_from=8  # T 1 2; gemv us 25.1 30.0; grouped us 31.2 29.0");
  MoeTuneKey k2;
  MoeTuneEntry e2;
  ASSERT_TRUE(parse_moe_tune_line(line, k2, e2));
  EXPECT_EQ(k2, key);  // the GPU name compares as written (spaces as '_')
  EXPECT_EQ(k2.text(), key.text());
  EXPECT_EQ(e2.grouped_from, 8);
  EXPECT_TRUE(e2.times.tokens.empty()) << "the times are a comment";
  EXPECT_FALSE(k2 == key_30b(false));
}

TEST(MoeTuneTable, MalformedLinesAreRefused) {
  const std::string good = format_moe_tune_line(key_30b(false), {.grouped_from = 65});
  MoeTuneKey k;
  MoeTuneEntry e;
  ASSERT_TRUE(parse_moe_tune_line(good, k, e));
  EXPECT_EQ(e.grouped_from, 65);
  for (const std::string& bad : {
           std::string(""),
           std::string("garbage"),
           good.substr(0, good.find(" grouped_from")),  // missing the value
           good + " extra=1",                           // a field too many
           std::string("gpu=X sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp4 below=256 grouped_from=8"),
           std::string("gpu=X sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256 grouped_from=0"),
           std::string("gpu=X sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256 grouped_from=257"),
           std::string("gpu=X sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256 grouped_from=8x"),
           std::string("gpu=X sms=-1 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256 grouped_from=8"),
           std::string("gpu=X sms=132 E=128 L=256 k=8 H=2048 I=768 experts=fp8 below=256 grouped_from=8"),
           std::string("gpu=X sms=132 E=128 L=128 I=768 k=8 H=2048 experts=fp8 below=256 grouped_from=8"),
       })
    EXPECT_FALSE(parse_moe_tune_line(bad, k, e)) << bad;
}

// A private directory per test (ctest runs tests in parallel).
struct TempDir {
  std::filesystem::path p;
  explicit TempDir(const std::string& name) {
    p = std::filesystem::temp_directory_path() / ("kiln_moe_tune_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
};

TEST(MoeTuneTable, CacheFileRoundTrip) {
  const TempDir dir("round_trip");
  const std::string path = (dir.p / "sub" / "gemm_tactics.txt.moe").string();
  EXPECT_TRUE(load_moe_tune_cache(path).empty()) << "no file: no entries, no error";
  MoeTuneCache cache;
  cache[key_30b(true)] = {.grouped_from = 8, .times = times({25, 30}, {31, 29})};
  cache[key_30b(false)] = {.grouped_from = 129};
  ASSERT_TRUE(save_moe_tune_cache(path, cache));  // creates sub/
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, kMoeTuneCacheFormat);
  const MoeTuneCache back = load_moe_tune_cache(path);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at(key_30b(true)).grouped_from, 8);
  EXPECT_EQ(back.at(key_30b(false)).grouped_from, 129);
}

TEST(MoeTuneTable, MalformedFileIsIgnoredWhole) {
  const TempDir dir("malformed");
  const std::string path = (dir.p / "t.moe").string();
  const std::string good = format_moe_tune_line(key_30b(true), {.grouped_from = 8});
  const auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write("kiln moe thresholds v0\n" + good + "\n");  // another format version
  EXPECT_TRUE(load_moe_tune_cache(path).empty());
  write(std::string(kMoeTuneCacheFormat) + "\n" + good + "\nnot a line\n");
  EXPECT_TRUE(load_moe_tune_cache(path).empty()) << "one bad line: the whole file is re-tuned";
  write(std::string(kMoeTuneCacheFormat) + "\n" + good.substr(0, 40));  // truncated
  EXPECT_TRUE(load_moe_tune_cache(path).empty());
  write("\x01\x02\xff binary");
  EXPECT_TRUE(load_moe_tune_cache(path).empty());
  write(std::string(kMoeTuneCacheFormat) + "\n\n" + good + "\n");  // blank lines are fine
  EXPECT_EQ(load_moe_tune_cache(path).size(), 1u);
}

// An unwritable location (here a path under a regular file, unwritable even for root): false and a warning.
TEST(MoeTuneTable, UnwritableLocationIsAWarningNotAnError) {
  const TempDir dir("unwritable");
  std::ofstream(dir.p / "file") << "x";
  MoeTuneCache cache;
  cache[key_30b(true)] = {.grouped_from = 8};
  EXPECT_FALSE(save_moe_tune_cache((dir.p / "file" / "t.moe").string(), cache));
  EXPECT_FALSE(save_moe_tune_cache((dir.p / "file" / "sub" / "t.moe").string(), cache));
  EXPECT_TRUE(load_moe_tune_cache((dir.p / "file" / "t.moe").string()).empty());
}

TEST(MoeTuneTable, CachePathSitsBesideTheTacticCache) {
  EXPECT_EQ(moe_tune_cache_path("/home/u/.cache/kiln/gemm_tactics.txt"),
            "/home/u/.cache/kiln/gemm_tactics.txt.moe");
}

}  // namespace
}  // namespace kiln::ops
