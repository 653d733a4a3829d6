// Block-FP8 MoE experts on CUDA (ops/moe.h "Block-FP8 experts"): the gather GEMV widening e4m3 in registers
// equals, bitwise, the BF16 CUDA op on dequantize_fp8's experts (path (c)), at decode sizes and past the GEMV
// threshold (below KILN_MOE_FP8_DEQUANT_MIN_TOKENS), in both its e4m3 load forms (8 bytes a chunk, and 16
// bytes a lane regrouped into the bf16 kernel's 8-element lane chunks: KILN_MOE_FP8_WIDE_LOADS); it stays
// near the CPU oracle's path (a); at and above the dequant threshold the chosen experts dequantized in the
// scratch and the grouped GEMM on them, bitwise the BF16 layer on the dequantized experts (by rows, each
// grouped kernel, under expert parallelism, in a graph replayed with changing routings), and the threshold 0
// the GEMV's bits; a tensor-parallel rank's share (each expert's intermediate cut on the block grid) is the
// BF16 share on its dequantized slice, bitwise; a whole FP8 MoE model on CUDA matches the CPU model on the
// dequantized checkpoint within the dense FP8 model's bounds (test_cuda_fp8_dequant.cpp); and the GPU's
// online quantizer (the loader's path for experts) is bitwise the host's. The dequant path's tests turn the
// W8A8 grouped GEMM off (KILN_MOE_FP8_W8A8's setter); it has its own, test_cuda_moe_fp8_w8a8.cpp. The GEMV's
// path (d) form (KILN_MOE_FP8_E4M3X16) is pinned off where path (c)'s bits are asserted; its tests are
// test_cuda_moe_fp8_x16.cpp.
#include <cmath>
#include <filesystem>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "common/fp8_checkpoints.h"
#include "common/model_steps.h"
#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/qwen3.h"
#include "model/weights.h"
#include "moe_fp8_layer.h"
#include "ops/cuda/context.h"
#include "ops/cuda/fp8_weight_quant.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_ops.h"
#include "ops/fp8_linear.h"
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

void check_layer(int64_t E, int64_t k, int64_t H, int64_t I, const std::vector<int64_t>& batches) {
  const Fp8Layer l = test::make_fp8_layer(E, k, H, I, uint32_t(E * 5 + H));
  Buffer scratch(256, Device::cuda());
  using ops::cuda::MoeExperts;
  const test::Fp8W8a8Scope gemv_path(false);  // below the dequant threshold, the GEMV (else W8A8 from T = 8)
  const test::Fp8E4m3x16Scope path_c(false);  // path (d): test_cuda_moe_fp8_x16.cpp
  for (const int64_t T : batches) {
    SCOPED_TRACE("E " + std::to_string(E) + " H " + std::to_string(H) + " I " + std::to_string(I) + " T " +
                 std::to_string(T));
    const auto x = random_bf16(size_t(T * H), uint32_t(T * 7 + 3));
    const Buffer dx = to_device(x);
    // by_rows: FP8 takes the GEMV at every T here; the bf16 reference is forced onto it. Both e4m3 load forms
    // (16 and 8 bytes a lane, KILN_MOE_FP8_WIDE_LOADS).
    const auto bf16 = test::run_moe_gpu(l.dequantized_device(), dx, T, H, MoeExperts::gather_gemv, scratch);
    std::vector<bf16_t> fp8;
    const bool wide_before = kc::moe_fp8_wide_loads();
    for (const bool wide : {false, true}) {
      kc::moe_set_fp8_wide_loads(wide);
      fp8 = test::run_moe_gpu(l.fp8(Device::cuda()), dx, T, H, MoeExperts::by_rows, scratch);
      for (size_t i = 0; i < fp8.size(); ++i)
        ASSERT_EQ(fp8[i].bits, bf16[i].bits) << (wide ? "16" : "8") << "-byte loads, element " << i;
    }
    kc::moe_set_fp8_wide_loads(wide_before);
    // Against the CPU oracle (path (a): activations quantized to e4m3 too): about one e4m3 rounding apart.
    std::vector<bf16_t> want(size_t(T * H));
    ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), l.fp8(Device::cpu()),
                 Tensor(want.data(), DType::bf16, {T, H}));
    const double err = test::rel_frob(fp8, want);
    std::printf("fp8 MoE E %lld H %lld I %lld T %lld: GPU (path c) vs CPU (path a) rel %.4f\n", (long long)E,
                (long long)H, (long long)I, (long long)T, err);
    EXPECT_LE(err, 0.1);
  }
}

