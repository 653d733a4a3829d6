// Expert parallelism of the sparse MLP on CUDA (ops/moe.h; src/ops/cuda/moe.h MoeShape::expert_begin): each
// rank's share (experts [e0, e1) of the router's E, the routing over all E) run in turn on the one GPU.
// Per share: the permutation drops exactly the other ranks' pairs (counts, rows, tiles, active list; inverse
// -1), every expert kernel's output is bitwise the combine of the unsharded layer's own expert rows over the
// rank's slots (the same y rows, the sum restricted: an EP share computes nothing the whole layer does not),
// and it matches the CPU oracle of the same share; the shares summed in rank order (fp32, one rounding: the
// two-rank bf16 all-reduce) match the unsharded layer. BF16 and block-FP8 experts (FP8 bitwise the BF16 share
// on the dequantized experts, but on the W8A8 grouped GEMM: path (a), held to the CPU), the gather GEMV (T <=
// 64, with the fused down + combine at T = 1), the grouped GEMMs, one routing chunk and several; ranks that
// receive no token; a CUDA graph of a share replayed while its routing changes.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "moe_fp8_layer.h"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_ops.h"
#include "ops/moe.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace kc = ::kiln::cuda;
using ops::cuda::MoeExperts, test::Fp8Layer, test::expert_share, test::read_device, test::run_moe_gpu;

// What a run left in the scratch: the routing, its layout and the expert rows y.
struct Routed {
  std::vector<int32_t> experts, counts, offsets, active, inverse, sorted_pair;
  std::vector<bf16_t> weights, y;
};

Routed read_routed(const kc::MoeShape& s, void* scratch) {
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch);
  Routed r;
  r.experts = read_device<int32_t>(b.experts, s.T * s.k);
  r.weights = read_device<bf16_t>(b.weights, s.T * s.k);
  r.counts = read_device<int32_t>(b.counts, s.E);
  r.offsets = read_device<int32_t>(b.offsets, s.E + 1);
  r.active = read_device<int32_t>(b.active, s.E + 1);
  r.inverse = read_device<int32_t>(b.inverse, s.T * s.k);
  r.sorted_pair = read_device<int32_t>(b.sorted_pair, r.offsets[size_t(s.E)]);
  r.y = read_device<bf16_t>(b.y, s.max_rows() * s.H);
  return r;
}

// The share's layout holds the pairs of experts [e0, e1) of the whole layer's routing, each exactly once, and
// nothing else. Returns the share's pair count.
int64_t check_share_layout(const kc::MoeShape& s, const Routed& whole, const Routed& share) {
  EXPECT_EQ(share.experts, whole.experts) << "every rank routes every token alike";
  const int64_t e0 = s.expert_begin, e1 = s.expert_end(), tile = kc::kMoeRowTile;
  std::vector<int32_t> active;
  int64_t rows = 0, pairs = 0;
  for (int64_t e = 0; e < s.E; ++e) {
    const bool local = e >= e0 && e < e1;
    const int32_t n = local ? whole.counts[size_t(e)] : 0;
    EXPECT_EQ(share.counts[size_t(e)], n) << "expert " << e;
    EXPECT_EQ(share.offsets[size_t(e)], rows) << "expert " << e;
    rows += (n + tile - 1) / tile * tile;
    pairs += n;
    if (n > 0) active.push_back(int32_t(e));
  }
  EXPECT_EQ(share.offsets[size_t(s.E)], rows);
  EXPECT_EQ(share.active[size_t(s.E)], int32_t(active.size()));
  for (size_t i = 0; i < active.size(); ++i) EXPECT_EQ(share.active[i], active[i]);
  for (int64_t i = 0; i < s.T * s.k; ++i) {
    const int32_t e = share.experts[size_t(i)], row = share.inverse[size_t(i)];
    if (e < e0 || e >= e1) {
      EXPECT_EQ(row, -1) << "pair " << i << " of expert " << e << " is another rank's";
      continue;
    }
    EXPECT_TRUE(row >= 0 && row < rows && share.sorted_pair[size_t(row)] == i) << "pair " << i;
  }
  return pairs;
}

// out[t] of the share against the whole layer's y rows: bf16 of the fp32 sum from +0, in slot order, of the
// rank's slots' y * weight.
void expect_share_sums_whole_rows(const kc::MoeShape& s, const Routed& whole,
                                  const std::vector<bf16_t>& out) {
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < s.k; ++j) {
        const int64_t i = t * s.k + j, e = whole.experts[size_t(i)];
        if (e < s.expert_begin || e >= s.expert_end()) continue;
        acc += bf16_to_f32(whole.y[size_t(whole.inverse[size_t(i)] * s.H + h)]) *
               bf16_to_f32(whole.weights[size_t(i)]);
      }
      ASSERT_EQ(out[size_t(t * s.H + h)].bits, f32_to_bf16(acc).bits) << "token " << t << " column " << h;
    }
}

struct Form {
  bool fp8;
  MoeExperts kernel;
  const char* name;
};

