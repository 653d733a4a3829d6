// The gather GEMV's path (d) form for block-FP8 experts ("e4m3 x 16": KILN_MOE_FP8_E4M3X16, ops/cuda/moe.h;
// the contract in ops/moe.h) against its CPU oracle, ops::linear_fp8_chunk16 with 32 threads for every gate,
// up and down row (ops::moe_mlp with MoeFp8Path::chunk16). Stage by stage, bitwise: the routing; each sorted
// row's act = the oracle's gate/up rows through the CUDA silu_mul kernel; each y row = the oracle's down
// projection of the GPU's act row; out = the combine of the GPU's y rows. The whole layer bitwise the CPU op
// on every token whose silu values libm's exp gives alike (ops/moe.h: silu's exp is the one difference).
// T = 1, 2, 3, 5, 8, 17, 64 at 30B-A3B's widths (top-8 of 128) and at ragged widths (rows of 24 and 16
// chunks: idle lanes), experts no token chose (their scales NaN on the device: never read), one expert every
// token chose (16 passes of 4 rows at T = 64), an expert-parallel share; the fused down + combine bitwise the
// GEMV then the combine; a CUDA graph replayed while x and the routing change, each replay bitwise its eager
// run and the oracle; and the switch (off: path (c)'s bits, on: path (d)'s). Outputs and scratch are
// poisoned (all bits set) before every run.
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kiln/cuda_check.h"
#include "moe_fp8_layer.h"
#include "ops/activation.h"
#include "ops/cpu/moe.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
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
using test::read_device;
using test::to_device;
using test::to_host;

// Router expert e's projections in l's host copies, as block-FP8 linear weights.
ops::LinearWeight host_gate_up(const Fp8Layer& l, int64_t e) {
  const int64_t n = 2 * l.I * l.H, sb = l.gr() * l.gc();
  return {Tensor(const_cast<uint8_t*>(l.gate_up_q.data()) + e * n, DType::f8e4m3, {2 * l.I, l.H}),
          Tensor(const_cast<float*>(l.gate_up_s.data()) + e * sb, DType::f32, {l.gr(), l.gc()})};
}
ops::LinearWeight host_down(const Fp8Layer& l, int64_t e) {
  const int64_t n = l.H * l.I, sb = l.dr() * l.dc();
  return {Tensor(const_cast<uint8_t*>(l.down_q.data()) + e * n, DType::f8e4m3, {l.H, l.I}),
          Tensor(const_cast<float*>(l.down_s.data()) + e * sb, DType::f32, {l.dr(), l.dc()})};
}

// The router column of expert e in make_fp8_layer (its one power-of-two router weight).
int64_t router_column(const Fp8Layer& l, int64_t e) {
  return (e * 37 + 11) % l.H;
}

// x [T, H] with column router_column(e) set to 8 in every row: e's logit (16 or 32) tops every token's.
void choose_everywhere(const Fp8Layer& l, std::vector<bf16_t>& x, int64_t e) {
  for (size_t t = 0; t < x.size() / size_t(l.H); ++t)
    x[t * size_t(l.H) + size_t(router_column(l, e))] = f32_to_bf16(8.f);
}

// The CPU routing of x (ops/moe.h, bitwise the GPU's for make_fp8_layer's router).
struct Routing {
  std::vector<int32_t> experts;
  std::vector<bf16_t> weights;
};
Routing cpu_routing(const Fp8Layer& l, const std::vector<bf16_t>& x, int64_t T) {
  std::vector<bf16_t> logits(size_t(T * l.E));
  Routing r{std::vector<int32_t>(size_t(T * l.k)), std::vector<bf16_t>(size_t(T * l.k))};
  ops::cpu::moe_router_logits(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, l.H}),
                              Tensor(const_cast<bf16_t*>(l.router.data()), DType::bf16, {l.E, l.H}),
                              Tensor(logits.data(), DType::bf16, {T, l.E}));
  ops::moe_route(Tensor(logits.data(), DType::bf16, {T, l.E}), l.k, true,
                 Tensor(r.experts.data(), DType::i32, {T, l.k}),
                 Tensor(r.weights.data(), DType::bf16, {T, l.k}));
  return r;
}

