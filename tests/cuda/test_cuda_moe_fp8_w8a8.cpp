// Block-FP8 MoE experts on the W8A8 grouped GEMM (src/ops/cuda/moe_grouped_gemm_fp8_sm90.cu; path (a) of
// ops/fp8_linear.h, ops/cuda/moe_ops.h moe_fp8_w8a8_runs): the layer within relative Frobenius 2^-6 of the
// CPU oracle (and a quarter of path (c)'s distance from it; kTol below) (ops::moe_mlp with block-FP8 experts,
// path (a) too), at 30B-A3B's widths and ragged ones (H or I not a multiple of 256, tiles partly padding),
// with an expert that every token chooses and one that none does; finite (out and scratch poisoned first);
// deterministic; the named kernel equal to by_rows; farther from path (c) (the dequant path,
// KILN_MOE_FP8_W8A8=0) than from the oracle; under expert parallelism; in a CUDA graph replayed while the
// routing changes, bitwise its eager runs. Skipped without an sm_90a device.
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "moe_fp8_layer.h"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_ops.h"
#include "ops/moe.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace kc = ::kiln::cuda;
using ops::cuda::MoeExperts;
using test::Fp8Layer;
using test::random_bf16;
using test::to_device;
using test::to_host;

#define KILN_REQUIRE_W8A8()                                                                       \
  do {                                                                                            \
    KILN_REQUIRE_GPU();                                                                           \
    if (!kc::moe_grouped_gemm_fp8_sm90_applies())                                                 \
      GTEST_SKIP() << "the W8A8 grouped GEMM needs an sm_90 device running sm_90a code: skipped"; \
  } while (0)

// test::kW8a8LayerTol (moe_fp8_layer.h) from the CPU oracle, and where path (c) runs beside it a quarter of
// path (c)'s distance (kNearerThanC): a scale or layout error lands at or past path (c).
constexpr double kTol = test::kW8a8LayerTol;
constexpr double kNearerThanC = 0.25;
constexpr int64_t kHot = 3, kCold = 5;  // chosen by every token / by none (force_routing)
constexpr int64_t kCol = 1;             // the x column that decides them

// Router rows of kHot and kCold read x column kCol with weights +4 and -4, every other row 0 there; with
// x[t, kCol] = 8 (every_token_x) kHot's logit is >= 28 and kCold's <= -28, the others in [-4, 4]
// (make_fp8_layer's one power-of-two weight a row, x in [-1, 1]). Exact in any order: CPU and GPU route
// alike.
void force_routing(Fp8Layer& l) {
  for (int64_t e = 0; e < l.E; ++e) l.router[size_t(e * l.H + kCol)] = f32_to_bf16(0.0f);
  l.router[size_t(kHot * l.H + kCol)] = f32_to_bf16(4.0f);
  l.router[size_t(kCold * l.H + kCol)] = f32_to_bf16(-4.0f);
  l.d_router = to_device(l.router);
}

std::vector<bf16_t> every_token_x(int64_t T, int64_t H, uint32_t seed) {
  std::vector<bf16_t> x = random_bf16(size_t(T * H), seed);
  for (int64_t t = 0; t < T; ++t) x[size_t(t * H + kCol)] = f32_to_bf16(8.0f);
  return x;
}

std::vector<bf16_t> cpu_layer(const std::vector<bf16_t>& x, const ops::MoeWeights& w, int64_t T, int64_t H) {
  std::vector<bf16_t> want(size_t(T * H));
  ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), w,
               Tensor(want.data(), DType::bf16, {T, H}));
  return want;
}

void expect_finite(const std::vector<bf16_t>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_TRUE(std::isfinite(bf16_to_f32(v[i]))) << "element " << i << " bits " << v[i].bits;
}

// by_rows where it takes the W8A8 GEMM (T at or above its threshold), else the kernel named.
MoeExperts w8a8_kernel_for(int64_t T) {
  return ops::cuda::moe_fp8_dequant_min_tokens() > 0 && T >= ops::cuda::moe_fp8_w8a8_min_tokens()
             ? MoeExperts::by_rows
             : MoeExperts::grouped_gemm_fp8_w8a8;
}

// KILN_MOE_FP8_W8A8_MIN_TOKENS's value for a scope (then -1: kMoeFp8W8a8MinTokens, as when unset).
struct W8a8MinTokens {
  explicit W8a8MinTokens(int64_t tokens) { ops::cuda::moe_set_fp8_w8a8_min_tokens(tokens); }
  ~W8a8MinTokens() { ops::cuda::moe_set_fp8_w8a8_min_tokens(-1); }
};

