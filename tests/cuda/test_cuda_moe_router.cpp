// The fused router GEMV + routing (moe_router_route_launch, src/ops/cuda/moe_router.cu) against the CPU
// oracle, in both its forms (the cluster form where it applies, T <= 8, and the counter form everywhere):
// the router logits bitwise ops::cpu::moe_router_logits (ops/moe.h's canonical order) over batch 1..64 and
// the model's widths, the experts and weights bitwise ops::moe_route on them, the layout's invariants (its
// padding rows and tiles too, on a scratch poisoned with values no layout holds); rows with NaN logits (the
// route's exact fallback); repeated launches and a graph replay (the per-chunk counters reset); moe_mlp's
// routing from x bitwise the CPU's at T <= 64; and the residual-norm prologue bitwise add_rms_norm then the
// router.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/error.h"
#include "ops/cpu/moe.h"
#include "ops/cuda/context.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_ops.h"
#include "ops/moe.h"
#include "ops/rms_norm.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace kc = ::kiln::cuda;
using test::random_bf16;
using test::to_device;
using test::to_host;

template <typename T>
std::vector<T> read(const void* p, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  copy_bytes(v.data(), Device::cpu(), p, Device::cuda(), size_t(n) * sizeof(T));
  return v;
}

// The bits of n bf16 values on the device, for whole-vector comparisons.
std::vector<uint16_t> device_bits(const Buffer& b, int64_t n) {
  std::vector<uint16_t> v;
  for (const bf16_t x : to_host<bf16_t>(b, size_t(n))) v.push_back(x.bits);
  return v;
}

struct Routing {
  std::vector<bf16_t> logits, weights;
  std::vector<int32_t> experts;
};

Routing cpu_routing(const std::vector<bf16_t>& x, const std::vector<bf16_t>& router, const kc::MoeShape& s,
                    bool norm) {
  Routing r{std::vector<bf16_t>(size_t(s.T * s.E)), std::vector<bf16_t>(size_t(s.T * s.k)),
            std::vector<int32_t>(size_t(s.T * s.k))};
  ops::cpu::moe_router_logits(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {s.T, s.H}),
                              Tensor(const_cast<bf16_t*>(router.data()), DType::bf16, {s.E, s.H}),
                              Tensor(r.logits.data(), DType::bf16, {s.T, s.E}));
  ops::moe_route(Tensor(r.logits.data(), DType::bf16, {s.T, s.E}), s.k, norm,
                 Tensor(r.experts.data(), DType::i32, {s.T, s.k}),
                 Tensor(r.weights.data(), DType::bf16, {s.T, s.k}));
  return r;
}

// Poisons the scratch: NaN logits and weights, -1 elsewhere, but the tile -> expert map and the sorted pairs
// 0x5a5a5a5a (neither an expert, a pair nor the padding's -1), so expect_layout sees any entry left
// unwritten.
void poison_scratch(const kc::MoeShape& s, const Buffer& scratch) {
  test::poison(scratch);
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
  KILN_CUDA_CHECK(cudaMemset(b.tile_expert, 0x5a, size_t(s.max_tiles()) * 4));
  KILN_CUDA_CHECK(cudaMemset(b.sorted_pair, 0x5a, size_t(s.max_rows()) * 4));
}

// One fused launch on a poisoned scratch; the routing read back (and the scratch left for the layout).
// counter_only: the counter form of the fused kernel even where the cluster form applies (moe.h).
Routing gpu_routing(const Buffer& x, const Buffer& router, const kc::MoeShape& s, bool norm, Buffer& scratch,
                    cudaStream_t stream = nullptr, bool counter_only = false) {
  const size_t bytes = kc::moe_scratch_bytes(s);
  if (scratch.bytes() < bytes) scratch = Buffer(bytes, Device::cuda());
  poison_scratch(s, scratch);
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
  kc::moe_router_route_launch(static_cast<const uint16_t*>(x.data()), s.H,
                              static_cast<const uint16_t*>(router.data()), s, norm, b, stream, nullptr,
                              counter_only);
  kc::moe_permute_launch(s, b, stream);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return {read<bf16_t>(b.logits, s.T * s.E), read<bf16_t>(b.weights, s.T * s.k),
          read<int32_t>(b.experts, s.T * s.k)};
}