TEST(CudaMoeFp8, GemvEqualsBf16GemvOnDequantizedExpertsBitwise) {
  KILN_REQUIRE_GPU();
  check_layer(16, 4, 256, 128, {1, 3, 8, 33, 80});
  check_layer(128, 8, 2048, 768, {1, 4, 64, 100});  // Qwen3-30B-A3B's widths
  // The 16-byte e4m3 loads' batches and windows: K = 4096 (gate_up: two batches), 384 (down: a window
  // half used, lanes 16 .. 31 idle in its second half), 1536 (down: two batches of the fused kernel).
  check_layer(8, 2, 4096, 384, {1, 5, 40});
  check_layer(8, 2, 256, 1536, {1, 3});
}

// Down + combine in one kernel (moe_experts_combine_launch, moe_mlp's path at batch 1) against the gather
// GEMV then the combine kernel: out and the y rows bitwise, bf16 and FP8 experts, 1 to 5 tokens.
TEST(CudaMoeFp8, FusedDownCombineEqualsGemvThenCombineBitwise) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(32, 8, 512, 256, 11);
  Buffer scratch(256, Device::cuda());
  const test::Fp8E4m3x16Scope path_c(false);  // the two path (c) load forms (path (d): test_cuda_moe_fp8_x16)
  for (const int64_t T : {int64_t(1), int64_t(2), int64_t(5)}) {
    for (const bool fp8 : {false, true}) {
      SCOPED_TRACE("T " + std::to_string(T) + (fp8 ? " fp8" : " bf16"));
      const int64_t H = l.H;
      const auto x = random_bf16(size_t(T * H), uint32_t(T + 40));
      const Buffer dx = to_device(x);
      const ops::MoeWeights w = fp8 ? l.fp8(Device::cuda()) : l.dequantized_device();
      test::run_moe_gpu(w, dx, T, H, ops::cuda::MoeExperts::gather_gemv,
                        scratch);  // the routing, in the scratch
      const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = H, .I = l.I};
      const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
      const kc::MoeFp8Scales scales =
          fp8 ? kc::MoeFp8Scales{.gate_up = w.gate_up_scale.ptr<float>(), .down = w.down_scale.ptr<float>()}
              : kc::MoeFp8Scales{};
      const auto* xp = static_cast<const uint16_t*>(dx.data());
      Buffer o1(size_t(T * H) * 2, Device::cuda()), o2(size_t(T * H) * 2, Device::cuda());
      test::poison(o1);
      test::poison(o2);
      kc::moe_experts_launch(kc::MoeExpertKernel::gather_gemv, xp, H, w.gate_up.data, w.down.data, s, b,
                             nullptr, scales);
      kc::moe_combine_launch(s, b, static_cast<uint16_t*>(o1.data()), H, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto y1 = test::read_device<bf16_t>(b.y, s.max_rows() * H);
      const auto a = to_host<bf16_t>(o1, size_t(T * H));
      const bool wide_before = kc::moe_fp8_wide_loads();
      for (const bool wide : {false, true}) {  // both e4m3 load forms (bf16 experts: the same kernel twice)
        kc::moe_set_fp8_wide_loads(wide);
        test::poison(o2);
        KILN_CUDA_CHECK(cudaMemset(b.y, 0xff, size_t(s.max_rows() * H) * 2));
        kc::moe_experts_combine_launch(xp, H, w.gate_up.data, w.down.data, s, b,
                                       static_cast<uint16_t*>(o2.data()), H, nullptr, scales);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        const auto y2 = test::read_device<bf16_t>(b.y, s.max_rows() * H);
        const auto c = to_host<bf16_t>(o2, size_t(T * H));
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(c[i].bits, a[i].bits) << "out element " << i;
        for (const int32_t r : test::read_device<int32_t>(b.inverse, T * l.k))
          for (int64_t h = 0; h < H; ++h)
            ASSERT_EQ(y2[size_t(r * H + h)].bits, y1[size_t(r * H + h)].bits)
                << "y row " << r << " col " << h;
      }
      kc::moe_set_fp8_wide_loads(wide_before);
    }
  }
}

// Sets the FP8 dequant threshold (ops/cuda/moe_ops.h) for a scope, then puts the previous one back.
struct DequantMinTokens {
  int64_t before = ops::cuda::moe_fp8_dequant_min_tokens();
  explicit DequantMinTokens(int64_t tokens) { ops::cuda::moe_set_fp8_dequant_min_tokens(tokens); }
  ~DequantMinTokens() { ops::cuda::moe_set_fp8_dequant_min_tokens(before); }
};

// The grouped GEMM the FP8 path picks above the threshold (no KILN_MOE_EXPERTS in the test's environment).
MoeExperts grouped_kernel() {
  return kc::moe_grouped_gemm_sm90_applies() ? MoeExperts::grouped_gemm_sm90 : MoeExperts::grouped_gemm;
}