// l's experts [begin, begin + L) on the device (L = 0: all), the scales of every expert outside `used` NaN:
// a kernel that read such an expert would write NaN. The buffers live as long as the view.
struct DeviceShare {
  Buffer gu_s, dn_s;
  ops::MoeWeights w;
  DeviceShare(const Fp8Layer& l, const std::set<int32_t>& used, int64_t begin, int64_t L) {
    std::vector<float> gs = l.gate_up_s, ds = l.down_s;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t gsb = size_t(l.gr() * l.gc()), dsb = size_t(l.dr() * l.dc());
    for (int64_t e = 0; e < l.E; ++e)
      if (!used.count(int32_t(e))) {
        std::fill(gs.begin() + ptrdiff_t(size_t(e) * gsb), gs.begin() + ptrdiff_t(size_t(e + 1) * gsb), nan);
        std::fill(ds.begin() + ptrdiff_t(size_t(e) * dsb), ds.begin() + ptrdiff_t(size_t(e + 1) * dsb), nan);
      }
    gu_s = to_device(gs);
    dn_s = to_device(ds);
    w = l.fp8(Device::cuda());
    w.gate_up_scale.data = gu_s.data();
    w.down_scale.data = dn_s.data();
    if (L > 0) w = test::expert_share(w, begin, begin + L);
  }
};