void expect_routing_equal(const Routing& got, const Routing& want, const std::string& label) {
  for (size_t i = 0; i < want.logits.size(); ++i)
    ASSERT_EQ(got.logits[i].bits, want.logits[i].bits) << label << " logit " << i;
  for (size_t i = 0; i < want.experts.size(); ++i) {
    ASSERT_EQ(got.experts[i], want.experts[i]) << label << " pair " << i;
    ASSERT_EQ(got.weights[i].bits, want.weights[i].bits) << label << " pair " << i;
  }
}

// The layout the fused launch (and moe_permute_launch past one chunk) leaves: every pair once, rows of an
// expert in ascending token order at its padded offset, its padding rows -1, its tiles in the tile -> expert
// map, the tile count, the active list.
void expect_layout(const kc::MoeShape& s, void* scratch, const std::vector<int32_t>& experts) {
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch);
  const auto counts = read<int32_t>(b.counts, s.E), offsets = read<int32_t>(b.offsets, s.E + 1);
  const auto active = read<int32_t>(b.active, s.E + 1), inverse = read<int32_t>(b.inverse, s.T * s.k);
  const auto sorted = read<int32_t>(b.sorted_pair, offsets[size_t(s.E)]);
  std::vector<int32_t> count(size_t(s.E), 0), want_active;
  for (const int32_t e : experts) ++count[size_t(e)];
  ASSERT_EQ(counts, count);
  for (int64_t e = 0; e < s.E; ++e)
    if (count[size_t(e)] > 0) want_active.push_back(int32_t(e));
  ASSERT_EQ(active[size_t(s.E)], int32_t(want_active.size()));
  for (size_t i = 0; i < want_active.size(); ++i) ASSERT_EQ(active[i], want_active[i]);
  for (int64_t pair = 0; pair < s.T * s.k; ++pair) {
    const int32_t row = inverse[size_t(pair)], e = experts[size_t(pair)];
    ASSERT_EQ(sorted[size_t(row)], pair) << "pair " << pair;
    ASSERT_TRUE(row >= offsets[size_t(e)] && row < offsets[size_t(e)] + count[size_t(e)]) << "pair " << pair;
  }
  for (int64_t e = 0; e < s.E; ++e)
    for (int32_t r = offsets[size_t(e)] + 1; r < offsets[size_t(e)] + count[size_t(e)]; ++r)
      ASSERT_LT(sorted[size_t(r - 1)] / s.k, sorted[size_t(r)] / s.k) << "expert " << e;
  const int32_t rows = offsets[size_t(s.E)];
  ASSERT_EQ(read<int32_t>(b.num_tiles, 1)[0], rows / kc::kMoeRowTile);
  const auto tiles = read<int32_t>(b.tile_expert, rows / kc::kMoeRowTile);
  for (int64_t e = 0; e < s.E; ++e) {
    const int32_t off = offsets[size_t(e)], n = count[size_t(e)];
    const int32_t padded = (n + kc::kMoeRowTile - 1) / kc::kMoeRowTile * kc::kMoeRowTile;
    ASSERT_EQ(offsets[size_t(e) + 1] - off, padded) << "expert " << e;
    for (int32_t r = off + n; r < off + padded; ++r) ASSERT_EQ(sorted[size_t(r)], -1) << "padding row " << r;
    for (int32_t i = 0; i < padded / kc::kMoeRowTile; ++i)
      ASSERT_EQ(tiles[size_t(off / kc::kMoeRowTile + i)], e) << "tile of expert " << e;
  }
}

