// The GEMV family on block-FP8 weights (ops/cuda/gemv.h: "Block-FP8 weights"): with every config, M = 1..8,
// N ragged (not a multiple of 8 or of 128) and K a multiple of 8 but not of 128, each form on the e4m3
// weight is bitwise the same form on dequantize_fp8's bf16 weight: the plain GEMV (bf16, f32 and silu_mul
// epilogues, strided rows), the add + RMSNorm epilogue (tmp, residual, normed), the residual-norm prologue
// (out, residual). Every output is poisoned (all bits set) before each run and compared in full, padding
// included. Then a CUDA graph of FP8 GEMVs (PDL on) replayed with changing inputs against eager runs, and the
// FP8 argument checks (alignment of the e4m3 data and of the scales) before any launch; the engine's FP8
// dispatch (the tuned FP8 GEMV, else dequantize into scratch then the bf16 path: bitwise the bf16 run on the
// dequantized weight either way; a scratch that would grow inside a graph capture refused) and the tactic
// cache's weight-format field.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include <cmath>
#include <fstream>

#include "common/test_support.h"
#include "fp8_weight_util.h"
#include "gemv_test_util.h"
#include "kiln/cuda_check.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using cuda::GemvConfig;
using cuda::GemvEpilogue;
using cuda::GemvWeight;
using test::Fp8TestWeight;
using test::poison;
using test::random_bf16;
using test::to_device;
using test::to_host;

constexpr float kEps = 1e-6f;

constexpr auto run_plain = test::run_gemv;

using Shape = test::WeightShape;
// Ragged N (37, 1001, 301: neither multiples of 8 nor of 128; 6144: the 4B QKV rows), K multiples of 8 but
// not of 128 (200, 1000, 2056, 2568), one strided W, one K of a single chunk.
const Shape kPlainShapes[] = {{"37x200", 37, 200, 0},
                              {"1001x1000", 1001, 1000, 0},
                              {"301x2056 ld", 301, 2056, 2072},
                              {"6144x2568", 6144, 2568, 0},
                              {"5x8", 5, 8, 0}};

TEST(CudaGemvFp8, PlainEpiloguesBitwiseTheBf16GemvOnDequantizedWeights) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 100;
  for (const Shape& s : kPlainShapes) {
    const Fp8TestWeight w(s.n, s.k, ++seed, s.ld);
    const int64_t ldx = s.k + 8;
    const Buffer x = to_device(random_bf16(size_t(8 * ldx), ++seed));
    Buffer out_a(size_t(8 * s.n) * 4, Device::cuda()), out_b(size_t(8 * s.n) * 4, Device::cuda());
    for (const GemvEpilogue epi : {GemvEpilogue::bf16, GemvEpilogue::f32, GemvEpilogue::silu_mul}) {
      // silu_mul takes an even N (2I): the first N - N % 2 rows.
      const int64_t n = epi == GemvEpilogue::silu_mul ? s.n / 2 * 2 : s.n;
      if (n == 0) continue;
      const int64_t ldo = epi == GemvEpilogue::silu_mul ? n / 2 : n;
      for (const GemvConfig cfg : cuda::kGemvConfigs)
        for (int64_t m = 1; m <= cuda::kGemvMaxM; ++m) {
          const auto got = run_plain(x, ldx, w.fp8(), out_a, ldo, m, n, s.k, epi, cfg);
          const auto want = run_plain(x, ldx, w.bf16(), out_b, ldo, m, n, s.k, epi, cfg);
          ASSERT_EQ(got, want) << s.name << " epilogue " << int(epi) << " M " << m << " "
                               << test::gemv_config_name(cfg);
        }
    }
  }
}

