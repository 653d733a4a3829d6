// The sparse MLP's CUDA kernels (src/ops/cuda/moe.h) against the CPU oracle (ops/moe.h): routing bitwise
// (ties, an expert no token chooses, one every token chooses, E not a multiple of 32, k = E), the
// permutation's invariants (every (token, expert) pair exactly once, rows of an expert in ascending token
// order, offsets padded to the row tile, padding rows -1, the inverse), every expert kernel (gather GEMV,
// mma.sync grouped GEMM, wgmma grouped GEMM where the device runs it) within linear's
// tolerance over batch 1..512, the combine bitwise from the experts' bf16 outputs, and a CUDA graph replayed
// while its inputs (and so its routing) change equal to eager launches.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "kiln/error.h"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_ops.h"
#include "ops/moe.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace kc = ::kiln::cuda;
using test::random_bf16;
using test::to_device;
using test::to_host;

struct RouteOut {
  std::vector<int32_t> experts;
  std::vector<bf16_t> weights;
};

RouteOut route_cpu(const std::vector<bf16_t>& logits, int64_t T, int64_t E, int64_t k, bool norm) {
  RouteOut r{std::vector<int32_t>(size_t(T * k)), std::vector<bf16_t>(size_t(T * k))};
  ops::moe_route(Tensor(const_cast<bf16_t*>(logits.data()), DType::bf16, {T, E}), k, norm,
                 Tensor(r.experts.data(), DType::i32, {T, k}), Tensor(r.weights.data(), DType::bf16, {T, k}));
  return r;
}

RouteOut route_gpu(const std::vector<bf16_t>& logits, int64_t T, int64_t E, int64_t k, bool norm) {
  const Buffer l = to_device(logits);
  Buffer e(size_t(T * k) * 4, Device::cuda()), w(size_t(T * k) * 2, Device::cuda());
  test::poison(e);
  test::poison(w);
  ops::moe_route(Tensor(l.data(), DType::bf16, {T, E}, Device::cuda()), k, norm,
                 Tensor(e.data(), DType::i32, {T, k}, Device::cuda()),
                 Tensor(w.data(), DType::bf16, {T, k}, Device::cuda()));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return {to_host<int32_t>(e, size_t(T * k)), to_host<bf16_t>(w, size_t(T * k))};
}

void expect_route_equal(const std::vector<bf16_t>& logits, int64_t T, int64_t E, int64_t k, bool norm,
                        const std::string& label) {
  const RouteOut want = route_cpu(logits, T, E, k, norm), got = route_gpu(logits, T, E, k, norm);
  for (int64_t i = 0; i < T * k; ++i) {
    ASSERT_EQ(got.experts[size_t(i)], want.experts[size_t(i)]) << label << " pair " << i;
    ASSERT_EQ(got.weights[size_t(i)].bits, want.weights[size_t(i)].bits) << label << " pair " << i;
  }
}

TEST(CudaMoe, RouteEqualsCpuBitwise) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t T, E, k;
  };
  for (const Case c : {Case{1, 8, 2}, Case{7, 128, 8}, Case{33, 60, 4}, Case{100, 128, 8}, Case{5, 3, 3},
                       Case{64, 512, 8}, Case{9, 32, 1}}) {
    for (const bool norm : {false, true}) {
      const auto logits = random_bf16(size_t(c.T * c.E), uint32_t(c.T * 131 + c.E + norm), -6.0f, 6.0f);
      expect_route_equal(
          logits, c.T, c.E, c.k, norm,
          "T " + std::to_string(c.T) + " E " + std::to_string(c.E) + " k " + std::to_string(c.k));
    }
  }
}