// A grouped GEMM on FP8 experts without the scratch's bf16 copy (MoeShape::fp8_dequant) is refused.
TEST(CudaMoeFp8, GroupedGemmWithoutTheDequantCopyIsRefused) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(8, 2, 128, 128, 3);
  const kc::MoeShape s{.T = 4, .E = 8, .k = 2, .H = 128, .I = 128};
  Buffer scratch(kc::moe_scratch_bytes(s), Device::cuda());
  const ops::MoeWeights w = l.fp8(Device::cuda());
  const Buffer dx = to_device(random_bf16(size_t(4 * 128), 5));
  test_support::expect_contains(
      test_support::error_of([&] {
        kc::moe_experts_launch(kc::MoeExpertKernel::grouped_gemm, static_cast<const uint16_t*>(dx.data()),
                               128, w.gate_up.data, w.down.data, s, kc::moe_scratch_layout(s, scratch.data()),
                               nullptr,
                               {.gate_up = w.gate_up_scale.ptr<float>(), .down = w.down_scale.ptr<float>()});
      }),
      {"need the scratch's bf16 expert copy"});
}

// Expert e's n elements of a dequantized copy: dequantize_fp8's bits (want) where the expert has rows, else
// never written (the poison's 0xffff).
void expect_expert_copy(const std::vector<bf16_t>& copy, const std::vector<bf16_t>& want, int64_t e,
                        int64_t n, int32_t rows, const char* what) {
  for (int64_t i = e * n; i < (e + 1) * n; ++i) {
    const uint16_t expect = rows ? want[size_t(i)].bits : uint16_t(0xffff);
    if (copy[size_t(i)].bits != expect) {  // one assertion, not n: 30B-A3B's widths have 1.5 M an expert
      FAIL() << what << " copy, expert " << e << " (" << rows << " rows), element " << i - e * n << ": "
             << copy[size_t(i)].bits << " vs " << expect;
    }
  }
}

// At and above the dequant threshold (set low here) the FP8 layer is, bitwise, the BF16 layer on the
// dequantized experts with the same grouped GEMM (by rows and with each grouped kernel named), the scratch
// holds exactly the chosen experts' dequantization (dequantize_fp8's bits; the others left poisoned), and
// below it the GEMV runs (the BF16 GEMV's bits).
void check_dequant_path(const Fp8Layer& l, const std::vector<int64_t>& batches, int64_t min_tokens) {
  const DequantMinTokens guard(min_tokens);
  const test::Fp8W8a8Scope dequant_path(false);  // the W8A8 GEMM: test_cuda_moe_fp8_w8a8.cpp
  const test::Fp8E4m3x16Scope path_c(false);     // the GEMV below the threshold: path (c)'s bits
  Buffer scratch(256, Device::cuda()), ref_scratch(256, Device::cuda());
  const ops::MoeWeights w8 = l.fp8(Device::cuda()), wd = l.dequantized_device();
  for (const int64_t T : batches) {
    SCOPED_TRACE("E " + std::to_string(l.E) + " H " + std::to_string(l.H) + " I " + std::to_string(l.I) +
                 " T " + std::to_string(T) + " threshold " + std::to_string(min_tokens));
    const Buffer dx = to_device(random_bf16(size_t(T * l.H), uint32_t(T * 13 + 1)));
    const bool dequant = T >= min_tokens;
    ASSERT_EQ(ops::cuda::moe_fp8_dequant_runs(w8, T), dequant);
    const auto got = test::run_moe_gpu(w8, dx, T, l.H, MoeExperts::by_rows, scratch);
    const auto want =
        test::run_moe_gpu(wd, dx, T, l.H, dequant ? grouped_kernel() : MoeExperts::gather_gemv, ref_scratch);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "by rows, element " << i;
    if (!dequant) continue;
    // The copy: the chosen experts dequantized bitwise, the others never written (still 0xffff).
    const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I, .fp8_dequant = true};
    const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
    const auto counts = test::read_device<int32_t>(b.counts, l.E);
    const auto gu = test::read_device<bf16_t>(b.gate_up_bf16, l.E * 2 * l.I * l.H);
    const auto dn = test::read_device<bf16_t>(b.down_bf16, l.E * l.H * l.I);
    int64_t skipped = 0;
    for (int64_t e = 0; e < l.E; ++e) {
      skipped += counts[size_t(e)] == 0;
      expect_expert_copy(gu, l.gate_up_deq, e, 2 * l.I * l.H, counts[size_t(e)], "gate_up");
      expect_expert_copy(dn, l.down_deq, e, l.H * l.I, counts[size_t(e)], "down");
    }
    if (T * l.k < l.E) {
      EXPECT_GT(skipped, 0) << "too few pairs to leave an expert without rows";
    }
    std::printf("fp8 dequant path E %lld T %lld: %lld experts without rows skipped\n", (long long)l.E,
                (long long)T, (long long)skipped);
    // Each grouped kernel named explicitly: the BF16 one's bits.
    for (const MoeExperts k : {MoeExperts::grouped_gemm, MoeExperts::grouped_gemm_sm90}) {
      if (k == MoeExperts::grouped_gemm_sm90 && !kc::moe_grouped_gemm_sm90_applies()) continue;
      const auto a = test::run_moe_gpu(w8, dx, T, l.H, k, scratch);
      const auto c = test::run_moe_gpu(wd, dx, T, l.H, k, ref_scratch);
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a[i].bits, c[i].bits)
            << (k == MoeExperts::grouped_gemm ? "mma.sync" : "wgmma") << ", element " << i;
    }
  }
}