void check_against_oracle(Fp8Layer l, const std::vector<int64_t>& batches) {
  const test::Fp8W8a8Scope on(true);
  force_routing(l);
  const ops::MoeWeights w8 = l.fp8(Device::cuda()), hw = l.fp8(Device::cpu());
  Buffer scratch(256, Device::cuda()), named_scratch(256, Device::cuda()), deq_scratch(256, Device::cuda());
  for (const int64_t T : batches) {
    SCOPED_TRACE("E " + std::to_string(l.E) + " k " + std::to_string(l.k) + " H " + std::to_string(l.H) +
                 " I " + std::to_string(l.I) + " T " + std::to_string(T));
    const MoeExperts kernel = w8a8_kernel_for(T);
    ASSERT_TRUE(ops::cuda::moe_fp8_w8a8_runs(w8, T, kernel));
    ASSERT_FALSE(ops::cuda::moe_fp8_dequant_runs(w8, T, kernel));
    const auto x = every_token_x(T, l.H, uint32_t(T * 7 + l.H));
    const Buffer dx = to_device(x);
    const auto got = test::run_moe_gpu(w8, dx, T, l.H, kernel, scratch);  // out and scratch poisoned
    const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I, .fp8_w8a8 = true};
    const auto counts = test::read_device<int32_t>(kc::moe_scratch_layout(s, scratch.data()).counts, l.E);
    ASSERT_EQ(counts[size_t(kHot)], T) << "expert " << kHot << " must be chosen by every token";
    ASSERT_EQ(counts[size_t(kCold)], 0) << "expert " << kCold << " must be chosen by none";
    expect_finite(got);
    const auto want = cpu_layer(x, hw, T, l.H);
    const double err = test::rel_frob(got, want);
    // Bitwise deterministic, and by_rows is the named kernel.
    const auto again = test::run_moe_gpu(w8, dx, T, l.H, kernel, scratch);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(again[i].bits, got[i].bits) << "rerun, element " << i;
    if (kernel == MoeExperts::by_rows) {
      const auto named = test::run_moe_gpu(w8, dx, T, l.H, MoeExperts::grouped_gemm_fp8_w8a8, named_scratch);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(named[i].bits, got[i].bits) << "named, element " << i;
    }
    // Path (c) (KILN_MOE_FP8_W8A8=0: dequant + grouped GEMM, or the GEMV below the threshold) differs from it
    // by the activations' e4m3 rounding: W8A8 must not be those bits (else it did not run) and must be nearer
    // the oracle.
    std::vector<bf16_t> deq;
    {
      const test::Fp8W8a8Scope off(false);
      deq = test::run_moe_gpu(w8, dx, T, l.H, MoeExperts::by_rows, deq_scratch);
    }
    const double err_c = test::rel_frob(deq, want);
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i].bits != deq[i].bits;
    std::printf(
        "fp8 MoE W8A8 E %lld H %lld I %lld T %lld: vs CPU path (a) rel %.2e (path (c): %.2e), %zu of %zu "
        "elements differ from path (c)\n",
        (long long)l.E, (long long)l.H, (long long)l.I, (long long)T, err, err_c, differ, got.size());
    EXPECT_LE(err, kTol) << "vs the CPU oracle (path (a))";
    EXPECT_GT(differ, 0u) << "bitwise the dequant path: the W8A8 GEMM did not run";
    EXPECT_LE(err, kNearerThanC * err_c) << "W8A8 not much nearer path (a) than the dequant path";
  }
}

TEST(CudaMoeFp8W8a8, MatchesCpuOracleAt30bA3bWidths) {
  KILN_REQUIRE_W8A8();
  check_against_oracle(test::make_fp8_layer(128, 8, 2048, 768, 51), {256, 300, 1024});
}

// H = 384: the down GEMM's last column block has a consumer wholly past H (its weight boxes zero-filled, no
// stores); I = 384: a quantizer block half past K. T = 1 and 37 by the named kernel (one tile an expert,
// mostly padding rows).
TEST(CudaMoeFp8W8a8, MatchesCpuOracleAtRaggedWidths) {
  KILN_REQUIRE_W8A8();
  check_against_oracle(test::make_fp8_layer(16, 4, 384, 256, 53), {1, 37, 300});
  check_against_oracle(test::make_fp8_layer(16, 4, 256, 384, 55), {37, 300});
}