// Ties everywhere (logits from four values), expert 5 chosen by no token, expert 2 by every token.
TEST(CudaMoe, RouteTiesAndExpertsChosenByNoneOrAll) {
  KILN_REQUIRE_GPU();
  const int64_t T = 70, E = 40, k = 6;
  std::vector<bf16_t> logits(size_t(T * E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      float v = float((t * 7 + e * 3) % 4) * 0.5f;
      if (e == 5) v = -30.0f;
      if (e == 2) v = 8.0f;
      logits[size_t(t * E + e)] = f32_to_bf16(v);
    }
  for (const bool norm : {false, true}) expect_route_equal(logits, T, E, k, norm, "ties");
  const RouteOut r = route_gpu(logits, T, E, k, true);
  for (int64_t t = 0; t < T; ++t) {
    const auto* row = r.experts.data() + t * k;
    EXPECT_TRUE(std::find(row, row + k, 2) != row + k) << "token " << t;
    EXPECT_TRUE(std::find(row, row + k, 5) == row + k) << "token " << t;
  }
  // Every logit equal: the lowest k indices.
  std::vector<bf16_t> flat(size_t(T * E), f32_to_bf16(1.0f));
  expect_route_equal(flat, T, E, k, true, "all equal");
  EXPECT_EQ(route_gpu(flat, T, E, k, true).experts[size_t(k - 1)], k - 1);
}

// The permutation read back from moe_mlp's scratch (moe.h's layout) after a call on the GPU.
struct Permutation {
  std::vector<int32_t> experts, counts, offsets, tile_expert, active, sorted_pair, inverse;
  int32_t num_tiles = 0;
};

template <typename T>
std::vector<T> read(const void* p, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  copy_bytes(v.data(), Device::cpu(), p, Device::cuda(), size_t(n) * sizeof(T));
  return v;
}

Permutation read_permutation(const kc::MoeShape& s, void* scratch) {
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch);
  Permutation p;
  p.experts = read<int32_t>(b.experts, s.T * s.k);
  p.counts = read<int32_t>(b.counts, s.E);
  p.offsets = read<int32_t>(b.offsets, s.E + 1);
  p.num_tiles = read<int32_t>(b.num_tiles, 1)[0];
  p.tile_expert = read<int32_t>(b.tile_expert, p.num_tiles);
  p.active = read<int32_t>(b.active, s.E + 1);
  p.sorted_pair = read<int32_t>(b.sorted_pair, p.offsets[size_t(s.E)]);
  p.inverse = read<int32_t>(b.inverse, s.T * s.k);
  return p;
}