std::vector<Form> forms() {
  std::vector<Form> f = {{false, MoeExperts::by_rows, "bf16 by rows"},
                         {false, MoeExperts::gather_gemv, "bf16 gather GEMV"},
                         {false, MoeExperts::grouped_gemm, "bf16 grouped GEMM"},
                         {true, MoeExperts::by_rows, "fp8 by rows"}};
  if (kc::moe_grouped_gemm_sm90_applies()) f.push_back({false, MoeExperts::grouped_gemm_sm90, "bf16 wgmma"});
  if (kc::moe_grouped_gemm_fp8_sm90_applies())
    f.push_back({true, MoeExperts::grouped_gemm_fp8_w8a8, "fp8 w8a8 grouped GEMM"});
  return f;
}

// Each of `ranks` equal shares of l's experts, for each batch size and expert kernel.
void check_shares(const Fp8Layer& l, const std::vector<int64_t>& rank_counts,
                  const std::vector<int64_t>& batches, bool expect_an_idle_rank = false) {
  Buffer scratch(256, Device::cuda()), whole_scratch(256, Device::cuda());
  const test::Fp8E4m3x16Scope path_c(false);  // FP8 on the GEMV bitwise the BF16 share: path (c)
  for (const int64_t T : batches) {
    const auto x = test::random_bf16(size_t(T * l.H), uint32_t(T * 13 + 5));
    const Buffer dx = test::to_device(x);
    const Tensor hx(const_cast<bf16_t*>(x.data()), DType::bf16, {T, l.H});
    for (const Form& f : forms()) {
      const ops::MoeWeights dw = f.fp8 ? l.fp8(Device::cuda()) : l.dequantized(Device::cuda());
      const ops::MoeWeights hw = f.fp8 ? l.fp8(Device::cpu()) : l.dequantized(Device::cpu());
      const auto whole_out = run_moe_gpu(dw, dx, T, l.H, f.kernel, whole_scratch);
      const kc::MoeShape ws{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I};
      const Routed whole = read_routed(ws, whole_scratch.data());
      std::vector<bf16_t> cpu_whole(size_t(T * l.H));
      ops::moe_mlp(hx, hw, Tensor(cpu_whole.data(), DType::bf16, {T, l.H}));
      const double tol = f.fp8 ? 0.1 : 1.0 / 128;  // path (a) vs (c) for FP8 (test_cuda_moe_fp8.cpp)
      for (const int64_t R : rank_counts) {
        SCOPED_TRACE(std::string(f.name) + " E " + std::to_string(l.E) + " T " + std::to_string(T) +
                     " ranks " + std::to_string(R));
        const int64_t L = l.E / R;
        std::vector<float> sum(size_t(T * l.H), 0.0f);
        bool idle_rank = false;
        for (int64_t r = 0; r < R; ++r) {
          SCOPED_TRACE("rank " + std::to_string(r));
          const ops::MoeWeights share = expert_share(dw, r * L, (r + 1) * L);
          const auto got = run_moe_gpu(share, dx, T, l.H, f.kernel, scratch);
          const kc::MoeShape s{
              .T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I, .expert_begin = r * L, .local = L};
          const int64_t pairs = check_share_layout(s, whole, read_routed(s, scratch.data()));
          idle_rank |= pairs == 0;
          expect_share_sums_whole_rows(s, whole, got);
          // FP8: bitwise the BF16 share on the dequantized experts, with the same kernel (but W8A8, path (a)
          // itself, which the CPU comparison below holds)
          if (f.fp8 && !ops::cuda::moe_fp8_w8a8_runs(share, T, f.kernel)) {
            const MoeExperts same = !ops::cuda::moe_fp8_dequant_runs(share, T) ? MoeExperts::gather_gemv
                                    : kc::moe_grouped_gemm_sm90_applies()      ? MoeExperts::grouped_gemm_sm90
                                                                               : MoeExperts::grouped_gemm;
            const auto bf16 = run_moe_gpu(expert_share(l.dequantized(Device::cuda()), r * L, (r + 1) * L), dx,
                                          T, l.H, same, scratch);
            for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, bf16[i].bits) << "element " << i;
          }
          std::vector<bf16_t> want(size_t(T * l.H));
          ops::moe_mlp(hx, expert_share(hw, r * L, (r + 1) * L), Tensor(want.data(), DType::bf16, {T, l.H}));
          EXPECT_LE(test::rel_frob(got, want), tol) << "vs the CPU oracle of the same share";
          for (size_t i = 0; i < got.size(); ++i) sum[i] += bf16_to_f32(got[i]);
        }
        if (R == 1) {  // begin 0, L = E: the unsharded layer itself
          for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(f32_to_bf16(sum[i]).bits, whole_out[i].bits);
        }
        std::vector<bf16_t> summed(sum.size());
        for (size_t i = 0; i < sum.size(); ++i) summed[i] = f32_to_bf16(sum[i]);
        EXPECT_LE(test::rel_frob(summed, whole_out), 1.0 / 64)
            << "the ranks' sum vs the unsharded CUDA layer";
        EXPECT_LE(test::rel_frob(summed, cpu_whole), tol + 1.0 / 64) << "the ranks' sum vs the CPU layer";
        if (expect_an_idle_rank && T * l.k < R) {  // fewer pairs than ranks: some rank gets none
          EXPECT_TRUE(idle_rank) << "a rank meant to receive no token";
        }
      }
    }
  }
}