// Checks what one gather-GEMV run of l's experts [begin, begin + L) (L = 0: all) on x left behind: the
// routing, the act and y rows in `scratch` (laid out for T tokens) and out, stage by stage against the oracle
// (the header), then the whole layer against the CPU op. Returns the tokens left out of the whole-layer
// comparison (a silu value of theirs differs between libm's exp and CUDA's).
int64_t check_stages(const Fp8Layer& l, const std::vector<bf16_t>& x, int64_t T, int64_t begin, int64_t L,
                     const void* scratch, const std::vector<bf16_t>& out) {
  const int64_t E = l.E, k = l.k, H = l.H, I = l.I, end = L > 0 ? begin + L : E;
  const kc::MoeShape s{.T = T, .E = E, .k = k, .H = H, .I = I, .expert_begin = begin, .local = L};
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, const_cast<void*>(scratch));
  const auto experts = read_device<int32_t>(b.experts, T * k);
  const auto weights = read_device<bf16_t>(b.weights, T * k);
  const auto inverse = read_device<int32_t>(b.inverse, T * k);
  const auto act = read_device<bf16_t>(b.act, s.max_rows() * I);
  const auto y = read_device<bf16_t>(b.y, s.max_rows() * H);
  const Routing want = cpu_routing(l, x, T);
  EXPECT_EQ(experts, want.experts) << "routing";
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(weights[size_t(i)].bits, want.weights[size_t(i)].bits) << i;

  // The rank's pairs grouped by expert; gu holds the oracle's gate/up row of each, in that order.
  std::vector<int64_t> pair_of;  // p = t k + j, in the order of gu's rows
  std::vector<bf16_t> gu;
  for (int64_t e = begin; e < end; ++e) {
    std::vector<int64_t> ps;
    for (int64_t p = 0; p < T * k; ++p)
      if (experts[size_t(p)] == e) ps.push_back(p);
    if (ps.empty()) continue;
    const int64_t n = int64_t(ps.size());
    std::vector<bf16_t> xs, a, g(size_t(n * 2 * I)), yr(size_t(n * H));
    for (const int64_t p : ps) {
      const int64_t row = inverse[size_t(p)];
      EXPECT_GE(row, 0) << "pair " << p << " of the rank's expert " << e << " has no row";
      if (row < 0) return T;
      xs.insert(xs.end(), x.begin() + (p / k) * H, x.begin() + (p / k + 1) * H);
      a.insert(a.end(), act.begin() + row * I, act.begin() + (row + 1) * I);
    }
    ops::linear_fp8_chunk16(Tensor(xs.data(), DType::bf16, {n, H}), host_gate_up(l, e),
                            Tensor(g.data(), DType::bf16, {n, 2 * I}), 32);
    ops::linear_fp8_chunk16(Tensor(a.data(), DType::bf16, {n, I}), host_down(l, e),
                            Tensor(yr.data(), DType::bf16, {n, H}), 32);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = inverse[size_t(ps[size_t(r)])];
      for (int64_t h = 0; h < H; ++h)
        if (y[size_t(row * H + h)].bits != yr[size_t(r * H + h)].bits) {
          ADD_FAILURE() << "y row " << row << " (expert " << e << ") column " << h << ": "
                        << bf16_to_f32(y[size_t(row * H + h)]) << " vs the oracle's "
                        << bf16_to_f32(yr[size_t(r * H + h)]);
          return T;
        }
    }
    gu.insert(gu.end(), g.begin(), g.end());
    pair_of.insert(pair_of.end(), ps.begin(), ps.end());
  }
  for (int64_t p = 0; p < T * k; ++p) {
    const bool ours = experts[size_t(p)] >= begin && experts[size_t(p)] < end;
    if (!ours) {
      EXPECT_EQ(inverse[size_t(p)], -1) << "pair " << p << " of another rank's expert";
    }
  }

  // act: the oracle's gate/up rows through the CUDA silu_mul kernel (gate, up and act rounded as the GEMV's
  // epilogue rounds them), and through the CPU's silu_and_mul (libm's exp) for the whole-layer comparison.
  const int64_t R = int64_t(pair_of.size());
  std::vector<bf16_t> act_gpu_silu(size_t(R * I)), act_cpu(size_t(R * I));
  if (R > 0) {
    const Buffer dgu = to_device(gu);
    Buffer dact(size_t(R * I) * 2, Device::cuda());
    test::poison(dact);
    kc::silu_mul(dgu.data(), 2 * I, dact.data(), I, R, I, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    act_gpu_silu = to_host<bf16_t>(dact, size_t(R * I));
    ops::silu_and_mul(Tensor(gu.data(), DType::bf16, {R, 2 * I}),
                      Tensor(act_cpu.data(), DType::bf16, {R, I}));
  }
  std::vector<char> exp_differs(size_t(T), 0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t p = pair_of[size_t(r)], row = inverse[size_t(p)];
    for (int64_t i = 0; i < I; ++i) {
      const uint16_t got = act[size_t(row * I + i)].bits;
      EXPECT_EQ(got, act_gpu_silu[size_t(r * I + i)].bits) << "act row " << row << " column " << i;
      if (got != act_gpu_silu[size_t(r * I + i)].bits) return T;
      exp_differs[size_t(p / k)] |= got != act_cpu[size_t(r * I + i)].bits;
    }
  }

  // out: the combine of the GPU's y rows (fp32 from +0 in slot order, one rounding; ops/moe.h).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = inverse[size_t(t * k + j)];
        if (row >= 0)
          acc = std::fma(bf16_to_f32(y[size_t(row * H + h)]), bf16_to_f32(weights[size_t(t * k + j)]), acc);
      }
      if (out[size_t(t * H + h)].bits != f32_to_bf16(acc).bits) {
        ADD_FAILURE() << "out token " << t << " column " << h << " is not the combine of the y rows";
        return T;
      }
    }

  // The whole layer: the CPU op with path (d), bitwise on the tokens whose silu values agree.
  ops::MoeWeights hw = l.fp8(Device::cpu());
  if (L > 0) hw = test::expert_share(hw, begin, begin + L);
  std::vector<bf16_t> cpu_out(size_t(T * H));
  ops::moe_mlp(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}), hw,
               Tensor(cpu_out.data(), DType::bf16, {T, H}), ops::MoeFp8Path::chunk16);
  int64_t left_out = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (exp_differs[size_t(t)]) {
      ++left_out;
      continue;
    }
    for (int64_t h = 0; h < H; ++h)
      if (out[size_t(t * H + h)].bits != cpu_out[size_t(t * H + h)].bits) {
        ADD_FAILURE() << "token " << t << " column " << h << ": " << bf16_to_f32(out[size_t(t * H + h)])
                      << " vs the CPU op's " << bf16_to_f32(cpu_out[size_t(t * H + h)]);
        return T;
      }
  }
  return left_out;
}