TEST(CudaGemvFp8, AddRmsNormBitwiseTheBf16FormOnDequantizedWeights) {
  KILN_REQUIRE_GPU();
  // N a multiple of 8 (the norm's chunks) but not of 128; K not a multiple of 128.
  const Shape shapes[] = {
      {"136x200", 136, 200, 0}, {"1000x1032", 1000, 1032, 0}, {"2568x4104", 2568, 4104, 0}};
  uint32_t seed = 200;
  for (const Shape& s : shapes) {
    const Fp8TestWeight w(s.n, s.k, ++seed);
    const Buffer x = to_device(random_bf16(size_t(8 * s.k), ++seed));
    const Buffer res0 = to_device(random_bf16(size_t(8 * s.n), ++seed, -4.0f, 4.0f));
    const Buffer nw = to_device(random_bf16(size_t(s.n), ++seed, 0.5f, 1.5f));
    Buffer tmp(size_t(8 * s.n) * 2, Device::cuda()), res(res0.bytes(), Device::cuda()),
        normed(size_t(8 * s.n) * 2, Device::cuda());
    const auto run = [&](const GemvWeight& wt, int64_t m, GemvConfig cfg) {
      poison(tmp);
      poison(normed);
      KILN_CUDA_CHECK(cudaMemcpy(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice));
      cuda::gemv_add_rms_norm(x.data(), s.k, wt, tmp.data(), s.n, res.data(), s.n, nw.data(), normed.data(),
                              s.n, m, s.n, s.k, kEps, cfg, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(tmp, tmp.bytes()),
                                               to_host<uint8_t>(res, res.bytes()),
                                               to_host<uint8_t>(normed, normed.bytes())};
    };
    for (const GemvConfig cfg : test::fusable_gemv_configs())
      for (int64_t m = 1; m <= cuda::kGemvMaxM; ++m)
        ASSERT_EQ(run(w.fp8(), m, cfg), run(w.bf16(), m, cfg))
            << s.name << " M " << m << " " << test::gemv_config_name(cfg);
  }
}

TEST(CudaGemvFp8, NormInBitwiseTheBf16FormOnDequantizedWeights) {
  KILN_REQUIRE_GPU();
  struct Case {
    Shape s;
    GemvEpilogue epi;
  };
  // The 4B gate_up rows with K ragged, an odd QKV-like N, and K 4104 (prologue rows past 48 KB at M = 8).
  const Case cases[] = {{{"1001x1032", 1001, 1032, 0}, GemvEpilogue::bf16},
                        {{"gate_up 2000x2568", 2000, 2568, 0}, GemvEpilogue::silu_mul},
                        {{"300x4104", 300, 4104, 0}, GemvEpilogue::f32}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    const Shape& s = c.s;
    const Fp8TestWeight w(s.n, s.k, ++seed);
    const Buffer delta = to_device(random_bf16(size_t(8 * s.k), ++seed, -2.0f, 2.0f));
    const Buffer res0 = to_device(random_bf16(size_t(8 * s.k), ++seed, -4.0f, 4.0f));
    const Buffer nw = to_device(random_bf16(size_t(s.k), ++seed, 0.5f, 1.5f));
    const int64_t cols = c.epi == GemvEpilogue::silu_mul ? s.n / 2 : s.n;
    Buffer out(size_t(8 * cols) * 4, Device::cuda()), res(res0.bytes(), Device::cuda());
    const auto run = [&](const GemvWeight& wt, int64_t m, GemvConfig cfg, int groups) {
      poison(out);
      KILN_CUDA_CHECK(cudaMemcpy(res.data(), res0.data(), res.bytes(), cudaMemcpyDeviceToDevice));
      cuda::gemv_norm_in(delta.data(), s.k, res.data(), s.k, nw.data(), kEps, wt, out.data(), cols, m, s.n,
                         s.k, c.epi, cfg, nullptr, false, groups);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(out, out.bytes()),
                                               to_host<uint8_t>(res, res.bytes())};
    };
    for (const GemvConfig cfg : test::fusable_gemv_configs())
      for (int64_t m = 1; m <= cuda::kGemvMaxM; ++m)
        for (const int groups : {0, 3}) {
          ASSERT_EQ(run(w.fp8(), m, cfg, groups), run(w.bf16(), m, cfg, groups))
              << s.name << " M " << m << " groups " << groups << " " << test::gemv_config_name(cfg);
        }
  }
}