TEST(CudaMoeEp, SharesEqualTheWholeLayersRowsAndSumToIt) {
  KILN_REQUIRE_GPU();
  // 8 experts, top-2: at T = 1 six of eight one-expert ranks receive no token (with 1 or 2 ranks none need be
  // idle).
  check_shares(test::make_fp8_layer(8, 2, 128, 128, 41), {1, 2, 8}, {1, 5, 33, 64, 100}, true);
}

TEST(CudaMoeEp, SharesAtQwen3MoeLikeWidths) {
  KILN_REQUIRE_GPU();
  check_shares(test::make_fp8_layer(32, 8, 512, 256, 43), {4}, {1, 8, 100, 256});
}

// A share through the public dispatcher (ops::moe_mlp with its scratch tensor), captured in a CUDA graph and
// replayed while x, and so which pairs are the rank's, changes: every replay equals its eager run bitwise,
// including rounds where the rank receives no token.
TEST(CudaMoeEp, GraphOfAShareReplaysAsEagerWhileRoutingChanges) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(16, 2, 256, 128, 47);
  for (const bool fp8 : {false, true})
    for (const int64_t T : {int64_t(1), int64_t(3), int64_t(80)}) {
      SCOPED_TRACE(std::string(fp8 ? "fp8" : "bf16") + " T " + std::to_string(T));
      const ops::MoeWeights share =
          expert_share(fp8 ? l.fp8(Device::cuda()) : l.dequantized(Device::cuda()), 12, 16);
      Buffer x(size_t(T * l.H) * 2, Device::cuda()), out(size_t(T * l.H) * 2, Device::cuda());
      Buffer scratch(size_t(ops::moe_scratch_bytes(share, l.H, T, Device::cuda())), Device::cuda());
      const Tensor xt(x.data(), DType::bf16, {T, l.H}, Device::cuda());
      const Tensor ot(out.data(), DType::bf16, {T, l.H}, Device::cuda());
      const Tensor st(scratch.data(), DType::u8, {int64_t(scratch.bytes())}, Device::cuda());
      const auto run = [&](cudaStream_t stream) {
        kc::StreamScope scope(stream);
        ops::moe_mlp(xt, share, ot, st);
      };
      const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I, .expert_begin = 12, .local = 4};
      int idle_rounds = 0;
      std::set<std::vector<int32_t>> layouts;  // the rank's expert counts of each run
      const auto load = [&](uint32_t r) { test::load_moe_input(x, out, size_t(T * l.H), 200 + r); };
      const auto outputs = [&] {
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        const auto counts = read_device<int32_t>(kc::moe_scratch_layout(s, scratch.data()).counts, l.E);
        int32_t mine = 0;
        for (int64_t e = 12; e < 16; ++e) mine += counts[size_t(e)];
        idle_rounds += mine == 0;
        layouts.insert(counts);
        return std::vector<std::vector<uint8_t>>{read_device<uint8_t>(out.data(), T * l.H * 2)};
      };
      load(99);
      run(nullptr);  // eager first: the router GEMM's tactic above 64 tokens
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(test::graph_replay_mismatch(run, run, load, outputs, 12), "");
      // The counts are the rank's own (others' experts count 0): at T = 1 a 4-expert rank of 16 sees a few
      // layouts only (none, one expert, two), so there it needs three.
      EXPECT_GT(layouts.size(), T == 1 ? 2u : 4u)
          << "the rank's pairs must change between replays for the test to mean anything";
      if (T == 1) {
        EXPECT_GT(idle_rounds, 0) << "no round left the rank without a token";
      }
    }
}

// The fp32 partial (the CPU's all-reduce) stays the CPU's: refused on CUDA, naming why.
TEST(CudaMoeEp, F32PartialIsRefusedOnCuda) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(8, 2, 128, 128, 5);
  const auto x = test::random_bf16(size_t(2 * 128), 3);
  const Buffer dx = test::to_device(x);
  Buffer out(2 * 128 * 4, Device::cuda());
  const ops::MoeWeights share = expert_share(l.dequantized(Device::cuda()), 4, 8);
  Buffer scratch(size_t(ops::moe_scratch_bytes(share, 128, 2, Device::cuda())), Device::cuda());
  test_support::expect_contains(
      test_support::error_of([&] {
        ops::moe_mlp(Tensor(dx.data(), DType::bf16, {2, 128}, Device::cuda()), share,
                     Tensor(out.data(), DType::f32, {2, 128}, Device::cuda()),
                     Tensor(scratch.data(), DType::u8, {int64_t(scratch.bytes())}, Device::cuda()));
      }),
      {"f32 partial", "CPU backend only"});
}

}  // namespace
}  // namespace kiln
