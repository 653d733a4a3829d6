// The vision tower's input-side ops (ops/vision_pos_embed.h) on the CPU: pos_embed_interpolate gives, byte
// for byte, what the host code in Qwen3VLVision::position_embedding computed before the op existed (kept
// below, verbatim but for taking the table as an argument), on odd grids (H != W, merge 2 and 1, T 1 and 2,
// grids larger and smaller than the table, odd channel counts), into a padded out with every element
// poisoned; the tower's position_embedding (now through the op) equals it on the tower's own table;
// cast_to_bf16 is kiln's f32_to_bf16 (ties, NaN, infinities, subnormals); and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/test_support.h"
#include "kiln/error.h"
#include "model/qwen3_vl_vision.h"
#include "ops/vision_pos_embed.h"
#include "unit/vl_test_util.h"

using namespace kiln;

namespace {

// ---- The host code before the op (src/model/qwen3_vl_vision.cpp, linspace_f32 and position_embedding) ----
std::vector<float> old_linspace_f32(float end, int64_t steps) {
  std::vector<float> v(static_cast<size_t>(steps));
  if (steps == 1) {
    v[0] = 0.0f;
    return v;
  }
  const float step = end / float(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i)
    v[size_t(i)] = i < half ? step * float(i) : end - step * float(steps - 1 - i);
  return v;
}

std::vector<bf16_t> old_position_embedding(const bf16_t* E, int64_t side, int64_t h, int64_t T, int64_t H,
                                           int64_t W, int64_t m) {
  const std::vector<float> hs = old_linspace_f32(float(side - 1), H),
                           ws = old_linspace_f32(float(side - 1), W);
  auto bf = [](float x) { return bf16_to_f32(f32_to_bf16(x)); };
  std::vector<bf16_t> grid(size_t(H * W * h));
  for (int64_t i = 0; i < H; ++i) {
    const int64_t fh = int64_t(hs[size_t(i)]), ch = std::min(fh + 1, side - 1);
    const float dh = hs[size_t(i)] - float(fh);
    for (int64_t j = 0; j < W; ++j) {
      const int64_t fw = int64_t(ws[size_t(j)]), cw = std::min(fw + 1, side - 1);
      const float dw = ws[size_t(j)] - float(fw);
      const int64_t idx[4] = {fh * side + fw, fh * side + cw, ch * side + fw, ch * side + cw};
      const float wt[4] = {bf((1 - dh) * (1 - dw)), bf((1 - dh) * dw), bf(dh * (1 - dw)), bf(dh * dw)};
      bf16_t* o = grid.data() + (i * W + j) * h;
      for (int64_t c = 0; c < h; ++c) {
        float acc = 0;
        for (int k = 0; k < 4; ++k) {
          const float p = bf(bf16_to_f32(E[idx[k] * h + c]) * wt[k]);
          acc = k == 0 ? p : bf(acc + p);
        }
        o[c] = f32_to_bf16(acc);
      }
    }
  }
  std::vector<bf16_t> out(size_t(T * H * W * h));
  int64_t r = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t bh = 0; bh < H / m; ++bh)
      for (int64_t bw = 0; bw < W / m; ++bw)
        for (int64_t ir = 0; ir < m; ++ir)
          for (int64_t ic = 0; ic < m; ++ic, ++r)
            std::copy_n(grid.data() + ((bh * m + ir) * W + bw * m + ic) * h, h, out.data() + r * h);
  return out;
}
// ---- end of the old code ----

struct Grid {
  int64_t side, C, T, H, W, m;
};

constexpr uint16_t kPoison = 0x7fc1;

// The op into a [rows, C + 3] buffer poisoned with NaN: the dense [rows, C] result; the padding must stay.
std::vector<bf16_t> run_op(const std::vector<bf16_t>& table, const Grid& g) {
  const int64_t rows = g.T * g.H * g.W, ld = g.C + 3;
  std::vector<float> lin = ops::pos_embed_linspace(g.side, g.H, g.W);
  std::vector<bf16_t> buf(size_t(rows * ld), bf16_t{kPoison});
  ops::pos_embed_interpolate(Tensor(const_cast<bf16_t*>(table.data()), DType::bf16, {g.side * g.side, g.C}),
                             Tensor(lin.data(), DType::f32, {g.H + g.W}), g.T, g.H, g.W, g.m,
                             Tensor::strided(buf.data(), DType::bf16, {rows, g.C}, {ld, 1}));
  std::vector<bf16_t> out(size_t(rows * g.C));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = g.C; c < ld; ++c)
      EXPECT_EQ(buf[size_t(r * ld + c)].bits, kPoison) << "padding, row " << r;
    std::copy_n(buf.data() + r * ld, g.C, out.data() + r * g.C);
  }
  return out;
}