// A dense random router, so the logits' summation order matters (unlike test_cuda_moe.cpp's one-weight
// router): the GPU must follow the canonical order to match bitwise.
TEST(CudaMoeRouter, LogitsAndRoutingEqualCpuBitwise) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t E, k, H;
  };
  Buffer scratch(256, Device::cuda());
  for (const Case c : {Case{128, 8, 2048}, Case{128, 8, 4096}, Case{60, 4, 136}, Case{512, 8, 256},
                       Case{8, 2, 64}, Case{33, 33, 8}}) {
    const auto router = random_bf16(size_t(c.E * c.H), uint32_t(c.E * 17 + c.H), -0.05f, 0.05f);
    const Buffer d_router = to_device(router);
    for (const int64_t T : {1, 2, 7, 8, 9, 31, 32, 33, 64}) {
      const kc::MoeShape s{.T = T, .E = c.E, .k = c.k, .H = c.H, .I = 8};
      const auto x = random_bf16(size_t(T * c.H), uint32_t(T * 7 + c.H), -2.0f, 2.0f);
      const Buffer dx = to_device(x);
      for (const bool norm : {false, true}) {
        const Routing want = cpu_routing(x, router, s, norm);
        for (const bool counter : {false, true}) {  // up to 8 tokens the cluster form runs unless told
          if (counter && T > 8) continue;
          const std::string label = "E " + std::to_string(c.E) + " k " + std::to_string(c.k) + " H " +
                                    std::to_string(c.H) + " T " + std::to_string(T) + (norm ? " norm" : "") +
                                    (counter ? " counter form" : "");
          const Routing got = gpu_routing(dx, d_router, s, norm, scratch, nullptr, counter);
          expect_routing_equal(got, want, label);
          SCOPED_TRACE(label);
          expect_layout(s, scratch.data(), got.experts);
        }
      }
    }
  }
}

// NaN logits (a NaN in x) take the route's sequential scan; -0, +/-Inf and ties the key order.
TEST(CudaMoeRouter, NanInfAndSignedZeroRowsEqualCpu) {
  KILN_REQUIRE_GPU();
  const int64_t T = 6, E = 40, k = 5, H = 64;
  auto router = random_bf16(size_t(E * H), 3, -0.5f, 0.5f);
  for (int64_t h = 0; h < H; ++h) {  // experts 7 and 9: the same row (a tie); 12: zero (logit +0 / -0)
    router[size_t(9 * H + h)] = router[size_t(7 * H + h)];
    router[size_t(12 * H + h)] = f32_to_bf16(0.0f);
  }
  auto x = random_bf16(size_t(T * H), 4);
  x[size_t(1 * H + 5)] = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());  // token 1: every logit NaN
  x[size_t(2 * H + 0)] = f32_to_bf16(std::numeric_limits<float>::infinity());   // token 2: +-Inf and NaN
  for (int64_t h = 0; h < H; ++h) x[size_t(3 * H + h)] = f32_to_bf16(0.0f);     // token 3: all logits 0
  const kc::MoeShape s{.T = T, .E = E, .k = k, .H = H, .I = 8};
  Buffer scratch(256, Device::cuda());
  for (const bool norm : {false, true}) {
    const Routing want = cpu_routing(x, router, s, norm);
    const Routing got = gpu_routing(to_device(x), to_device(router), s, norm, scratch);
    for (size_t i = 0; i < want.logits.size(); ++i) {
      const bool both_nan = std::isnan(bf16_to_f32(want.logits[i])) && std::isnan(bf16_to_f32(got.logits[i]));
      ASSERT_TRUE(both_nan || got.logits[i].bits == want.logits[i].bits) << "logit " << i;
    }
    ASSERT_EQ(got.experts, want.experts);
    for (size_t i = 0; i < want.weights.size(); ++i) {
      const float g = bf16_to_f32(got.weights[i]), w = bf16_to_f32(want.weights[i]);
      ASSERT_TRUE((std::isnan(g) && std::isnan(w)) || got.weights[i].bits == want.weights[i].bits)
          << "weight " << i;
    }
  }
}