void check_permutation(const kc::MoeShape& s, const Permutation& p) {
  const int64_t pairs = s.T * s.k, tile = kc::kMoeRowTile;
  std::vector<int32_t> count(size_t(s.E), 0);
  for (int32_t e : p.experts) {
    ASSERT_TRUE(e >= 0 && e < s.E);
    ++count[size_t(e)];
  }
  EXPECT_EQ(p.counts, count);
  ASSERT_LE(p.offsets[size_t(s.E)], s.max_rows());
  EXPECT_EQ(p.num_tiles * tile, p.offsets[size_t(s.E)]);
  std::vector<int> seen(size_t(pairs), 0);
  std::vector<int32_t> active;
  for (int64_t e = 0; e < s.E; ++e) {
    const int32_t off = p.offsets[size_t(e)], n = count[size_t(e)];
    const int32_t padded = int32_t((n + tile - 1) / tile * tile);
    ASSERT_EQ(off % tile, 0) << "expert " << e;
    ASSERT_EQ(p.offsets[size_t(e + 1)] - off, padded) << "expert " << e;
    if (n > 0) active.push_back(int32_t(e));
    for (int32_t i = 0; i < padded / tile; ++i) EXPECT_EQ(p.tile_expert[size_t(off / tile + i)], e);
    int32_t prev_token = -1;
    for (int32_t r = 0; r < padded; ++r) {
      const int32_t pair = p.sorted_pair[size_t(off + r)];
      if (r >= n) {
        EXPECT_EQ(pair, -1) << "padding row " << off + r;
        continue;
      }
      ASSERT_TRUE(pair >= 0 && pair < pairs) << "row " << off + r;
      EXPECT_EQ(p.experts[size_t(pair)], e) << "row " << off + r;
      EXPECT_GT(pair / s.k, prev_token) << "tokens ascending within expert " << e;
      prev_token = int32_t(pair / s.k);
      ++seen[size_t(pair)];
      EXPECT_EQ(p.inverse[size_t(pair)], off + r);
    }
  }
  for (int64_t i = 0; i < pairs; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "pair " << i << " lost or duplicated";
  EXPECT_EQ(p.active[size_t(s.E)], int32_t(active.size()));
  for (size_t i = 0; i < active.size(); ++i) EXPECT_EQ(p.active[i], active[i]);
}

// A layer's weights and input on the host and the device. The router has one non-zero weight a row (a
// power of two), so its logits are exact in any summation order and CPU and GPU route alike.
struct Layer {
  int64_t E, k, H, I;
  std::vector<bf16_t> router, gate_up, down;
  Buffer d_router, d_gate_up, d_down;
  ops::MoeWeights host_w() {
    ops::MoeWeights w;
    w.router = Tensor(router.data(), DType::bf16, {E, H});
    w.gate_up = Tensor(gate_up.data(), DType::bf16, {E, 2 * I, H});
    w.down = Tensor(down.data(), DType::bf16, {E, H, I});
    w.top_k = k;
    w.norm_topk_prob = true;
    return w;
  }
  ops::MoeWeights device_w() {
    ops::MoeWeights w = host_w();
    w.router = Tensor(d_router.data(), DType::bf16, {E, H}, Device::cuda());
    w.gate_up = Tensor(d_gate_up.data(), DType::bf16, {E, 2 * I, H}, Device::cuda());
    w.down = Tensor(d_down.data(), DType::bf16, {E, H, I}, Device::cuda());
    return w;
  }
};

Layer make_layer(int64_t E, int64_t k, int64_t H, int64_t I, uint32_t seed) {
  Layer l{E, k, H, I, std::vector<bf16_t>(size_t(E * H), f32_to_bf16(0.0f)), {}, {}, {}, {}, {}};
  for (int64_t e = 0; e < E; ++e)
    l.router[size_t(e * H + (e * 37 + 11) % H)] = f32_to_bf16(e % 2 ? 2.0f : 4.0f);
  l.gate_up = random_bf16(size_t(E * 2 * I * H), seed, -0.1f, 0.1f);
  l.down = random_bf16(size_t(E * H * I), seed + 1, -0.1f, 0.1f);
  l.d_router = to_device(l.router);
  l.d_gate_up = to_device(l.gate_up);
  l.d_down = to_device(l.down);
  return l;
}

// One moe_mlp on the GPU with the given expert kernel; returns out and leaves the scratch for reading.
std::vector<bf16_t> run_gpu(Layer& l, const Buffer& x, int64_t T, ops::cuda::MoeExperts kernel,
                            Buffer& scratch) {
  Buffer out(size_t(T * l.H) * 2, Device::cuda());
  test::poison(out);
  const ops::MoeWeights w = l.device_w();
  const size_t bytes = ops::cuda::moe_scratch_bytes(w, l.H, T);
  if (scratch.bytes() < bytes) scratch = Buffer(bytes, Device::cuda());
  test::poison(scratch);
  ops::cuda::moe_mlp(Tensor(x.data(), DType::bf16, {T, l.H}, Device::cuda()), w,
                     Tensor(out.data(), DType::bf16, {T, l.H}, Device::cuda()), scratch.data(),
                     scratch.bytes(), kernel);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<bf16_t>(out, size_t(T * l.H));
}

// out[t] recomputed on the host from the GPU's y rows and weights in moe.h's order: must be bitwise.
void expect_combine_bitwise(const kc::MoeShape& s, void* scratch, const std::vector<bf16_t>& out) {
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch);
  const auto inverse = read<int32_t>(b.inverse, s.T * s.k);
  const auto weights = read<bf16_t>(b.weights, s.T * s.k);
  const auto y = read<bf16_t>(b.y, s.max_rows() * s.H);
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < s.k; ++j)
        acc += bf16_to_f32(y[size_t(inverse[size_t(t * s.k + j)] * s.H + h)]) *
               bf16_to_f32(weights[size_t(t * s.k + j)]);
      ASSERT_EQ(out[size_t(t * s.H + h)].bits, f32_to_bf16(acc).bits) << "token " << t << " column " << h;
    }
}