TEST(VisionPosEmbed, LinspaceIsTheOldHostLinspace) {
  for (int64_t side : {1, 4, 7, 48})
    for (int64_t H : {1, 2, 3, 14, 68, 120}) {
      const std::vector<float> got = ops::pos_embed_linspace(side, H, 5);
      const std::vector<float> h = old_linspace_f32(float(side - 1), H),
                               w = old_linspace_f32(float(side - 1), 5);
      ASSERT_EQ(got.size(), size_t(H + 5));
      EXPECT_EQ(std::memcmp(got.data(), h.data(), h.size() * sizeof(float)), 0) << side << " " << H;
      EXPECT_EQ(std::memcmp(got.data() + H, w.data(), w.size() * sizeof(float)), 0) << side << " " << H;
    }
}

TEST(VisionPosEmbed, InterpolateEqualsTheOldHostCodeBytewise) {
  const Grid grids[] = {
      {4, 32, 1, 6, 10, 2},       // the tiny tower's table, H != W
      {4, 32, 2, 8, 12, 2},       // two frames
      {48, 72, 2, 14, 22, 2},     // the real table side, an odd-ish width
      {48, 1024, 1, 68, 120, 2},  // a 1088 x 1920 image's grid at the 4B tower's width
      {48, 16, 2, 120, 68, 2},
      {3, 8, 1, 34, 2, 2},    // many patches per table cell; the last cell's ceil clipped
      {7, 5, 2, 2, 2, 2},     // fewer patches than table rows
      {5, 3, 1, 1, 3, 1},     // merge 1, a single row (linspace of one step)
      {1, 9, 2, 2, 4, 2},     // a 1 x 1 table
      {48, 1, 2, 64, 64, 2},  // one channel
  };
  for (const Grid& g : grids) {
    SCOPED_TRACE("side " + std::to_string(g.side) + " C " + std::to_string(g.C) + " grid " +
                 std::to_string(g.T) + "x" + std::to_string(g.H) + "x" + std::to_string(g.W) + " m " +
                 std::to_string(g.m));
    const auto table =
        test_support::random_bf16(size_t(g.side * g.side * g.C), uint32_t(g.side * 131 + g.C), -40.0f, 40.0f);
    const std::vector<bf16_t> want = old_position_embedding(table.data(), g.side, g.C, g.T, g.H, g.W, g.m);
    const std::vector<bf16_t> got = run_op(table, g);
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i].bits != want[i].bits && ++bad <= 5)
        ADD_FAILURE() << "element " << i << ": " << got[i].bits << " vs the old code's " << want[i].bits;
    EXPECT_EQ(bad, 0u);
  }
}

TEST(VisionPosEmbed, TowerPositionEmbeddingEqualsTheOldHostCode) {
  const ModelConfig cfg = test::tiny_vl_config();
  const Qwen3VLVision tower(cfg, nullptr, 5, Device::cpu());
  const VisionConfig& v = tower.config();
  const Tensor& t = tower.weights().pos_embed;
  for (int frames : {1, 2}) {
    vision::ImagePatches img = test::test_image(8, 12, 3);
    img.grid_t = frames;
    img.values.resize(size_t(img.patches()) * size_t(img.patch_dim), 0.5f);
    const std::vector<bf16_t> got = tower.position_embedding(img);
    const std::vector<bf16_t> want = old_position_embedding(
        t.ptr<bf16_t>(), v.grid_side(), v.hidden_size, frames, img.grid_h, img.grid_w, v.spatial_merge_size);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i].bits, want[i].bits) << "frames " << frames << " " << i;
  }
}