// A decode-like chain captured once with PDL: norm-in QKV-like GEMV, a gate_up silu_mul GEMV on its output,
// a down GEMV with the add + RMSNorm epilogue; replayed with fresh inputs copied into the captured buffers,
// each replay against the same chain run eagerly on the dequantized weights.
TEST(CudaGemvFp8, GraphReplaysWithChangingInputs) {
  KILN_REQUIRE_GPU();
  const int64_t M = 5, H = 1032, I = 1496;
  const Fp8TestWeight w_in(H, H, 401), w_gu(2 * I, H, 402), w_down(H, I, 403);
  const Buffer nw = to_device(random_bf16(size_t(H), 404, 0.5f, 1.5f));
  Buffer delta(size_t(M * H) * 2, Device::cuda()), res(size_t(M * H) * 2, Device::cuda()),
      h1(size_t(M * H) * 2, Device::cuda()), act(size_t(M * I) * 2, Device::cuda()),
      tmp(size_t(M * H) * 2, Device::cuda()), normed(size_t(M * H) * 2, Device::cuda());
  const GemvConfig tc{8, true}, fma{4, false};
  const auto chain = [&](bool fp8, cudaStream_t st) {
    cuda::gemv_norm_in(delta.data(), H, res.data(), H, nw.data(), kEps, fp8 ? w_in.fp8() : w_in.bf16(),
                       h1.data(), H, M, H, H, GemvEpilogue::bf16, tc, st, true);
    cuda::gemv(h1.data(), H, fp8 ? w_gu.fp8() : w_gu.bf16(), act.data(), I, M, 2 * I, H,
               GemvEpilogue::silu_mul, fma, st, true);
    cuda::gemv_add_rms_norm(act.data(), I, fp8 ? w_down.fp8() : w_down.bf16(), tmp.data(), H, res.data(), H,
                            nw.data(), normed.data(), H, M, H, I, kEps, tc, st, true);
  };
  const auto outputs = [&] {
    std::vector<std::vector<uint8_t>> v;
    for (const Buffer* b : {&res, &h1, &act, &tmp, &normed}) v.push_back(to_host<uint8_t>(*b, b->bytes()));
    return v;
  };
  const auto load = [&](uint32_t r) {
    const auto d = random_bf16(size_t(M * H), 500 + r, -2.0f, 2.0f), r0 = random_bf16(size_t(M * H), 600 + r);
    copy_bytes(delta.data(), Device::cuda(), d.data(), Device::cpu(), d.size() * 2);
    copy_bytes(res.data(), Device::cuda(), r0.data(), Device::cpu(), r0.size() * 2);
    for (const Buffer* b : {&h1, &act, &tmp, &normed}) poison(*b);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  };
  EXPECT_EQ(test::graph_replay_mismatch([&](cudaStream_t st) { chain(true, st); },
                                        [&](cudaStream_t st) { chain(false, st); }, load, outputs),
            "");
}