// One gather-GEMV run of l's experts [begin, begin + L) on x (the switch on), then check_stages; returns the
// tokens it left out of the whole-layer comparison. force_expert >= 0: that expert chosen by every token (its
// count checked).
int64_t run_and_check(const Fp8Layer& l, int64_t T, uint32_t seed, int64_t begin = 0, int64_t L = 0,
                      int64_t force_expert = -1) {
  SCOPED_TRACE("E " + std::to_string(l.E) + " k " + std::to_string(l.k) + " H " + std::to_string(l.H) +
               " I " + std::to_string(l.I) + " T " + std::to_string(T) + " experts [" +
               std::to_string(begin) + ", " + std::to_string(L > 0 ? begin + L : l.E) + ")" +
               (force_expert >= 0 ? " expert " + std::to_string(force_expert) + " everywhere" : ""));
  std::vector<bf16_t> x = test::random_bf16(size_t(T * l.H), seed);
  if (force_expert >= 0) choose_everywhere(l, x, force_expert);
  const Routing r = cpu_routing(l, x, T);
  const std::set<int32_t> used(r.experts.begin(), r.experts.end());
  const DeviceShare d(l, used, begin, L);
  const Buffer dx = to_device(x);
  Buffer scratch(256, Device::cuda());
  const auto out = test::run_moe_gpu(d.w, dx, T, l.H, MoeExperts::gather_gemv, scratch);
  const int64_t left_out = check_stages(l, x, T, begin, L, scratch.data(), out);
  if (force_expert >= 0) {
    const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I};
    EXPECT_EQ(
        read_device<int32_t>(kc::moe_scratch_layout(s, scratch.data()).counts, l.E)[size_t(force_expert)], T);
  }
  std::printf(
      "e4m3x16 MoE E %lld H %lld I %lld T %lld: %zu experts chosen, %lld tokens left out of the "
      "whole-layer comparison\n",
      (long long)l.E, (long long)l.H, (long long)l.I, (long long)T, used.size(), (long long)left_out);
  return left_out;
}

TEST(CudaMoeFp8x16, GatherGemvStagesBitwiseTheOracle) {
  KILN_REQUIRE_GPU();
  const test::Fp8E4m3x16Scope on(true);
  const std::vector<int64_t> batches = {1, 2, 3, 5, 8, 17, 64};
  int64_t tokens = 0, left_out = 0;
  const auto check = [&](const Fp8Layer& l, int64_t T, uint32_t seed, int64_t begin = 0, int64_t L = 0,
                         int64_t force_expert = -1) {
    left_out += run_and_check(l, T, seed, begin, L, force_expert);
    tokens += T;
  };
  const Fp8Layer a3b = test::make_fp8_layer(128, 8, 2048, 768, 81);  // Qwen3-30B-A3B's widths
  for (const int64_t T : batches) check(a3b, T, uint32_t(T + 100));
  // Qwen3-235B-A22B's widths (hidden 4096: two 16-byte batches a gate_up row; down rows of 1536), 16 experts
  // of them; 5-8 tokens is where the router's launch at this hidden size was once refused.
  const Fp8Layer a22b = test::make_fp8_layer(16, 8, 4096, 1536, 87);
  for (const int64_t T : {1, 5, 8}) check(a22b, T, uint32_t(T + 600));
  // gate_up rows of 384 (24 chunks of 16: lanes 24 .. 31 idle), down rows of 256 (16 chunks).
  const Fp8Layer ragged = test::make_fp8_layer(16, 4, 384, 256, 83);
  for (const int64_t T : batches) check(ragged, T, uint32_t(T + 200));
  // 64 experts, top-2: most unused at small T (NaN scales on the device); expert 5 chosen by every token.
  const Fp8Layer sparse = test::make_fp8_layer(64, 2, 256, 128, 85);
  for (const int64_t T : batches) {
    check(sparse, T, uint32_t(T + 300));
    check(sparse, T, uint32_t(T + 400), 0, 0, 5);
    check(sparse, T, uint32_t(T + 500), 16, 16);  // an expert-parallel rank: experts [16, 32)
  }
  // A silu value moves (one bf16 ulp) only where libm's and CUDA's exp differ and the quotient sits within an
  // fp32 ulp of a bf16 rounding boundary: a few tokens in a hundred at 30B-A3B's widths (6,144 silu values a
  // token). Most tokens must meet the CPU op bitwise.
  EXPECT_LE(4 * left_out, tokens)
      << left_out << " of " << tokens
      << " tokens differ from the CPU op in a silu value (libm's exp against CUDA's)";
}

