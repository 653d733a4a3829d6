// Block-FP8 experts on the CPU oracle (ops/moe.h "Block-FP8 experts"): MoeFp8Path::chunk16, path (d) of
// ops/fp8_linear.h with 32 threads (the CUDA gather GEMV's e4m3 x 16 form), against a hand-computed expert
// on which paths (a) and (c) give other values, and against its contract composed token by token from
// linear_fp8_chunk16, silu_and_mul and the fp32 sum in ascending expert index.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/moe_contract.h"
#include "common/test_support.h"
#include "kiln/dtype.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"
#include "ops/moe.h"

using namespace kiln;

namespace {

float bf(bf16_t v) {
  return bf16_to_f32(v);
}

// One expert (E = 1, top-1: its routing weight is exactly 1, so out = y), H = 256, I = 128: two 128-column
// blocks of gate_up (scales [gate / up rows][column block]), two 128-row blocks of down.
struct HandExpert {
  static constexpr int64_t H = 256, I = 128;
  std::vector<bf16_t> router = std::vector<bf16_t>(size_t(H), f32_to_bf16(0.f));
  std::vector<bf16_t> x = std::vector<bf16_t>(size_t(H), f32_to_bf16(0.f));
  std::vector<uint8_t> gate_up = std::vector<uint8_t>(size_t(2 * I * H), f32_to_e4m3(0.f));
  std::vector<uint8_t> down = std::vector<uint8_t>(size_t(H * I), f32_to_e4m3(0.f));
  std::vector<float> gate_up_s = {1.25f, 0.5f, 0.75f, 0.25f};  // [gate, up][block 0, 1]
  std::vector<float> down_s = {0.0625f, 0.1875f};              // rows 0..127, 128..255
  HandExpert() {
    const auto set = [](std::vector<uint8_t>& q, int64_t at, float v) { q[size_t(at)] = f32_to_e4m3(v); };
    const std::pair<int64_t, float> xs[] = {{0, 65536.f}, {1, 1.f}, {2, 65536.f}, {16, 2.f}, {128, 3.f}};
    for (const auto& [k, v] : xs) x[size_t(k)] = f32_to_bf16(v);
    set(gate_up, 0, 256.f);  // gate row 0
    set(gate_up, 1, 1.f);
    set(gate_up, 2, -256.f);
    set(gate_up, 16, 16.f);
    set(gate_up, 128, 8.f);
    set(gate_up, I * H + 16, 0.5f);  // up row 0
    set(gate_up, I * H + 128, 1.f);
    set(down, 0 * I, 1.f);  // down column 0 of rows 0, 1, 130
    set(down, 1 * I, -2.f);
    set(down, 130 * I, 3.f);
  }
  ops::MoeWeights weights() {
    ops::MoeWeights w;
    w.router = Tensor(router.data(), DType::bf16, {1, H});
    w.gate_up = Tensor(gate_up.data(), DType::f8e4m3, {1, 2 * I, H});
    w.down = Tensor(down.data(), DType::f8e4m3, {1, H, I});
    w.gate_up_scale = Tensor(gate_up_s.data(), DType::f32, {1, 2, 2});
    w.down_scale = Tensor(down_s.data(), DType::f32, {1, 2, 1});
    w.top_k = 1;
    w.norm_topk_prob = true;
    return w;
  }
};

std::vector<bf16_t> run(const std::vector<bf16_t>& x, const ops::MoeWeights& w, ops::MoeFp8Path path) {
  const int64_t H = w.gate_up.shape[2], T = int64_t(x.size()) / H;
  std::vector<bf16_t> out(x.size(), f32_to_bf16(12345.f));
  ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), w,
               Tensor(out.data(), DType::bf16, {T, H}), path);
  return out;
}

}  // namespace