void check_layer(int64_t E, int64_t k, int64_t H, int64_t I, const std::vector<int64_t>& batches) {
  Layer l = make_layer(E, k, H, I, uint32_t(E * 7 + H));
  Buffer scratch(256, Device::cuda());
  for (const int64_t T : batches) {
    SCOPED_TRACE("E " + std::to_string(E) + " k " + std::to_string(k) + " H " + std::to_string(H) + " I " +
                 std::to_string(I) + " T " + std::to_string(T));
    const auto x = random_bf16(size_t(T * H), uint32_t(T * 3 + 1));
    std::vector<bf16_t> want(size_t(T * H));
    ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), l.host_w(),
                 Tensor(want.data(), DType::bf16, {T, H}));
    const Buffer dx = to_device(x);
    const kc::MoeShape s{.T = T, .E = E, .k = k, .H = H, .I = I};
    using ops::cuda::MoeExperts;
    std::vector<std::pair<MoeExperts, const char*>> kernels = {{MoeExperts::gather_gemv, "gather GEMV"},
                                                               {MoeExperts::grouped_gemm, "grouped GEMM"}};
    if (kc::moe_grouped_gemm_sm90_applies())
      kernels.emplace_back(MoeExperts::grouped_gemm_sm90, "wgmma GEMM");
    std::vector<std::vector<bf16_t>> by_kernel;
    for (const auto& [kernel, name] : kernels) {
      const auto got = run_gpu(l, dx, T, kernel, scratch);
      const double err = test::rel_frob(got, want);
      EXPECT_LE(err, 1.0 / 128) << name << " vs the CPU oracle";
      check_permutation(s, read_permutation(s, scratch.data()));
      expect_combine_bitwise(s, scratch.data(), got);
      by_kernel.push_back(got);
    }
    for (size_t i = 1; i < by_kernel.size(); ++i)
      EXPECT_LE(test::rel_frob(by_kernel[0], by_kernel[i]), 1.0 / 128) << "GEMV vs " << kernels[i].second;
  }
}

TEST(CudaMoe, ExpertsMatchCpuOracleSmallShapes) {
  KILN_REQUIRE_GPU();
  check_layer(8, 2, 64, 48, {1, 2, 3, 5, 16, 17, 40});
  check_layer(6, 3, 96, 40, {1, 9, 33});  // I not a multiple of the tiles
}

TEST(CudaMoe, ExpertsMatchCpuOracleQwen3MoeWidths) {
  KILN_REQUIRE_GPU();
  check_layer(128, 8, 2048, 768, {1, 4, 8, 64});
  check_layer(32, 4, 512, 256, {1, 16, 100, 256, 512});
}

// A tensor-parallel rank's share (split_intermediate: each expert's gate/up rows and down columns a slice of
// I, out bf16) runs on CUDA: each of two ranks' outputs matches the CPU oracle on the same slice, and their
// sum the whole layer's, within the experts' tolerance.
TEST(CudaMoe, SplitIntermediateShareMatchesCpu) {
  KILN_REQUIRE_GPU();
  const int64_t E = 8, k = 2, H = 64, I = 48, T = 5, ranks = 2, Ir = I / ranks;
  Layer l = make_layer(E, k, H, I, 77);
  const auto x = random_bf16(size_t(T * H), 78);
  const Buffer dx = to_device(x);
  Buffer scratch(256, Device::cuda());
  std::vector<float> sum(size_t(T * H), 0.0f);
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<bf16_t> gu(size_t(E * 2 * Ir * H)), dn(size_t(E * H * Ir));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t i = 0; i < Ir; ++i)
          for (int64_t h = 0; h < H; ++h)
            gu[size_t(((e * 2 + half) * Ir + i) * H + h)] =
                l.gate_up[size_t((e * 2 * I + half * I + r * Ir + i) * H + h)];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Ir; ++i)
          dn[size_t((e * H + h) * Ir + i)] = l.down[size_t((e * H + h) * I + r * Ir + i)];
    }
    const Buffer dgu = to_device(gu), ddn = to_device(dn);
    ops::MoeWeights w = l.host_w();
    w.gate_up = Tensor(gu.data(), DType::bf16, {E, 2 * Ir, H});
    w.down = Tensor(dn.data(), DType::bf16, {E, H, Ir});
    w.split_intermediate = true;
    std::vector<bf16_t> want(size_t(T * H));
    ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), w,
                 Tensor(want.data(), DType::bf16, {T, H}));
    ops::MoeWeights dw = w;
    dw.router = Tensor(l.d_router.data(), DType::bf16, {E, H}, Device::cuda());
    dw.gate_up = Tensor(dgu.data(), DType::bf16, {E, 2 * Ir, H}, Device::cuda());
    dw.down = Tensor(ddn.data(), DType::bf16, {E, H, Ir}, Device::cuda());
    Buffer out(size_t(T * H) * 2, Device::cuda());
    scratch = Buffer(size_t(ops::moe_scratch_bytes(dw, H, T, Device::cuda())), Device::cuda());
    ops::moe_mlp(Tensor(dx.data(), DType::bf16, {T, H}, Device::cuda()), dw,
                 Tensor(out.data(), DType::bf16, {T, H}, Device::cuda()),
                 Tensor(scratch.data(), DType::u8, {int64_t(scratch.bytes())}, Device::cuda()));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<bf16_t>(out, size_t(T * H));
    EXPECT_LE(test::rel_frob(got, want), 1.0 / 128) << "rank " << r;
    for (size_t i = 0; i < got.size(); ++i) sum[i] += bf16_to_f32(got[i]);
  }
  std::vector<bf16_t> whole(size_t(T * H)), summed(size_t(T * H));
  ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), l.host_w(),
               Tensor(whole.data(), DType::bf16, {T, H}));
  for (size_t i = 0; i < sum.size(); ++i) summed[i] = f32_to_bf16(sum[i]);
  EXPECT_LE(test::rel_frob(summed, whole), 1.0 / 64) << "the ranks' sum vs the whole layer";
}