TEST(CudaMoeFp8, DequantPathEqualsBf16GroupedGemmOnDequantizedExpertsBitwise) {
  KILN_REQUIRE_GPU();
  // 64 experts, top-2: at T = 8 most experts have no rows (skipped); T = 5 stays below the threshold.
  check_dequant_path(test::make_fp8_layer(64, 2, 256, 128, 21), {5, 8, 200, 1000, 4096}, 8);
  check_dequant_path(test::make_fp8_layer(128, 8, 2048, 768, 23), {200, 1000}, 100);  // 30B-A3B's widths
  check_dequant_path(test::make_fp8_layer(16, 4, 256, 384, 25), {256, 300},
                     ops::cuda::kMoeFp8DequantMinTokens);
}

// The override at 0 (KILN_MOE_FP8_DEQUANT_MIN_TOKENS=0's value): the GEMV at every T, the BF16 GEMV's bits,
// and no bf16 copy in the scratch.
TEST(CudaMoeFp8, ThresholdZeroKeepsTheGemvAtEveryT) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(32, 4, 256, 128, 27);
  const DequantMinTokens guard(0);
  const test::Fp8E4m3x16Scope path_c(false);
  Buffer scratch(256, Device::cuda()), ref_scratch(256, Device::cuda());
  for (const int64_t T : {int64_t(300), int64_t(2000)}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const ops::MoeWeights w8 = l.fp8(Device::cuda());
    EXPECT_FALSE(ops::cuda::moe_fp8_dequant_runs(w8, T));
    EXPECT_EQ(ops::cuda::moe_scratch_bytes(w8, l.H, T),
              ops::cuda::moe_scratch_bytes(l.dequantized_device(), l.H, T));
    const Buffer dx = to_device(random_bf16(size_t(T * l.H), uint32_t(T + 3)));
    const auto got = test::run_moe_gpu(w8, dx, T, l.H, MoeExperts::by_rows, scratch);
    const auto want =
        test::run_moe_gpu(l.dequantized_device(), dx, T, l.H, MoeExperts::gather_gemv, ref_scratch);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "element " << i;
  }
}

// Expert parallelism on the dequant path: a rank holding experts [expert_begin, expert_begin + L) of the
// router's E dequantizes only its chosen local experts; its out is, bitwise, the BF16 rank's on the same
// dequantized slice.
TEST(CudaMoeFp8, DequantPathUnderExpertParallelism) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(32, 4, 256, 256, 29);
  const DequantMinTokens guard(16);
  const test::Fp8W8a8Scope dequant_path(false);
  Buffer scratch(256, Device::cuda()), ref_scratch(256, Device::cuda());
  const int64_t L = 8;
  for (const int64_t begin : {int64_t(0), int64_t(8), int64_t(24)}) {
    ops::MoeWeights w8 = l.fp8(Device::cuda()), wd = l.dequantized_device();
    const auto slice = [&](Tensor& t, int64_t elem_bytes) {
      const int64_t per = t.shape[1] * t.shape[2];
      t = Tensor(static_cast<char*>(t.data) + begin * per * elem_bytes, t.dtype, {L, t.shape[1], t.shape[2]},
                 Device::cuda());
    };
    slice(w8.gate_up, 1), slice(w8.down, 1), slice(w8.gate_up_scale, 4), slice(w8.down_scale, 4);
    slice(wd.gate_up, 2), slice(wd.down, 2);
    w8.expert_begin = wd.expert_begin = begin;
    for (const int64_t T : {int64_t(16), int64_t(300)}) {
      SCOPED_TRACE("experts [" + std::to_string(begin) + ", " + std::to_string(begin + L) + ") T " +
                   std::to_string(T));
      ASSERT_TRUE(ops::cuda::moe_fp8_dequant_runs(w8, T));
      const Buffer dx = to_device(random_bf16(size_t(T * l.H), uint32_t(T + begin)));
      const auto got = test::run_moe_gpu(w8, dx, T, l.H, MoeExperts::by_rows, scratch);
      const auto want = test::run_moe_gpu(wd, dx, T, l.H, grouped_kernel(), ref_scratch);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "element " << i;
      const kc::MoeShape s{.T = T,
                           .E = l.E,
                           .k = l.k,
                           .H = l.H,
                           .I = l.I,
                           .expert_begin = begin,
                           .local = L,
                           .fp8_dequant = true};
      const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
      const auto counts = test::read_device<int32_t>(b.counts, l.E);
      const auto gu = test::read_device<bf16_t>(b.gate_up_bf16, L * 2 * l.I * l.H);
      const auto dn = test::read_device<bf16_t>(b.down_bf16, L * l.H * l.I);
      // Local expert e is router expert begin + e: the rank's slice of the dequantized experts.
      const int64_t ngu = 2 * l.I * l.H, ndn = l.H * l.I;
      const std::vector<bf16_t> gu_want(l.gate_up_deq.begin() + begin * ngu,
                                        l.gate_up_deq.begin() + (begin + L) * ngu),
          dn_want(l.down_deq.begin() + begin * ndn, l.down_deq.begin() + (begin + L) * ndn);
      for (int64_t e = 0; e < L; ++e) {
        expect_expert_copy(gu, gu_want, e, ngu, counts[size_t(begin + e)], "gate_up");
        expect_expert_copy(dn, dn_want, e, ndn, counts[size_t(begin + e)], "down");
      }
    }
  }
}