// Down + combine in one kernel (moe_experts_combine_launch, the op's path at T = 1) against the gather GEMV
// then the combine kernel, both in path (d): out and the y rows bitwise.
TEST(CudaMoeFp8x16, FusedDownCombineEqualsGemvThenCombineBitwise) {
  KILN_REQUIRE_GPU();
  const test::Fp8E4m3x16Scope on(true);
  const Fp8Layer l = test::make_fp8_layer(32, 8, 512, 256, 87);
  const ops::MoeWeights w = l.fp8(Device::cuda());
  const kc::MoeFp8Scales scales{.gate_up = w.gate_up_scale.ptr<float>(), .down = w.down_scale.ptr<float>()};
  Buffer scratch(256, Device::cuda());
  for (const int64_t T : {int64_t(1), int64_t(2), int64_t(3), int64_t(5)}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const int64_t H = l.H;
    const Buffer dx = to_device(test::random_bf16(size_t(T * H), uint32_t(T + 600)));
    test::run_moe_gpu(w, dx, T, H, MoeExperts::gather_gemv, scratch);  // the routing, in the scratch
    const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = H, .I = l.I};
    const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
    const auto* xp = static_cast<const uint16_t*>(dx.data());
    Buffer o1(size_t(T * H) * 2, Device::cuda()), o2(size_t(T * H) * 2, Device::cuda());
    test::poison(o1);
    test::poison(o2);
    KILN_CUDA_CHECK(cudaMemset(b.act, 0xff, size_t(s.max_rows() * l.I) * 2));
    KILN_CUDA_CHECK(cudaMemset(b.y, 0xff, size_t(s.max_rows() * H) * 2));
    kc::moe_experts_launch(kc::MoeExpertKernel::gather_gemv, xp, H, w.gate_up.data, w.down.data, s, b,
                           nullptr, scales);
    kc::moe_combine_launch(s, b, static_cast<uint16_t*>(o1.data()), H, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y1 = read_device<bf16_t>(b.y, s.max_rows() * H);
    KILN_CUDA_CHECK(cudaMemset(b.act, 0xff, size_t(s.max_rows() * l.I) * 2));
    KILN_CUDA_CHECK(cudaMemset(b.y, 0xff, size_t(s.max_rows() * H) * 2));
    kc::moe_experts_combine_launch(xp, H, w.gate_up.data, w.down.data, s, b,
                                   static_cast<uint16_t*>(o2.data()), H, nullptr, scales);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y2 = read_device<bf16_t>(b.y, s.max_rows() * H);
    const auto a = to_host<bf16_t>(o1, size_t(T * H)), c = to_host<bf16_t>(o2, size_t(T * H));
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(c[i].bits, a[i].bits) << "out element " << i;
    for (const int32_t r : read_device<int32_t>(b.inverse, T * l.k))
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(y2[size_t(r * H + h)].bits, y1[size_t(r * H + h)].bits) << "y row " << r << " col " << h;
  }
}

