// The decode split model (ops/decode_splits.h): the splits it picks for the H200 shapes measured in
// docs/PERF.md, the per-SM time it is built on, ties, caps and degenerate inputs.
#include <gtest/gtest.h>

#include "ops/decode_splits.h"

using kiln::ops::decode_sm_time;
using kiln::ops::decode_wave_splits;

namespace {

constexpr int64_t kSms = 132;  // H200

// A 10240-token table (the bench's ctx 9216 rows) in v3's tiles: 128 keys for fp8, 64 for bf16.
constexpr int64_t kFp8Tiles = 80, kBf16Tiles = 160;

TEST(DecodeSplits, PicksTheMeasuredSplitsOnTheH200) {
  // fp8, 3 blocks an SM: B = 64 (512 pairs) splits in 2 (388 us against 438 with 1), B = 128 stays at 1
  // (739 us; 2 and 3 splits measured 750 and 745). cap: decode_split's count (ceil(16 * 132 / pairs)).
  EXPECT_EQ(decode_wave_splits(64 * 8, 5, kSms, 3, kFp8Tiles), 2);
  EXPECT_EQ(decode_wave_splits(128 * 8, 3, kSms, 3, kFp8Tiles), 1);
  // bf16's geometry, 2 blocks an SM: one split at B = 64 and 128 as well (measured: 2 splits 593 / 1177 us
  // against 591 / 1157). The launcher keeps bf16 at one split anyway (attention.cu: the lone-block premise
  // was fitted to the fp8 kernel).
  EXPECT_EQ(decode_wave_splits(64 * 8, 5, kSms, 2, kBf16Tiles), 1);
  EXPECT_EQ(decode_wave_splits(128 * 8, 3, kSms, 2, kBf16Tiles), 1);
}

TEST(DecodeSplits, SplitsWhereOneWaveLeavesMostSmsHalfIdle) {
  // 320 pairs over 132 SMs of 2 slots: 56 SMs run a third block alone at half bandwidth; 4 splits spread
  // 1280 shorter blocks evenly (cost 412 against 644).
  EXPECT_EQ(decode_wave_splits(320, 7, kSms, 2, kBf16Tiles), 4);
  EXPECT_EQ(decode_sm_time(3, 161, 2), 2 * 161 + 2 * 161);
  EXPECT_EQ(decode_sm_time(10, 41, 2), 5 * 2 * 41);
}

TEST(DecodeSplits, PerSmTimeSaturatesAtTwoBlocks) {
  // In units of half a saturated block: one block alone takes 2 w, two together 2 w, three together 3 w.
  EXPECT_EQ(decode_sm_time(1, 10, 3), 20);
  EXPECT_EQ(decode_sm_time(2, 10, 3), 20);
  EXPECT_EQ(decode_sm_time(3, 10, 3), 30);
  EXPECT_EQ(decode_sm_time(4, 10, 3), 30 + 20);
  EXPECT_EQ(decode_sm_time(0, 10, 3), 0);
}

TEST(DecodeSplits, CapsTiesAndDegenerateInputs) {
  EXPECT_EQ(decode_wave_splits(512, 1, kSms, 3, kFp8Tiles), 1);  // cap 1
  EXPECT_EQ(decode_wave_splits(512, 0, kSms, 3, kFp8Tiles), 1);  // cap below 1 is 1
  EXPECT_EQ(decode_wave_splits(512, 5, kSms, 0, kFp8Tiles), 1);  // no resident slots reported: 1 a time
  EXPECT_EQ(decode_wave_splits(132 * 2, 8, kSms, 2, 1), 1);      // one tile: splitting only adds cost
  // Equal costs keep fewer splits: every SM already has exactly per_sm blocks and tiles divide evenly.
  EXPECT_EQ(decode_wave_splits(132 * 2, 2, kSms, 2, 64), 1);
}

}  // namespace