// Repeated launches on one stream, eager and replayed from a graph while x changes: each equals the CPU
// (a counter left non-zero by one launch would make the next one route early or never).
TEST(CudaMoeRouter, RepeatedLaunchesAndGraphReplaysStayExact) {
  KILN_REQUIRE_GPU();
  const int64_t E = 128, k = 8, H = 2048;
  const auto router = random_bf16(size_t(E * H), 11, -0.05f, 0.05f);
  const Buffer d_router = to_device(router);
  for (const int64_t T : {int64_t(1), int64_t(8), int64_t(20), int64_t(64)}) {
    const kc::MoeShape s{.T = T, .E = E, .k = k, .H = H, .I = 8};
    Buffer x(size_t(T * H) * 2, Device::cuda()), scratch(kc::moe_scratch_bytes(s), Device::cuda());
    for (uint32_t step = 0; step < 4; ++step) {
      const auto xs = random_bf16(size_t(T * H), 50 + step, -2.0f, 2.0f);
      copy_bytes(x.data(), Device::cuda(), xs.data(), Device::cpu(), xs.size() * 2);
      expect_routing_equal(gpu_routing(x, d_router, s, true, scratch), cpu_routing(xs, router, s, true),
                           "eager T " + std::to_string(T) + " step " + std::to_string(step));
    }
    cudaStream_t stream;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int layer = 0; layer < 3; ++layer) {  // three layers' launches back to back, as a forward has
      kc::moe_router_route_launch(static_cast<const uint16_t*>(x.data()), H,
                                  static_cast<const uint16_t*>(d_router.data()), s, true, b, stream);
      kc::moe_permute_launch(s, b, stream);
    }
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KILN_CUDA_CHECK(cudaGraphDestroy(graph));
    for (uint32_t step = 0; step < 4; ++step) {
      const auto xs = random_bf16(size_t(T * H), 90 + step, -2.0f, 2.0f);
      copy_bytes(x.data(), Device::cuda(), xs.data(), Device::cpu(), xs.size() * 2);
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      const Routing want = cpu_routing(xs, router, s, true);
      const Routing got{read<bf16_t>(b.logits, T * E), read<bf16_t>(b.weights, T * k),
                        read<int32_t>(b.experts, T * k)};
      expect_routing_equal(got, want, "graph T " + std::to_string(T) + " step " + std::to_string(step));
      SCOPED_TRACE("graph T " + std::to_string(T));
      expect_layout(s, scratch.data(), got.experts);
    }
    KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
    KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// A layer's weights on the device, random (a dense router: its logits depend on the summation order), with
// the router's host copy for the CPU routing.
struct DeviceMoe {
  std::vector<bf16_t> router;
  Buffer d_router, d_gate_up, d_down;
  ops::MoeWeights w;
  DeviceMoe(int64_t E, int64_t k, int64_t H, int64_t I, uint32_t seed)
      : router(random_bf16(size_t(E * H), seed, -0.05f, 0.05f)),
        d_router(to_device(router)),
        d_gate_up(to_device(random_bf16(size_t(E * 2 * I * H), seed + 1, -0.1f, 0.1f))),
        d_down(to_device(random_bf16(size_t(E * H * I), seed + 2, -0.1f, 0.1f))) {
    w.router = Tensor(d_router.data(), DType::bf16, {E, H}, Device::cuda());
    w.gate_up = Tensor(d_gate_up.data(), DType::bf16, {E, 2 * I, H}, Device::cuda());
    w.down = Tensor(d_down.data(), DType::bf16, {E, H, I}, Device::cuda());
    w.top_k = k;
    w.norm_topk_prob = true;
  }
};

// moe_mlp (the op) routes from x bitwise as the CPU oracle does at T <= 64 (the fused router), with a
// dense router whose logits depend on the summation order.
TEST(CudaMoeRouter, MoeMlpRoutesFromXBitwise) {
  KILN_REQUIRE_GPU();
  const int64_t E = 64, k = 4, H = 512, I = 128;
  const DeviceMoe m(E, k, H, I, 21);
  const ops::MoeWeights& w = m.w;
  const std::vector<bf16_t>& router = m.router;
  for (const int64_t T : {int64_t(1), int64_t(5), int64_t(40), int64_t(64)}) {
    const kc::MoeShape s{.T = T, .E = E, .k = k, .H = H, .I = I};
    const auto x = random_bf16(size_t(T * H), uint32_t(T + 300), -2.0f, 2.0f);
    const Buffer dx = to_device(x);
    Buffer out(size_t(T * H) * 2, Device::cuda()),
        scratch(ops::cuda::moe_scratch_bytes(w, H, T), Device::cuda());
    test::poison(scratch);
    ops::cuda::moe_mlp(Tensor(dx.data(), DType::bf16, {T, H}, Device::cuda()), w,
                       Tensor(out.data(), DType::bf16, {T, H}, Device::cuda()), scratch.data(),
                       scratch.bytes());
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
    const Routing want = cpu_routing(x, router, s, true);
    expect_routing_equal(
        {read<bf16_t>(b.logits, T * E), read<bf16_t>(b.weights, T * k), read<int32_t>(b.experts, T * k)},
        want, "moe_mlp T " + std::to_string(T));
  }
}

// The router launch with the residual-norm prologue (MoeNormIn) equals add_rms_norm (the CUDA op) then the
// plain launch on its output, bitwise: the new residual, the normed rows, the logits, the routing, the
// layout.
TEST(CudaMoeRouter, NormPrologueEqualsAddRmsNormThenRouter) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t E, k, H;
  };
  for (const Case c : {Case{128, 8, 2048}, Case{128, 8, 4096}, Case{60, 4, 64}, Case{12, 2, 256}}) {
    const auto router = random_bf16(size_t(c.E * c.H), uint32_t(c.H + 5), -0.05f, 0.05f);
    const auto norm_w = random_bf16(size_t(c.H), uint32_t(c.H + 6), 0.5f, 1.5f);
    const Buffer d_router = to_device(router), d_norm_w = to_device(norm_w);
    for (const int64_t T : {1, 3, 8})
      for (const bool counter : {false, true}) {  // the cluster form (where it applies) and the counter form
        SCOPED_TRACE("E " + std::to_string(c.E) + " H " + std::to_string(c.H) + " T " + std::to_string(T) +
                     (counter ? " counter form" : ""));
        const kc::MoeShape s{.T = T, .E = c.E, .k = c.k, .H = c.H, .I = 8};
        const auto delta = random_bf16(size_t(T * c.H), uint32_t(T + 7), -1.0f, 1.0f);
        const auto residual = random_bf16(size_t(T * c.H), uint32_t(T + 8), -3.0f, 3.0f);
        const Buffer d_delta = to_device(delta);
        Buffer res_a = to_device(residual), res_b = to_device(residual);
        Buffer normed_a(size_t(T * c.H) * 2, Device::cuda()), normed_b(size_t(T * c.H) * 2, Device::cuda());
        test::poison(normed_b);
        const auto mat = [&](const Buffer& b) {
          return Tensor(b.data(), DType::bf16, {T, c.H}, Device::cuda());
        };
        ops::add_rms_norm(mat(d_delta), mat(res_a),
                          Tensor(d_norm_w.data(), DType::bf16, {c.H}, Device::cuda()), 1e-6f, mat(normed_a));
        Buffer scratch_a(256, Device::cuda()), scratch_b(kc::moe_scratch_bytes(s), Device::cuda());
        const Routing want = gpu_routing(normed_a, d_router, s, true, scratch_a);
        poison_scratch(s, scratch_b);
        const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch_b.data());
        const kc::MoeNormIn norm{.delta = static_cast<const uint16_t*>(d_delta.data()),
                                 .ds = c.H,
                                 .residual = static_cast<uint16_t*>(res_b.data()),
                                 .rs = c.H,
                                 .weight = static_cast<const uint16_t*>(d_norm_w.data()),
                                 .normed = static_cast<uint16_t*>(normed_b.data()),
                                 .ns = c.H,
                                 .eps = 1e-6f};
        kc::moe_router_route_launch(nullptr, 0, static_cast<const uint16_t*>(d_router.data()), s, true, b,
                                    nullptr, &norm, counter);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_EQ(device_bits(res_b, T * c.H), device_bits(res_a, T * c.H)) << "residual";
        ASSERT_EQ(device_bits(normed_b, T * c.H), device_bits(normed_a, T * c.H)) << "normed";
        const Routing got{read<bf16_t>(b.logits, T * c.E), read<bf16_t>(b.weights, T * c.k),
                          read<int32_t>(b.experts, T * c.k)};
        expect_routing_equal(got, want, "norm prologue");
        expect_layout(s, scratch_b.data(), got.experts);
      }
  }
}