// The op (gather GEMV named) captured once in a CUDA graph and replayed while x, and so the routing, changes:
// each replay bitwise its eager run, and every run (eager and replay) stage by stage the oracle's. T = 1 runs
// the fused down + combine, T = 5 and 17 the GEMV then the combine.
TEST(CudaMoeFp8x16, GraphReplayWhileRoutingChanges) {
  KILN_REQUIRE_GPU();
  const test::Fp8E4m3x16Scope on(true);
  const Fp8Layer l = test::make_fp8_layer(64, 4, 512, 256, 89);
  const ops::MoeWeights w = l.fp8(Device::cuda());
  for (const int64_t T : {int64_t(1), int64_t(5), int64_t(17)}) {
    SCOPED_TRACE("T " + std::to_string(T));
    Buffer x(size_t(T * l.H) * 2, Device::cuda()), out(size_t(T * l.H) * 2, Device::cuda());
    Buffer scratch(ops::cuda::moe_scratch_bytes(w, l.H, T, MoeExperts::gather_gemv), Device::cuda());
    const Tensor xt(x.data(), DType::bf16, {T, l.H}, Device::cuda());
    const Tensor ot(out.data(), DType::bf16, {T, l.H}, Device::cuda());
    const auto run = [&](cudaStream_t st) {
      const kc::StreamScope scope(st);
      ops::cuda::moe_mlp(xt, w, ot, scratch.data(), scratch.bytes(), MoeExperts::gather_gemv);
    };
    uint32_t round = 0;
    const auto load = [&](uint32_t r) {
      round = r;
      test::poison(scratch);
      test::load_moe_input(x, out, size_t(T * l.H), 700 + r);
    };
    const kc::MoeShape s{.T = T, .E = l.E, .k = l.k, .H = l.H, .I = l.I};
    std::set<std::vector<int32_t>> routings;
    const auto outputs = [&] {
      const auto o = to_host<bf16_t>(out, size_t(T * l.H));
      check_stages(l, test::random_bf16(size_t(T * l.H), 700 + round), T, 0, 0, scratch.data(), o);
      routings.insert(read_device<int32_t>(kc::moe_scratch_layout(s, scratch.data()).experts, T * l.k));
      return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(out, out.bytes())};
    };
    load(0);
    ops::cuda::moe_mlp(xt, w, ot, scratch.data(), scratch.bytes(), MoeExperts::gather_gemv);  // eager first
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(test::graph_replay_mismatch(run, run, load, outputs, 5), "");
    EXPECT_GE(routings.size(), 5u) << "the routing must change between rounds for the test to mean anything";
  }
}

// The switch selects the form: off, by rows below the W8A8 threshold is the GEMV in path (c) (the BF16 GEMV
// on the dequantized experts, bitwise); on, path (d) (the gather GEMV named, under the same switch), which
// differs from path (c) on most elements.
TEST(CudaMoeFp8x16, SwitchSelectsTheForm) {
  KILN_REQUIRE_GPU();
  const Fp8Layer l = test::make_fp8_layer(32, 4, 256, 256, 93);
  const int64_t T = 3;
  ASSERT_LT(T, ops::cuda::moe_fp8_w8a8_min_tokens());
  const Buffer dx = to_device(test::random_bf16(size_t(T * l.H), 94));
  Buffer scratch(256, Device::cuda());
  const auto path_c = test::run_moe_gpu(l.dequantized_device(), dx, T, l.H, MoeExperts::gather_gemv, scratch);
  std::vector<bf16_t> off, on, named;
  {
    const test::Fp8E4m3x16Scope s(false);
    EXPECT_FALSE(kc::moe_fp8_e4m3x16());
    off = test::run_moe_gpu(l.fp8(Device::cuda()), dx, T, l.H, MoeExperts::by_rows, scratch);
  }
  {
    const test::Fp8E4m3x16Scope s(true);
    EXPECT_TRUE(kc::moe_fp8_e4m3x16());
    on = test::run_moe_gpu(l.fp8(Device::cuda()), dx, T, l.H, MoeExperts::by_rows, scratch);
    named = test::run_moe_gpu(l.fp8(Device::cuda()), dx, T, l.H, MoeExperts::gather_gemv, scratch);
  }
  int64_t differ = 0;
  for (size_t i = 0; i < off.size(); ++i) {
    ASSERT_EQ(off[i].bits, path_c[i].bits) << "switch off: path (c), element " << i;
    ASSERT_EQ(on[i].bits, named[i].bits) << "switch on: by rows runs the path (d) GEMV, element " << i;
    differ += on[i].bits != path_c[i].bits;
  }
  EXPECT_GT(2 * differ, int64_t(off.size())) << "path (d) should differ from path (c) on most elements";
}

}  // namespace
}  // namespace kiln