// The dequant path captured in a CUDA graph once, replayed while x (and so the routing, and the experts
// dequantized) changes: each replay bitwise the eager BF16 grouped GEMM on the dequantized experts.
TEST(CudaMoeFp8, DequantPathGraphReplayWhileRoutingChanges) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(64, 2, 256, 128, 31);
  const DequantMinTokens guard(32);
  const test::Fp8W8a8Scope dequant_path(false);
  const int64_t T = 40;  // 80 pairs over 64 experts: the set of experts with rows changes between replays
  const ops::MoeWeights w8 = l.fp8(Device::cuda()), wd = l.dequantized_device();
  Buffer x(size_t(T * l.H) * 2, Device::cuda()), out(size_t(T * l.H) * 2, Device::cuda());
  Buffer scratch(ops::cuda::moe_scratch_bytes(w8, l.H, T), Device::cuda()),
      ref_scratch(ops::cuda::moe_scratch_bytes(wd, l.H, T, grouped_kernel()), Device::cuda());
  test::poison(scratch);
  const Tensor xt(x.data(), DType::bf16, {T, l.H}, Device::cuda());
  const Tensor ot(out.data(), DType::bf16, {T, l.H}, Device::cuda());
  const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I, .fp8_dequant = true};
  const int32_t* counts = kc::moe_scratch_layout(s, scratch.data()).counts;
  const auto load = [&](uint32_t r) { test::load_moe_input(x, out, size_t(T * l.H), 200 + r); };
  load(0);
  ops::cuda::moe_mlp(xt, w8, ot, scratch.data(), scratch.bytes());  // eager once before the capture
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::set<std::vector<int32_t>> chosen;  // the FP8 scratch's counts after each run
  const std::string mismatch = test::graph_replay_mismatch(
      [&](cudaStream_t st) {
        const kc::StreamScope scope(st);
        ops::cuda::moe_mlp(xt, w8, ot, scratch.data(), scratch.bytes());
      },
      [&](cudaStream_t st) {  // the reference: BF16 experts, the same grouped GEMM
        const kc::StreamScope scope(st);
        ops::cuda::moe_mlp(xt, wd, ot, ref_scratch.data(), ref_scratch.bytes(), grouped_kernel());
      },
      load,
      [&] {
        chosen.insert(test::read_device<int32_t>(counts, l.E));
        return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(out, out.bytes())};
      },
      5);
  EXPECT_EQ(mismatch, "");
  // Read after each eager run (the FP8 scratch then holds the previous FP8 run's) and each replay: 5 distinct
  // sets where the routing changes every round.
  EXPECT_GE(chosen.size(), 5u)
      << "the experts' counts must change between replays for the test to mean anything";
}

// Of every expert's [rows, cols] matrix in v ([E, rows, cols]): the rows of `row_ranges` in order, columns
// [c0, c0 + width).
template <typename T>
std::vector<T> expert_cut(const std::vector<T>& v, int64_t E, int64_t rows, int64_t cols,
                          const std::vector<std::pair<int64_t, int64_t>>& row_ranges, int64_t c0,
                          int64_t width) {
  std::vector<T> out;
  for (int64_t e = 0; e < E; ++e)
    for (const auto& [r0, n] : row_ranges)
      for (int64_t r = r0; r < r0 + n; ++r) {
        const T* row = v.data() + (e * rows + r) * cols;
        out.insert(out.end(), row + c0, row + c0 + width);
      }
  return out;
}