// Its own threshold below the dequant one (KILN_MOE_FP8_W8A8_MIN_TOKENS=16): by rows, T = 16 and 64 take the
// W8A8 GEMM in the gather GEMV's place (its bits those of the kernel named), T = 8 stays on the GEMV; with
// the dequant threshold at 0 (the GEMV at every T) it stays off.
TEST(CudaMoeFp8W8a8, ItsOwnThresholdTakesTheGemvsPlace) {
  KILN_REQUIRE_W8A8();
  const W8a8MinTokens at16(16);
  check_against_oracle(test::make_fp8_layer(128, 8, 2048, 768, 59), {16, 64});
  const test::Fp8W8a8Scope on(true);
  const ops::MoeWeights w8 = test::make_fp8_layer(16, 4, 256, 128, 61).fp8(Device::cuda());
  EXPECT_FALSE(ops::cuda::moe_fp8_w8a8_runs(w8, 8));
  EXPECT_TRUE(ops::cuda::moe_fp8_w8a8_runs(w8, 16));
  EXPECT_FALSE(ops::cuda::moe_fp8_dequant_runs(w8, 16));
  const int64_t dequant_before = ops::cuda::moe_fp8_dequant_min_tokens();
  ops::cuda::moe_set_fp8_dequant_min_tokens(0);
  EXPECT_FALSE(ops::cuda::moe_fp8_w8a8_runs(w8, 64)) << "dequant threshold 0: the GEMV at every T";
  ops::cuda::moe_set_fp8_dequant_min_tokens(dequant_before);
}

// Its scratch holds the quantized-input workspace, not the 1.21 GB bf16 expert copy.
TEST(CudaMoeFp8W8a8, ScratchHoldsTheWorkspaceNotTheBf16Copy) {
  KILN_REQUIRE_W8A8();
  const test::Fp8W8a8Scope on(true);
  const Fp8Layer l = test::make_fp8_layer(16, 8, 256, 128, 57);
  ops::MoeWeights w8 = l.fp8(Device::cuda());
  w8.gate_up = Tensor(nullptr, DType::f8e4m3, {128, 2 * 768, 2048}, Device::cuda());  // 30B-A3B's shape
  w8.down = Tensor(nullptr, DType::f8e4m3, {128, 2048, 768}, Device::cuda());
  w8.gate_up_scale = Tensor(nullptr, DType::f32, {128, 12, 16}, Device::cuda());
  w8.down_scale = Tensor(nullptr, DType::f32, {128, 16, 6}, Device::cuda());
  w8.router = Tensor(nullptr, DType::bf16, {128, 2048}, Device::cuda());
  const int64_t T = 1024;
  ASSERT_TRUE(ops::cuda::moe_fp8_w8a8_runs(w8, T));
  const size_t w8a8 = ops::cuda::moe_scratch_bytes(w8, 2048, T);
  size_t dequant = 0;
  {
    const test::Fp8W8a8Scope off(false);
    EXPECT_FALSE(ops::cuda::moe_fp8_w8a8_runs(w8, T));
    EXPECT_TRUE(ops::cuda::moe_fp8_dequant_runs(w8, T));
    dequant = ops::cuda::moe_scratch_bytes(w8, 2048, T);
  }
  const kc::MoeShape s{.T = T, .E = 128, .k = 8, .H = 2048, .I = 768};
  EXPECT_GE(w8a8, kc::moe_scratch_bytes(s) + size_t(s.max_rows() * 2048));
  EXPECT_LT(w8a8, kc::moe_scratch_bytes(s) + (size_t(64) << 20));
  EXPECT_GT(dequant, w8a8 + (size_t(1) << 30)) << "the bf16 copy: 1.21 GB";
}

// Named on BF16 experts: refused.
TEST(CudaMoeFp8W8a8, RefusedForBf16Experts) {
  KILN_REQUIRE_W8A8();
  const Fp8Layer l = test::make_fp8_layer(8, 2, 128, 128, 59);
  Buffer scratch(256, Device::cuda());
  const Buffer dx = to_device(random_bf16(size_t(4 * 128), 5));
  test_support::expect_contains(test_support::error_of([&] {
                                  test::run_moe_gpu(l.dequantized_device(), dx, 4, 128,
                                                    MoeExperts::grouped_gemm_fp8_w8a8, scratch);
                                }),
                                {"block-FP8 experts only"});
}