// The FP8 weight's own checks: e4m3 data 8-byte aligned, scales 4-byte aligned (host only: nothing is
// launched, so this runs without a GPU).
TEST(CudaGemvFp8, MisalignedFp8WeightThrowsBeforeLaunch) {
  alignas(16) static uint8_t buf[4096];
  const GemvWeight ok{buf, 64, reinterpret_cast<const float*>(buf + 1024)};
  const GemvWeight bad_data{buf + 4, 64, reinterpret_cast<const float*>(buf + 1024)};
  const GemvWeight bad_scale{buf, 64, reinterpret_cast<const float*>(buf + 1026)};
  void* x = buf + 2048;
  void* out = buf + 3072;
  const GemvConfig cfg{4, false};
  EXPECT_NO_THROW(cuda::gemv(x, 64, ok, out, 8, 0, 8, 64, GemvEpilogue::bf16, cfg, nullptr));  // m == 0
  EXPECT_THROW(cuda::gemv(x, 64, bad_data, out, 8, 1, 8, 64, GemvEpilogue::bf16, cfg, nullptr), Error);
  EXPECT_THROW(cuda::gemv(x, 64, bad_scale, out, 8, 1, 8, 64, GemvEpilogue::bf16, cfg, nullptr), Error);
  EXPECT_THROW(cuda::gemv_norm_in(x, 64, out, 64, x, kEps, bad_data, out, 8, 1, 8, 64, GemvEpilogue::bf16,
                                  cfg, nullptr),
               Error);
  EXPECT_THROW(
      cuda::gemv_add_rms_norm(x, 64, bad_scale, out, 8, out, 8, x, out, 8, 1, 8, 64, kEps, cfg, nullptr),
      Error);
}

// The tactic line's out field carries the weight format (":e4m3"); a line without it is a bf16 weight's (v2
// files); an FP8 weight's tactic is a GEMV. Host only.
TEST(CudaGemvFp8, TacticLineCarriesTheWeightFormat) {
  const cuda::GemmShape s{4, 6144, 2560, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv = GemvConfig{8, true};
  t.gemv_norm_in = true;
  t.us = 6.5f;
  t.describe = "kiln-gemv-tc warps 8 rows 8 +norm-in";
  const std::string line = cuda::format_tactic_line(s, t);
  EXPECT_EQ(line, "4 6144 2560 bf16:e4m3 6.5 gemv 8 1 1 0 0 0 0 0 # kiln-gemv-tc warps 8 rows 8 +norm-in");
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2));
  EXPECT_EQ(s2, s);
  EXPECT_EQ(t2.gemv, t.gemv);
  EXPECT_TRUE(t2.gemv_norm_in);
  ASSERT_TRUE(cuda::parse_tactic_line("4 6144 2560 bf16 6.5 gemv 8 1 1 0 0 0 0 0 # v2", s2, t2));
  EXPECT_EQ(s2.weight, cuda::GemmWeight::bf16);
  EXPECT_FALSE(cuda::parse_tactic_line("4 6144 2560 bf16:e4m3 6.5 lt 1 2 3 4 5 6 7 8 # lt", s2, t2));
  EXPECT_FALSE(cuda::parse_tactic_line("4 6144 2560 bf16:e5m2 6.5 gemv 8 1 1 0 0 0 0 0 # e5m2", s2, t2));
  // The FP8 shapes: the four projections at every M bucket <= 8, beside the bf16 ones.
  const auto plain = cuda::qwen3_gemm_shapes(1024, 2048, 1024, 3072, 151936, 64, 2);
  const auto fp8 = cuda::qwen3_gemm_shapes(1024, 2048, 1024, 3072, 151936, 64, 2, true);
  EXPECT_EQ(fp8.size(), plain.size() + 4 * 7);  // M buckets 1 .. 64
  // The W8A8 GEMM's tactic: its config in words 0-4; only for an FP8 weight, only a known config.
  cuda::GemmTactic f;
  f.kind = cuda::GemmKind::fp8gemm;
  f.fp8gemm = cuda::kFp8GemmConfigs[2];
  f.us = 40.0f;
  f.describe = "w8a8";
  const cuda::GemmShape s16{16, 6144, 2560, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  const std::string fline = cuda::format_tactic_line(s16, f);
  ASSERT_TRUE(cuda::parse_tactic_line(fline, s2, t2)) << fline;
  EXPECT_EQ(s2, s16);
  EXPECT_EQ(t2.kind, cuda::GemmKind::fp8gemm);
  EXPECT_EQ(t2.fp8gemm, cuda::kFp8GemmConfigs[2]);
  EXPECT_EQ(cuda::format_tactic_line(s2, t2), fline);
  EXPECT_FALSE(
      cuda::parse_tactic_line("16 6144 2560 bf16 40 fp8gemm 80 6 1 1 0 0 0 0 # bf16 weight", s2, t2));
  EXPECT_FALSE(
      cuda::parse_tactic_line("16 6144 2560 bf16:e4m3 40 fp8gemm 60 6 1 1 0 0 0 0 # tile 96", s2, t2));
}