// Path (d), thread t of 32 taking the 16-element chunks t, t + 32, ...:
//   gate row 0: chunk 0 (thread 0): the fmaf chain from +0 of 65536 * 256 = 2^24, then + 1 * 1 (2^24 + 1, a
//     tie, to the even 2^24), then + 65536 * -256: sum 0, so 0 * 1.25. Chunk 1 (thread 1): 2 * 16 = 32,
//     * 1.25 = 40. Chunk 8 (thread 8, the second column block): 3 * 8 = 24, * 0.5 = 12. The butterfly: 52.
//   up row 0: chunk 1: 2 * 0.5 = 1, * 0.75; chunk 8: 3 * 1 = 3, * 0.25; 0.75 + 0.75 = 1.5.
//   act 0 = bf16(silu(52) * 1.5): exp(-52) vanishes beside 1 in fp32, so silu(52) = 52 (no exp rounding
//     enters) and act 0 = 78; every other gate and up row is 0, act 0 there.
//   down rows 0, 1, 130 (column 0 only): 78 * 1 * 0.0625 = 4.875, 78 * -2 * 0.0625 = -9.75 (both exact in
//     bf16), 78 * 3 * 0.1875 = 43.875 = 101011.111b: a tie at bf16's 8 bits, to the even 44.
// Path (c) (dequantize, then the bf16 linear of ops/linear.h) keeps the 1: its lanes k mod 8 hold 2^24 * 1.25
// + 40 + 12 and -2^24 * 1.25 apart from the 1.25, so gate 53.25, act bf16(53.25 * 1.5) = 80 and the outputs
// 80 * 0.0625 = 5, -10, 80 * 0.5625 = 45. Path (a) quantizes x per 128-group (the 1 to 0.0078125 * a_s) and
// differs again.
TEST(MoeMlpFp8, Chunk16PathMatchesAHandComputedExpert) {
  HandExpert h;
  const ops::MoeWeights w = h.weights();
  const auto check = [&](const std::vector<bf16_t>& out, float o0, float o1, float o130, const char* what) {
    for (int64_t i = 0; i < HandExpert::H; ++i) {
      const float want = i == 0 ? o0 : i == 1 ? o1 : i == 130 ? o130 : 0.f;
      EXPECT_EQ(bf(out[size_t(i)]), want) << what << ", element " << i;
    }
  };
  check(run(h.x, w, ops::MoeFp8Path::chunk16), 4.875f, -9.75f, 44.f, "path (d)");

  std::vector<bf16_t> gu(h.gate_up.size()), dn(h.down.size());
  ops::dequantize_fp8({Tensor(h.gate_up.data(), DType::f8e4m3, {2 * HandExpert::I, HandExpert::H}),
                       Tensor(h.gate_up_s.data(), DType::f32, {2, 2})},
                      Tensor(gu.data(), DType::bf16, {2 * HandExpert::I, HandExpert::H}));
  ops::dequantize_fp8({Tensor(h.down.data(), DType::f8e4m3, {HandExpert::H, HandExpert::I}),
                       Tensor(h.down_s.data(), DType::f32, {2, 1})},
                      Tensor(dn.data(), DType::bf16, {HandExpert::H, HandExpert::I}));
  ops::MoeWeights wc = w;
  wc.gate_up = Tensor(gu.data(), DType::bf16, {1, 2 * HandExpert::I, HandExpert::H});
  wc.down = Tensor(dn.data(), DType::bf16, {1, HandExpert::H, HandExpert::I});
  wc.gate_up_scale = wc.down_scale = Tensor();
  check(run(h.x, wc, ops::MoeFp8Path::w8a8), 5.f, -10.f, 45.f, "path (c)");

  const std::vector<bf16_t> a = run(h.x, w, ops::MoeFp8Path::w8a8);  // the default: path (a)
  EXPECT_NE(bf(a[0]), 4.875f);
  EXPECT_NE(bf(a[0]), 5.f);
}