// Tensor-parallel rank r of R: each expert's gate and up rows [r I / R, (r + 1) I / R) and those down
// columns, with their block scales (the cut on the 128 x 128 grid: I / R a multiple of 128), as the sharded
// loader slices them (model/tensor_parallel.cpp), e4m3 and dequantized.
Fp8Layer split_share(const Fp8Layer& l, int64_t r, int64_t R) {
  const int64_t E = l.E, H = l.H, I = l.I, Ir = I / R, b = 128;
  Fp8Layer p;
  p.E = E, p.k = l.k, p.H = H, p.I = Ir;
  p.router = l.router;
  const std::vector<std::pair<int64_t, int64_t>> gu_rows = {{r * Ir, Ir}, {I + r * Ir, Ir}},
                                                 gu_blocks = {{r * Ir / b, Ir / b},
                                                              {(I + r * Ir) / b, Ir / b}};
  p.gate_up_q = expert_cut(l.gate_up_q, E, 2 * I, H, gu_rows, 0, H);
  p.gate_up_deq = expert_cut(l.gate_up_deq, E, 2 * I, H, gu_rows, 0, H);
  p.gate_up_s = expert_cut(l.gate_up_s, E, 2 * I / b, l.gc(), gu_blocks, 0, l.gc());
  p.down_q = expert_cut(l.down_q, E, H, I, {{0, H}}, r * Ir, Ir);
  p.down_deq = expert_cut(l.down_deq, E, H, I, {{0, H}}, r * Ir, Ir);
  p.down_s = expert_cut(l.down_s, E, H / b, l.dc(), {{0, H / b}}, r * Ir / b, Ir / b);
  p.d_router = to_device(p.router);
  p.d_gu_q = to_device(p.gate_up_q);
  p.d_dn_q = to_device(p.down_q);
  p.d_gu_s = to_device(p.gate_up_s);
  p.d_dn_s = to_device(p.down_s);
  p.d_gu_deq = to_device(p.gate_up_deq);
  p.d_dn_deq = to_device(p.down_deq);
  return p;
}

// A tensor-parallel rank's share of block-FP8 experts (each expert's intermediate cut on the 128 x 128 grid,
// 3 ranks of one block each): bitwise the BF16 share on the dequantized slice (path (c)), near the CPU
// oracle's share (path (a)), and the ranks' bf16 outputs summed (rank order, fp32, one rounding) near the
// whole layer; the gather GEMV at decode sizes (fused down + combine at T = 1) and past 64 tokens, the
// dequant + grouped GEMM path at 300 (above the default threshold).
TEST(CudaMoeFp8, SplitIntermediateShareOnTheBlockGrid) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(8, 2, 256, 384, 17);
  const test::Fp8E4m3x16Scope path_c(false);  // the GEMV's share bitwise the BF16 share: path (c)
  constexpr int64_t R = 3;
  std::vector<Fp8Layer> shares;
  for (int64_t r = 0; r < R; ++r) shares.push_back(split_share(l, r, R));
  Buffer scratch(256, Device::cuda());
  for (const int64_t T : {int64_t(1), int64_t(5), int64_t(40), int64_t(100), int64_t(300)}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const auto x = random_bf16(size_t(T * l.H), uint32_t(T + 11));
    const Buffer dx = to_device(x);
    const Tensor hx(const_cast<bf16_t*>(x.data()), DType::bf16, {T, l.H});
    const auto whole = test::run_moe_gpu(l.fp8(Device::cuda()), dx, T, l.H, MoeExperts::by_rows, scratch);
    std::vector<float> sum(whole.size(), 0.0f);
    for (int64_t r = 0; r < R; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ops::MoeWeights w = shares[size_t(r)].fp8(Device::cuda());
      w.split_intermediate = true;
      const auto got = test::run_moe_gpu(w, dx, T, l.H, MoeExperts::by_rows, scratch);
      const bool w8a8 = ops::cuda::moe_fp8_w8a8_runs(w, T);  // path (a) itself: no bf16 twin
      if (!w8a8) {
        const MoeExperts same =
            ops::cuda::moe_fp8_dequant_runs(w, T) ? grouped_kernel() : MoeExperts::gather_gemv;
        const auto bf16 =
            test::run_moe_gpu(shares[size_t(r)].dequantized(Device::cuda()), dx, T, l.H, same, scratch);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, bf16[i].bits) << "element " << i;
      }
      ops::MoeWeights hw = shares[size_t(r)].fp8(Device::cpu());
      hw.split_intermediate = true;
      std::vector<bf16_t> want(got.size());
      ops::moe_mlp(hx, hw, Tensor(want.data(), DType::bf16, {T, l.H}));
      EXPECT_LE(test::rel_frob(got, want), w8a8 ? test::kW8a8LayerTol : 0.1)
          << "vs the CPU oracle's share (path (a))";
      for (size_t i = 0; i < got.size(); ++i) sum[i] += bf16_to_f32(got[i]);
    }
    std::vector<bf16_t> summed(sum.size());
    for (size_t i = 0; i < sum.size(); ++i) summed[i] = f32_to_bf16(sum[i]);
    EXPECT_LE(test::rel_frob(summed, whole), 1.0 / 64) << "the ranks' sum vs the whole FP8 layer";
  }
}

