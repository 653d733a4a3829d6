#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/batch.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/staged_upload.h"
#include "kiln/tensor.h"

using namespace kiln;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256).bits, 0x3f80);
  // 1 + 3*2^-8 is half way between 1+2^-7 and 1+2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_EQ(f32_to_bf16(-2.0f).bits, 0xc000);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(f32_to_bf16(3.4e38f).bits, 0x7f80);  // rounds up past the largest finite bf16
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const f16_t h{uint16_t(b)};
    const float f = f16_to_f32(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f).bits, h.bits) << "bits " << b;
  }
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even zero
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)).bits, 0x0001);  // above the tie
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 ulp ties to even 2
}

TEST(Tensor, ViewsAndChecks) {
  float data[24];
  Tensor t(data, DType::f32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.stride[0], 12);
  Tensor r = t.slice_rows(1, 2);
  EXPECT_EQ(r.ptr<float>(), data + 12);
  EXPECT_THROW(t.slice_rows(1, 3), Error);
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] cpu");
}

TEST(Error, CheckPrintsBothSides) {
  try {
    KILN_CHECK_EQ(1 + 1, 3, "math");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(2 vs 3)"), std::string::npos) << e.what();
  }
}

TEST(BatchDesc, ValidateRejectsInconsistentDescriptors) {
  BatchDesc b;
  b.tokens = {1, 2, 3};
  b.positions = {0, 1, 5};
  b.slot_mapping = {0, 1, 37};
  b.cu_q = {0, 2, 3};
  b.kv_lens = {2, 6};
  b.page_size = 4;
  b.pages_stride = 2;
  b.page_table = {0, -1, 8, 9};
  b.logit_rows = {1, 2};
  EXPECT_NO_THROW(b.validate(10, 16));
  EXPECT_THROW(b.validate(3, 16), Error);  // token 3 out of range
  b.kv_lens = {1, 6};
  EXPECT_THROW(b.validate(10, 16), Error);  // kv_len < new tokens
}

TEST(StagedUploads, CpuCopiesAtOnceWithinTheBound) {
  StagedUploads up(Device::cpu());
  EXPECT_THROW(up.copy(nullptr, nullptr, 4), Error);  // outside begin() / end()
  const std::vector<int32_t> a = {1, 2, 3}, b = {7, 8, 9, 10, 11};
  std::vector<int32_t> da(3, -1), db(5, -1);
  up.begin(StagedUploads::footprint(12) + StagedUploads::footprint(20), nullptr);
  up.copy(da.data(), a.data(), 12);
  up.copy(db.data(), b.data(), 20);
  up.end();
  EXPECT_EQ(da, a);
  EXPECT_EQ(db, b);
  // Past the bound: a clear error, the destination untouched; the next batch works.
  std::vector<int32_t> dc(5, -1);
  up.begin(StagedUploads::footprint(12), nullptr);
  EXPECT_THROW(up.copy(dc.data(), b.data(), 20), Error);
  EXPECT_EQ(dc, std::vector<int32_t>(5, -1));
  up.begin(StagedUploads::footprint(20), nullptr);
  up.copy(dc.data(), b.data(), 20);
  up.end();
  EXPECT_EQ(dc, b);
  EXPECT_EQ(StagedUploads::footprint(1), 16u);
  EXPECT_EQ(StagedUploads::footprint(16), 16u);
  EXPECT_EQ(StagedUploads::footprint(17), 32u);
}