namespace {

// Random bf16 [L, rows, cols] quantized expert by expert (ops::quantize_weight_fp8) into e4m3 and scales.
struct Fp8Stack {
  int64_t L, rows, cols;
  std::vector<uint8_t> q;
  std::vector<float> s;
  Fp8Stack(int64_t l, int64_t r, int64_t c, uint32_t seed) : L(l), rows(r), cols(c) {
    const int64_t sb = ops::fp8_blocks(r) * ops::fp8_blocks(c);
    std::vector<bf16_t> w = test_support::random_bf16(size_t(l * r * c), seed, -0.1f, 0.1f);
    q.resize(w.size());
    s.resize(size_t(l * sb));
    for (int64_t e = 0; e < l; ++e)
      ops::quantize_weight_fp8(
          Tensor(w.data() + e * r * c, DType::bf16, {r, c}),
          Tensor(q.data() + e * r * c, DType::f8e4m3, {r, c}),
          Tensor(s.data() + e * sb, DType::f32, {ops::fp8_blocks(r), ops::fp8_blocks(c)}),
          "expert " + std::to_string(e));
  }
  Tensor weight() { return Tensor(q.data(), DType::f8e4m3, {L, rows, cols}); }
  Tensor scale() { return Tensor(s.data(), DType::f32, {L, ops::fp8_blocks(rows), ops::fp8_blocks(cols)}); }
  ops::LinearWeight expert(int64_t e) {
    const int64_t sb = ops::fp8_blocks(rows) * ops::fp8_blocks(cols);
    return {Tensor(q.data() + e * rows * cols, DType::f8e4m3, {rows, cols}),
            Tensor(s.data() + e * sb, DType::f32, {ops::fp8_blocks(rows), ops::fp8_blocks(cols)})};
  }
};

}  // namespace

// MoeFp8Path::chunk16 equals ops/moe.h's contract composed from the other ops token by token: the router
// logits, moe_route, each chosen expert's linear_fp8_chunk16 (32 threads) / silu_and_mul /
// linear_fp8_chunk16, the fp32 sum of y * weight in ascending expert index, one rounding. Top-3 of 8 experts,
// H and I spanning several 128-blocks (H 384: 24 chunks a row, threads 24 .. 31 idle). It differs from the
// default path (a) on most elements.
TEST(MoeMlpFp8, Chunk16EqualsTheContractComposedTokenByToken) {
  const int64_t E = 8, H = 384, I = 256, k = 3, T = 6;
  Fp8Stack gate_up(E, 2 * I, H, 71), down(E, H, I, 72);
  std::vector<bf16_t> router = test_support::random_bf16(size_t(E * H), 73, -0.2f, 0.2f);
  const std::vector<bf16_t> x = test_support::random_bf16(size_t(T * H), 74);
  ops::MoeWeights w;
  w.router = Tensor(router.data(), DType::bf16, {E, H});
  w.gate_up = gate_up.weight();
  w.gate_up_scale = gate_up.scale();
  w.down = down.weight();
  w.down_scale = down.scale();
  w.top_k = k;
  w.norm_topk_prob = true;
  const std::vector<bf16_t> got = run(x, w, ops::MoeFp8Path::chunk16);
  const std::vector<bf16_t> path_a = run(x, w, ops::MoeFp8Path::w8a8);
  int64_t differ = 0;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<bf16_t> want = test_support::moe_compose_token(
        std::vector<bf16_t>(x.begin() + t * H, x.begin() + (t + 1) * H), w,
        [&](int64_t e, bool is_down, const Tensor& in, const Tensor& out) {
          ops::linear_fp8_chunk16(in, is_down ? down.expert(e) : gate_up.expert(e), out, 32);
        });
    for (int64_t h = 0; h < H; ++h) {
      ASSERT_EQ(got[size_t(t * H + h)].bits, want[size_t(h)].bits) << "token " << t << " column " << h;
      differ += got[size_t(t * H + h)].bits != path_a[size_t(t * H + h)].bits;
    }
  }
  EXPECT_GT(differ, T * H / 2) << "path (d) and path (a) agree too often for the option to be in effect";
}