// Expert parallelism: a rank holding experts [begin, begin + 8) of 32 (weights sliced, expert_begin set):
// within kTol of the CPU oracle's share.
TEST(CudaMoeFp8W8a8, ExpertParallelShareMatchesCpuOracle) {
  KILN_REQUIRE_W8A8();
  const test::Fp8W8a8Scope on(true);
  const Fp8Layer l = test::make_fp8_layer(32, 4, 256, 256, 61);
  Buffer scratch(256, Device::cuda());
  const int64_t L = 8;
  for (const int64_t begin : {int64_t(0), int64_t(8), int64_t(24)}) {
    ops::MoeWeights w8 = l.fp8(Device::cuda()), hw = l.fp8(Device::cpu());
    const auto slice = [&](Tensor& t, int64_t elem_bytes) {
      const int64_t per = t.shape[1] * t.shape[2];
      t = Tensor(static_cast<char*>(t.data) + begin * per * elem_bytes, t.dtype, {L, t.shape[1], t.shape[2]},
                 t.device);
    };
    for (ops::MoeWeights* w : {&w8, &hw}) {
      slice(w->gate_up, 1), slice(w->down, 1), slice(w->gate_up_scale, 4), slice(w->down_scale, 4);
      w->expert_begin = begin;
    }
    for (const int64_t T : {int64_t(16), int64_t(300)}) {
      SCOPED_TRACE("experts [" + std::to_string(begin) + ", " + std::to_string(begin + L) + ") T " +
                   std::to_string(T));
      const MoeExperts kernel = w8a8_kernel_for(T);
      ASSERT_TRUE(ops::cuda::moe_fp8_w8a8_runs(w8, T, kernel));
      const auto x = random_bf16(size_t(T * l.H), uint32_t(T + begin));
      const auto got = test::run_moe_gpu(w8, to_device(x), T, l.H, kernel, scratch);
      expect_finite(got);
      const double err = test::rel_frob(got, cpu_layer(x, hw, T, l.H));
      std::printf("fp8 MoE W8A8 share [%lld, %lld) T %lld: vs CPU rel %.2e\n", (long long)begin,
                  (long long)(begin + L), (long long)T, err);
      EXPECT_LE(err, kTol);
    }
  }
}

// Captured once, replayed while x (and so the routing: which experts have rows, how many tiles) changes:
// every replay bitwise its eager run.
TEST(CudaMoeFp8W8a8, GraphReplayWhileRoutingChangesEqualsEager) {
  KILN_REQUIRE_W8A8();
  const test::Fp8W8a8Scope on(true);
  const Fp8Layer l = test::make_fp8_layer(64, 2, 256, 128, 63);
  const int64_t T = 300;
  const MoeExperts kernel = w8a8_kernel_for(T);
  const ops::MoeWeights w8 = l.fp8(Device::cuda());
  ASSERT_TRUE(ops::cuda::moe_fp8_w8a8_runs(w8, T, kernel));
  Buffer x(size_t(T * l.H) * 2, Device::cuda()), out(size_t(T * l.H) * 2, Device::cuda());
  Buffer scratch(ops::cuda::moe_scratch_bytes(w8, l.H, T, kernel), Device::cuda());
  test::poison(scratch);
  const Tensor xt(x.data(), DType::bf16, {T, l.H}, Device::cuda());
  const Tensor ot(out.data(), DType::bf16, {T, l.H}, Device::cuda());
  const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I, .fp8_w8a8 = true};
  const int32_t* counts = kc::moe_scratch_layout(s, scratch.data()).counts;
  const auto load = [&](uint32_t r) { test::load_moe_input(x, out, size_t(T * l.H), 300 + r); };
  const auto run = [&](cudaStream_t st) {
    const kc::StreamScope scope(st);
    ops::cuda::moe_mlp(xt, w8, ot, scratch.data(), scratch.bytes(), kernel);
  };
  load(0);
  ops::cuda::moe_mlp(xt, w8, ot, scratch.data(), scratch.bytes(), kernel);  // eager once before the capture
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::set<std::vector<int32_t>> chosen;
  const std::string mismatch = test::graph_replay_mismatch(
      run, run, load,
      [&] {
        chosen.insert(test::read_device<int32_t>(counts, l.E));
        const auto o = to_host<bf16_t>(out, size_t(T * l.H));
        for (const bf16_t v : o) EXPECT_TRUE(std::isfinite(bf16_to_f32(v)));
        return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(out, out.bytes())};
      },
      5);
  EXPECT_EQ(mismatch, "");
  EXPECT_GE(chosen.size(), 2u)
      << "the experts' counts must change between replays for the test to mean anything";
}

}  // namespace
}  // namespace kiln