TEST(CudaGemvFp8, EngineRunsTheFp8GemvOrTheScratchPathBitwise) {
  KILN_REQUIRE_GPU();
  const int64_t N = 1001, K = 1032;
  const Fp8TestWeight w(N, K, 700);
  const Buffer x = to_device(random_bf16(size_t(16 * K), 701));
  Buffer a(size_t(16 * N) * 2, Device::cuda()), b(size_t(16 * N) * 2, Device::cuda());
  cuda::GemmEngine eng;
  const std::string path = (test_support::process_scratch_dir("cuda_gemv_fp8") / "tactics.txt").string();
  test::write_gemv_cache(
      eng, path, {{{4, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8}, GemvConfig{4, true}, false}});
  ASSERT_TRUE(eng.load(path));
  const auto run = [&](const GemvWeight& wt, const Buffer& out, int64_t m) {
    poison(out);
    eng.run(x.data(), K, wt, out.data(), N, m, N, K, cuda::GemmOut::bf16, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host<uint8_t>(out, out.bytes());
  };
  // M = 3 (bucket 4): the tuned FP8 GEMV, bitwise the bf16 GEMV with that config on the dequantized weight.
  const auto g = run(w.fp8(), a, 3);
  EXPECT_EQ(eng.gemv_dispatches(), 1);
  EXPECT_EQ(eng.fp8_dequant_dispatches(), 0);
  EXPECT_EQ(g, run_plain(x, K, w.bf16(), b, N, 3, N, K, GemvEpilogue::bf16, GemvConfig{4, true}));
  // M = 1 (no FP8 tactic) and M = 16: dequantize into scratch, then the bf16 path (cuBLASLt's heuristic),
  // bitwise the bf16 weight's run.
  for (const int64_t m : {1, 16}) {
    const int64_t before = eng.fp8_dequant_dispatches();
    const auto got = run(w.fp8(), a, m);
    EXPECT_EQ(eng.fp8_dequant_dispatches(), before + 1) << "M " << m;
    EXPECT_EQ(got, run(w.bf16(), b, m)) << "M " << m;
  }
  // A scratch that would have to grow inside a graph capture is refused, naming the fix.
  const Fp8TestWeight big(2 * N, 2 * K, 702);
  const Buffer xb = to_device(random_bf16(size_t(16 * 2 * K), 703));
  Buffer ob(size_t(16 * 2 * N) * 2, Device::cuda());
  cudaStream_t st;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  try {
    eng.run(xb.data(), 2 * K, big.fp8(), ob.data(), 2 * N, 16, 2 * N, 2 * K, cuda::GemmOut::bf16, st);
    ADD_FAILURE() << "the scratch grew inside a capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reserve_fp8_dequant"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(st, &graph);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  // Reserved first, the captured graph replays the scratch path correctly.
  eng.reserve_fp8_dequant(2 * N * 2 * K);
  eng.run(xb.data(), 2 * K, big.fp8(), ob.data(), 2 * N, 16, 2 * N, 2 * K, cuda::GemmOut::bf16, st);  // plans
  KILN_CUDA_CHECK(cudaStreamSynchronize(st));
  KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  eng.run(xb.data(), 2 * K, big.fp8(), ob.data(), 2 * N, 16, 2 * N, 2 * K, cuda::GemmOut::bf16, st);
  KILN_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  poison(ob);
  KILN_CUDA_CHECK(cudaGraphLaunch(exec, st));
  KILN_CUDA_CHECK(cudaStreamSynchronize(st));
  const auto replayed = to_host<uint8_t>(ob, ob.bytes());
  poison(ob);
  eng.run(xb.data(), 2 * K, big.bf16(), ob.data(), 2 * N, 16, 2 * N, 2 * K, cuda::GemmOut::bf16, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(replayed, to_host<uint8_t>(ob, ob.bytes()));
  KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
  KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
}

// GemmEngine::run on an FP8 weight at M = 16, 64, 1000 with W8A8 tactics, and at M = 1500 and 100, whose
// buckets (2048, 128) have none: the nearest tuned bucket below lends its W8A8 tactic (serving chunks above
// the startup tuner's M = 512). The W8A8 GEMM runs (its counter moves, the scratch path's does not) and
// matches the CPU oracle ops::linear_fp8(w8a8) within 2^-8 (relative Frobenius error; N ragged against 128,
// K a multiple of 16 but not of 128). M = 5 (a GEMV bucket, untuned) borrows nothing: the scratch path.
TEST(CudaGemvFp8, EngineRunsTheW8a8GemmWhereTuned) {
  KILN_REQUIRE_GPU();
  const int64_t N = 776, K = 1040;
  if (!cuda::fp8_gemm_supported(16, N, K, K, K, N)) GTEST_SKIP() << "fp8_gemm does not run on this GPU";
  Fp8TestWeight w(N, K, 800);
  cuda::GemmEngine eng;
  const std::string path = (test_support::process_scratch_dir("cuda_gemv_fp8") / "w8a8.txt").string();
  test::write_w8a8_cache(eng, path,
                         {{16, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8},
                          {64, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8},
                          {1024, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8}});
  ASSERT_TRUE(eng.load(path));
  {
    const Buffer dx = to_device(random_bf16(size_t(5 * K), 799));
    Buffer out(size_t(5 * N) * 2, Device::cuda());
    const int64_t gemm_before = eng.fp8_gemm_dispatches(), scratch_before = eng.fp8_dequant_dispatches();
    eng.run(dx.data(), K, w.fp8(), out.data(), N, 5, N, K, cuda::GemmOut::bf16, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(eng.fp8_gemm_dispatches(), gemm_before);
    EXPECT_EQ(eng.fp8_dequant_dispatches(), scratch_before + 1);
  }
  for (const int64_t M : {16, 64, 1000, 1500, 100}) {
    const auto x = random_bf16(size_t(M * K), uint32_t(801 + M));
    std::vector<bf16_t> cpu(size_t(M * N));
    ops::linear_fp8(
        Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {M, K}),
        ops::LinearWeight(Tensor(w.q.data(), DType::f8e4m3, {N, K}),
                          Tensor(w.s.data(), DType::f32, {ops::fp8_blocks(N), ops::fp8_blocks(K)})),
        Tensor(cpu.data(), DType::bf16, {M, N}), ops::Fp8LinearPath::w8a8);
    const Buffer dx = to_device(x);
    Buffer out(size_t(M * N) * 2, Device::cuda());
    poison(out);
    const int64_t gemm_before = eng.fp8_gemm_dispatches(), scratch_before = eng.fp8_dequant_dispatches();
    eng.run(dx.data(), K, w.fp8(), out.data(), N, M, N, K, cuda::GemmOut::bf16, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(eng.fp8_gemm_dispatches(), gemm_before + 1) << "M " << M;
    EXPECT_EQ(eng.fp8_dequant_dispatches(), scratch_before) << "M " << M;
    const auto got = to_host<bf16_t>(out, size_t(M * N));
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double c = bf16_to_f32(cpu[i]), d = double(bf16_to_f32(got[i])) - c;
      num += d * d;
      den += c * c;
    }
    EXPECT_LE(std::sqrt(num / den), 1.0 / 256) << "M " << M;  // NaN (an unwritten element) fails too
  }
}

}  // namespace
}  // namespace kiln