// moe_mlp with a ResidualNorm (out aliasing delta, as the model calls it) equals add_rms_norm then moe_mlp,
// bitwise, through the prologue (T <= 8) and past it (T = 12).
TEST(CudaMoeRouter, MoeMlpWithResidualNormEqualsTheTwoOps) {
  KILN_REQUIRE_GPU();
  const int64_t E = 32, k = 4, H = 256, I = 128;
  const DeviceMoe m(E, k, H, I, 31);
  const ops::MoeWeights& w = m.w;
  const Buffer d_norm_w = to_device(random_bf16(size_t(H), 34, 0.5f, 1.5f));
  const Tensor nw(d_norm_w.data(), DType::bf16, {H}, Device::cuda());
  for (const int64_t T : {int64_t(1), int64_t(5), int64_t(8), int64_t(12)}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const auto delta = random_bf16(size_t(T * H), uint32_t(T + 40), -1.0f, 1.0f);
    const auto residual = random_bf16(size_t(T * H), uint32_t(T + 41), -3.0f, 3.0f);
    Buffer tmp_a = to_device(delta), tmp_b = to_device(delta), res_a = to_device(residual),
           res_b = to_device(residual);
    Buffer normed_a(size_t(T * H) * 2, Device::cuda()), normed_b(size_t(T * H) * 2, Device::cuda()),
        out_a(size_t(T * H) * 2, Device::cuda());
    const auto mat = [&](const Buffer& b) { return Tensor(b.data(), DType::bf16, {T, H}, Device::cuda()); };
    const int64_t bytes = ops::moe_scratch_bytes(w, H, T, Device::cuda());
    Buffer sa(size_t(bytes), Device::cuda()), sb(size_t(bytes), Device::cuda());
    const auto scr = [&](const Buffer& b) { return Tensor(b.data(), DType::u8, {bytes}, Device::cuda()); };
    ops::add_rms_norm(mat(tmp_a), mat(res_a), nw, 1e-6f, mat(normed_a));
    ops::moe_mlp(mat(normed_a), w, mat(out_a), scr(sa));
    ops::moe_mlp(ops::ResidualNorm{mat(tmp_b), mat(res_b), nw, 1e-6f, mat(normed_b)}, w, mat(tmp_b), scr(sb));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(device_bits(tmp_b, T * H), device_bits(out_a, T * H)) << "out";
    ASSERT_EQ(device_bits(res_b, T * H), device_bits(res_a, T * H)) << "residual";
  }
}

// Bad shapes are refused before anything is launched.
TEST(CudaMoeRouter, OutOfRangeShapesAreErrors) {
  KILN_REQUIRE_GPU();
  const kc::MoeBuffers b{};
  EXPECT_THROW(kc::moe_router_route_launch(nullptr, 64, nullptr, {.T = 65, .E = 8, .k = 2, .H = 64, .I = 8},
                                           true, b, nullptr),
               Error);
  EXPECT_THROW(kc::moe_router_route_launch(nullptr, 60, nullptr, {.T = 1, .E = 8, .k = 2, .H = 60, .I = 8},
                                           true, b, nullptr),
               Error);
  EXPECT_THROW(kc::moe_router_route_launch(nullptr, 64, nullptr, {.T = 1, .E = 513, .k = 2, .H = 64, .I = 8},
                                           true, b, nullptr),
               Error);
}

}  // namespace
}  // namespace kiln