TEST(VisionPosEmbed, CastToBf16IsKilnsConversion) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1.0f,
                                -1.5f,
                                inf,
                                -inf,
                                std::nanf(""),
                                -std::nanf("0x3"),
                                std::ldexp(1.0f, -140),
                                std::ldexp(1.0f, -127),
                                3.4e38f,
                                -3.4e38f};
  // Ties: 1 + 2^-8 (ties to even down), 1 + 3 * 2^-8 (ties to even up), and one bit either side.
  for (uint32_t base : {0x3f808000u, 0x3f818000u, 0xbf808000u})
    for (int d : {-1, 0, 1}) {
      float x;
      const uint32_t u = base + uint32_t(d);
      std::memcpy(&x, &u, 4);
      special.push_back(x);
    }
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const int64_t M = 7, K = 13, ld = 16;  // padded input rows
  std::vector<float> in(size_t(M * ld), 0.0f);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const size_t k = size_t(r * K + c);
      in[size_t(r * ld + c)] = k < special.size() ? special[k] : dist(rng);
    }
  std::vector<bf16_t> out(size_t(M * K), bf16_t{kPoison});
  ops::cast_to_bf16(Tensor::strided(in.data(), DType::f32, {M, K}, {ld, 1}),
                    Tensor(out.data(), DType::bf16, {M, K}));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K; ++c)
      ASSERT_EQ(out[size_t(r * K + c)].bits, f32_to_bf16(in[size_t(r * ld + c)]).bits) << r << " " << c;
  EXPECT_EQ(out[2].bits, 0x3f80);   // 1.0
  EXPECT_EQ(out[13].bits, 0x3f80);  // 1 + 2^-8: the tie goes to the even 1.0
  EXPECT_EQ(out[16].bits, 0x3f82);  // 1 + 3 * 2^-8: the tie goes to the even 1 + 2^-6
}

TEST(VisionPosEmbed, ArgumentChecks) {
  const Grid g{4, 8, 1, 4, 6, 2};
  auto table = test_support::random_bf16(size_t(16 * 8), 1);
  std::vector<float> lin = ops::pos_embed_linspace(4, 4, 6);
  std::vector<bf16_t> out(size_t(24 * 8));
  const Tensor tt(table.data(), DType::bf16, {16, 8}), lt(lin.data(), DType::f32, {10}),
      ot(out.data(), DType::bf16, {24, 8});
  EXPECT_NO_THROW(ops::pos_embed_interpolate(tt, lt, g.T, g.H, g.W, g.m, ot));
  EXPECT_THROW(ops::pos_embed_interpolate(Tensor(table.data(), DType::bf16, {15, 8}), lt, 1, 4, 6, 2, ot),
               Error)
      << "table rows not a square";
  EXPECT_THROW(ops::pos_embed_interpolate(tt, lt, 1, 4, 5, 2, ot), Error) << "W not a multiple of merge";
  EXPECT_THROW(ops::pos_embed_interpolate(tt, lt, 2, 4, 6, 2, ot), Error) << "out rows != T * H * W";
  EXPECT_THROW(ops::pos_embed_interpolate(tt, Tensor(lin.data(), DType::f32, {9}), 1, 4, 6, 2, ot), Error);
  EXPECT_THROW(ops::pos_embed_interpolate(tt, lt, 1, 4, 6, 2, Tensor(out.data(), DType::bf16, {24, 7})),
               Error);
  for (float bad : {-0.5f, 3.5f, std::nanf("")}) {
    std::vector<float> l2 = lin;
    l2[3] = bad;
    EXPECT_THROW(ops::pos_embed_interpolate(tt, Tensor(l2.data(), DType::f32, {10}), 1, 4, 6, 2, ot), Error)
        << "lin value " << bad;
  }
  EXPECT_THROW(ops::pos_embed_linspace(4, 0, 6), Error);
  std::vector<float> in(12);
  EXPECT_THROW(
      ops::cast_to_bf16(Tensor(in.data(), DType::f32, {3, 4}), Tensor(out.data(), DType::bf16, {4, 3})),
      Error);
  EXPECT_THROW(
      ops::cast_to_bf16(Tensor(in.data(), DType::bf16, {3, 4}), Tensor(out.data(), DType::bf16, {3, 4})),
      Error);
}

}  // namespace