// Bad scratch is a clear error that launches nothing.
TEST(CudaMoe, ShortScratchIsAnError) {
  KILN_REQUIRE_GPU();
  Layer l = make_layer(8, 2, 64, 48, 5);
  const auto x = random_bf16(size_t(4 * 64), 3);
  const Buffer dx = to_device(x);
  Buffer out(4 * 64 * 2, Device::cuda()), small(64, Device::cuda());
  const Tensor xt(dx.data(), DType::bf16, {4, 64}, Device::cuda());
  const Tensor ot(out.data(), DType::bf16, {4, 64}, Device::cuda());
  EXPECT_THROW(ops::moe_mlp(xt, l.device_w(), ot, Tensor(small.data(), DType::u8, {64}, Device::cuda())),
               Error);
  EXPECT_THROW(ops::moe_mlp(xt, l.device_w(), ot), Error) << "CUDA moe_mlp without scratch";
}

// Captured once per expert kernel, replayed while x (and so the routing) changes: equal to eager launches.
TEST(CudaMoe, GraphReplayEqualsEagerWhileRoutingChanges) {
  KILN_REQUIRE_GPU();
  Layer l = make_layer(16, 4, 256, 128, 9);
  for (const int64_t T : {int64_t(3), int64_t(80)}) {
    const ops::MoeWeights w = l.device_w();
    Buffer x(size_t(T * l.H) * 2, Device::cuda()), out(size_t(T * l.H) * 2, Device::cuda());
    Buffer scratch(ops::cuda::moe_scratch_bytes(w, l.H, T), Device::cuda()),
        eager_scratch(scratch.bytes(), Device::cuda());
    const Tensor xt(x.data(), DType::bf16, {T, l.H}, Device::cuda());
    const Tensor ot(out.data(), DType::bf16, {T, l.H}, Device::cuda());
    cudaStream_t stream;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraphExec_t exec = nullptr;
    {
      kc::StreamScope scope(stream);
      ops::cuda::moe_mlp(xt, w, ot, scratch.data(), scratch.bytes());  // eager first: the GEMM's tactic
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaGraph_t graph;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      ops::cuda::moe_mlp(xt, w, ot, scratch.data(), scratch.bytes());
      KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      KILN_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    std::set<std::vector<int32_t>> routings;
    for (uint32_t step = 0; step < 6; ++step) {
      const auto xs = random_bf16(size_t(T * l.H), 100 + step);
      copy_bytes(x.data(), Device::cuda(), xs.data(), Device::cpu(), xs.size() * 2);
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto got = to_host<bf16_t>(out, size_t(T * l.H));
      const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I};
      routings.insert(read<int32_t>(kc::moe_scratch_layout(s, scratch.data()).experts, T * l.k));
      const auto want = run_gpu(l, x, T, ops::cuda::MoeExperts::by_rows, eager_scratch);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i].bits, want[i].bits) << "T " << T << " step " << step;
    }
    EXPECT_EQ(routings.size(), 6u) << "the routing must change between replays for the test to mean anything";
    KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
    KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

}  // namespace
}  // namespace kiln