// A 3-layer Qwen3-MoE shape whose every projection fills whole 128 x 128 blocks: layers 0 and 2 sparse (16
// experts, top-4), layer 1 a dense MLP.
ModelConfig small_moe_config() {
  ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.arch = ModelArch::qwen3_moe;
  c.vocab_size = 1024;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  c.moe.num_experts = 16;
  c.moe.num_experts_per_tok = 4;
  c.moe.moe_intermediate_size = 128;
  c.moe.norm_topk_prob = true;
  c.moe.mlp_only_layers = {1};
  return c;
}

// A whole FP8 MoE model on CUDA (dense linears dequantized at load, experts widened by the GEMV or
// dequantized for the grouped GEMM) against the CPU model on the dequantized checkpoint in bf16:
// CudaFp8Dequant's bounds (expect_gpu_matches_cpu).
TEST(CudaMoeFp8, WholeModelMatchesCpuOnTheDequantizedWeights) {
  KILN_REQUIRE_GPU();
  // The reference is the dequantized checkpoint (path (c)): the dequant path at 300 tokens, not W8A8.
  const test::Fp8W8a8Scope dequant_path(false);
  const ModelConfig c = small_moe_config();
  const test::Fp8ModelPair m = test::load_fp8_and_dequantized(c, 17, "cuda_moe_fp8", Device::cuda());
  Qwen3Model &cpu = *m.cpu_bf16, &gpu = *m.fp8;
  ASSERT_TRUE(gpu.weights().layers[0].moe.is_fp8());
  // Prefills below and above the GEMV threshold (64), and above the FP8 dequant threshold (256 by default:
  // the model's MoE scratch then holds the dequantized experts).
  for (const size_t len : {size_t(61), size_t(90), size_t(300)}) {
    std::vector<int32_t> prompt(len);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 131 + 7) % 1024);
    test::expect_gpu_matches_cpu(cpu, gpu, prompt, 10, "fp8 MoE checkpoint, dequantized");
  }
}

// The GPU's online weight quantizer (ops/cuda/fp8_weight_quant.h) against the host's
// ops::quantize_weight_fp8: q and the scales bitwise on ragged shapes, with blocks of zeros (the 1e-4 clamp),
// tiny and subnormal values, signed zeros, and a block whose amax is an exact power of two.
TEST(CudaMoeFp8, DeviceQuantizerEqualsHostBitwise) {
  KILN_REQUIRE_GPU();
  for (const auto& [n, k] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {300, 200}, {256, 2048}, {129, 385}}) {
    SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(k));
    std::vector<bf16_t> w = random_bf16(size_t(n * k), uint32_t(n + k), -0.2f, 0.2f);
    for (int64_t i = 0; i < n * k; ++i) {
      const int64_t r = i / k, c = i % k;
      if (r < 128 && c < 128 && n > 128) w[size_t(i)] = f32_to_bf16(0.0f);     // block (0, 0): all zero
      if (c % 97 == 5) w[size_t(i)] = f32_to_bf16(float(r % 3 - 1) * 1e-38f);  // subnormal, +-0
      if (c % 89 == 7) w[size_t(i)] = f32_to_bf16(float(i % 5) * 3e-6f);       // below the clamp's grid
    }
    if (n * k > 1) w[1] = f32_to_bf16(-0.25f);  // an exact power of two as its block's amax
    const int64_t nb = ops::fp8_blocks(n), kb = ops::fp8_blocks(k);
    std::vector<uint8_t> q(size_t(n * k));
    std::vector<float> sc(size_t(nb * kb));
    ops::quantize_weight_fp8(Tensor(w.data(), DType::bf16, {n, k}), Tensor(q.data(), DType::f8e4m3, {n, k}),
                             Tensor(sc.data(), DType::f32, {nb, kb}), "w");
    const Buffer dw = to_device(w);
    Buffer dq(size_t(n * k), Device::cuda()), ds(sc.size() * 4, Device::cuda()), flag(4, Device::cuda());
    test::poison(dq);
    test::poison(ds);
    const int32_t none = INT32_MAX;
    KILN_CUDA_CHECK(cudaMemcpy(flag.data(), &none, 4, cudaMemcpyHostToDevice));
    kc::quantize_weight_fp8(static_cast<const uint16_t*>(dw.data()), n, k, static_cast<uint8_t*>(dq.data()),
                            static_cast<float*>(ds.data()), static_cast<int32_t*>(flag.data()), 3, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gq = to_host<uint8_t>(dq, q.size());
    const auto gs = to_host<float>(ds, sc.size());
    EXPECT_EQ(to_host<int32_t>(flag, 1)[0], none);
    for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(int(gq[i]), int(q[i])) << "q element " << i;
    for (size_t i = 0; i < sc.size(); ++i)
      ASSERT_EQ(f32_bits(gs[i]), f32_bits(sc[i])) << "scale " << i << ": " << gs[i] << " vs " << sc[i];
  }
}

