// The decode split model (ops/decode_splits.h): the splits it picks for the H200 shapes measured in
// docs/PERF.md, ties, caps and degenerate inputs.
#include <gtest/gtest.h>

#include "ops/decode_splits.h"

using kiln::ops::decode_wave_splits;

namespace {

constexpr int64_t kSms = 132;  // H200

// A 10240-token table (the bench's ctx 9216 rows) in v3's tiles: 128 keys for fp8, 64 for bf16.
constexpr int64_t kFp8Tiles = 80, kBf16Tiles = 160;

TEST(DecodeSplits, PicksTheMeasuredSplitsOnTheH200) {
  // fp8, 3 blocks an SM (forced splits 1 / 2 / 3 / 4 / 6): B = 64 (512 pairs) 376 / 324 / 308 / 321 / 312 us,
  // B = 128 630 / 615 / 600 / 606 / 604 us: 3 splits both. cap: decode_split's count (ceil(16 * 132 /
  // pairs)).
  EXPECT_EQ(decode_wave_splits(64 * 8, 5, kSms, 3, kFp8Tiles), 3);
  EXPECT_EQ(decode_wave_splits(128 * 8, 3, kSms, 3, kFp8Tiles), 3);
  // bf16's geometry, 2 blocks an SM: one split at B = 64 and 128 (measured: 573 / 1131 us against 579-585 /
  // 1133-1147 with 2, 3, 4 or 6). The launcher keeps bf16 at one split anyway.
  EXPECT_EQ(decode_wave_splits(64 * 8, 5, kSms, 2, kBf16Tiles), 1);
  EXPECT_EQ(decode_wave_splits(128 * 8, 3, kSms, 2, kBf16Tiles), 1);
}

TEST(DecodeSplits, SplitsWhereTheLastRoundIsMostlyEmpty) {
  // 320 pairs over 132 SMs of 2 slots: 56 SMs run a second round of one block; 4 splits give 1280 shorter
  // blocks in 5 rounds (cost 5 x 42 = 210 against 2 x 162 = 324).
  EXPECT_EQ(decode_wave_splits(320, 7, kSms, 2, kBf16Tiles), 4);
  EXPECT_EQ(decode_wave_splits(320, 1, kSms, 2, kBf16Tiles), 1);
}

TEST(DecodeSplits, CapsTiesAndDegenerateInputs) {
  EXPECT_EQ(decode_wave_splits(512, 1, kSms, 3, kFp8Tiles), 1);  // cap 1
  EXPECT_EQ(decode_wave_splits(512, 0, kSms, 3, kFp8Tiles), 1);  // cap below 1 is 1
  EXPECT_EQ(decode_wave_splits(512, 5, kSms, 0, kFp8Tiles), 1);  // no resident slots reported: 1 a time
  EXPECT_EQ(decode_wave_splits(132 * 2, 8, kSms, 2, 1), 1);      // one tile: splitting only adds cost
  // Equal costs keep fewer splits: 268 pairs, 4 tiles: 2 rounds of 6 against 3 rounds of 4.
  EXPECT_EQ(decode_wave_splits(268, 2, kSms, 2, 4), 1);
}

}  // namespace