// The loader's online quantization on the GPU (model/fp8_weights.h quantize_fp8_stack_on_device: the MoE
// experts, and the dense projections that stay e4m3): a random-weight FP8 MoE model loaded onto CUDA holds,
// bitwise, the e4m3 bytes and scales of the same model quantized on the host (a sparse and a dense-MLP
// layer); a non-finite weight is refused naming its tensor.
TEST(CudaMoeFp8, OnlineQuantizationOnTheGpuAtLoadEqualsTheHostQuantization) {
  KILN_REQUIRE_GPU();
  ModelConfig c = small_moe_config();
  c.quant.online = true;
  const Qwen3Weights host = load_qwen3_weights(c, nullptr, 5, Device::cpu());
  const Qwen3Weights gpu = load_qwen3_weights(c, nullptr, 5, Device::cuda());
  const auto expect_bytes_equal = [](const Tensor& want, const Tensor& got, const std::string& what) {
    ASSERT_EQ(want.shape, got.shape) << what;
    ASSERT_TRUE(got.device.is_cuda()) << what;
    std::vector<uint8_t> back(size_t(got.nbytes()));
    KILN_CUDA_CHECK(cudaMemcpy(back.data(), got.data, back.size(), cudaMemcpyDeviceToHost));
    const auto* w = static_cast<const uint8_t*>(want.data);
    for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(int(back[i]), int(w[i])) << what << " byte " << i;
  };
  for (size_t l = 0; l < size_t(c.num_layers); ++l) {
    const LayerWeights &h = host.layers[l], &g = gpu.layers[l];
    const std::string at = "layer " + std::to_string(l) + " ";
    std::vector<std::tuple<Tensor, Tensor, std::string>> parts = {
        {h.qkv.weight, g.qkv.weight, "qkv"},
        {h.qkv.scale, g.qkv.scale, "qkv scale"},
        {h.o_proj.weight, g.o_proj.weight, "o_proj"},
        {h.o_proj.scale, g.o_proj.scale, "o_proj scale"}};
    if (c.is_moe_layer(int64_t(l))) {
      ASSERT_TRUE(h.moe.is_fp8() && g.moe.is_fp8());
      parts.insert(parts.end(), {{h.moe.gate_up, g.moe.gate_up, "experts gate_up"},
                                 {h.moe.down, g.moe.down, "experts down"},
                                 {h.moe.gate_up_scale, g.moe.gate_up_scale, "experts gate_up scale"},
                                 {h.moe.down_scale, g.moe.down_scale, "experts down scale"}});
    } else {
      parts.insert(parts.end(), {{h.gate_up.weight, g.gate_up.weight, "gate_up"},
                                 {h.gate_up.scale, g.gate_up.scale, "gate_up scale"},
                                 {h.down.weight, g.down.weight, "down"},
                                 {h.down.scale, g.down.scale, "down scale"}});
    }
    for (const auto& [want, got, what] : parts) {
      ASSERT_TRUE(want.dtype == DType::f8e4m3 || want.dtype == DType::f32) << at + what;
      expect_bytes_equal(want, got, at + what);
    }
  }
  std::vector<Buffer> storage;
  const std::vector<bf16_t> bad = {f32_to_bf16(1.0f), f32_to_bf16(INFINITY)};
  test_support::expect_contains(test_support::error_of([&] {
                                  quantize_fp8_stack_on_device(
                                      {"good.weight", "bad.weight"}, {128, 1}, 2,
                                      [&](size_t i, void* dst) {
                                        std::vector<bf16_t> part(size_t(i == 0 ? 256 : 2), f32_to_bf16(0.5f));
                                        if (i == 1) part = bad;
                                        copy_bytes(dst, Device::cuda(), part.data(), Device::cpu(),
                                                   part.size() * 2);
                                      },
                                      Device::cuda(), storage);
                                }),
                                {"bad.weight", "non-finite"});
}

}  // namespace
}  // namespace kiln
