// The W8A8 block-FP8 GEMM on Hopper (ops/cuda/fp8_gemm.h): the activation quantizer bitwise against the CPU
// oracle's (ops::quantize_act_fp8), special values included; the GEMM against the fp64 product of the same
// quantized operands (relative Frobenius error <= 2^-8 per row) across M 1 .. 8192, the Qwen3-4B projections
// and ragged N / K, every config, outputs poisoned before the launch; against the CPU oracle
// ops::linear_fp8(w8a8) on small shapes; replayed in a CUDA graph with changed inputs; bad arguments refused
// before anything is enqueued.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/cuda/fp8_gemm.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

constexpr double kTol = 1.0 / 256;  // ops/fp8_linear.h: relative Frobenius error <= 2^-8

// Whether this GPU runs the kernel (an sm_90 device with the sm_90a code); the tests skip elsewhere.
#define KILN_REQUIRE_FP8_GEMM()                                                                      \
  do {                                                                                               \
    KILN_REQUIRE_GPU();                                                                              \
    if (!cuda::fp8_gemm_supported(128, 128, 128, 128, 128, 128)) GTEST_SKIP() << "not an sm_90 GPU"; \
  } while (0)

// x: uniform in [-1, 1], row r scaled by 2^(r % 9 - 4) (exact in bf16), so the per-row scales differ.
std::vector<bf16_t> make_x(int64_t M, int64_t ld, uint32_t seed) {
  std::vector<bf16_t> x = test::random_bf16(size_t(M * ld), seed);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      bf16_t& v = x[size_t(r * ld + c)];
      v = f32_to_bf16(bf16_to_f32(v) * std::ldexp(1.0f, int(r % 9) - 4));
    }
  return x;
}

struct Fp8Weight {
  int64_t N = 0, K = 0, ld = 0;
  std::vector<uint8_t> q;  // [N, ld]
  std::vector<float> s;    // [ceil(N/128), ceil(K/128)]
};

// Random e4m3 codes (NaN codes replaced by 448) and scales in [2^-12, 2^-6].
Fp8Weight make_weight(int64_t N, int64_t K, int64_t ld, uint32_t seed) {
  Fp8Weight w{N, K, ld, std::vector<uint8_t>(size_t(N * ld)), {}};
  std::mt19937 rng(seed);
  for (auto& b : w.q) {
    b = uint8_t(rng() & 0xff);
    if ((b & 0x7f) == 0x7f) b = uint8_t(b - 1);
  }
  w.s.resize(size_t(ops::fp8_blocks(N) * ops::fp8_blocks(K)));
  std::uniform_real_distribution<float> e(-12.0f, -6.0f);
  for (auto& v : w.s) v = std::exp2(e(rng));
  return w;
}

// The fp64 reference of the given rows of x (test_util_cuda.h: path (a)'s operands quantized by the oracle).
std::vector<double> reference_rows(const std::vector<bf16_t>& x, int64_t ldx, const Fp8Weight& w,
                                   const std::vector<int64_t>& rows) {
  return test::w8a8_reference(test::quantize_rows(x, ldx, w.K, rows), w.q.data(), w.ld, w.s.data(), w.N, w.K);
}

// Largest relative Frobenius error of a row of got (bf16 [M, ldo]) against ref over the given rows.
double worst_row_error(const std::vector<double>& ref, const std::vector<bf16_t>& got, int64_t ldo, int64_t N,
                       const std::vector<int64_t>& rows, int64_t* worst_row = nullptr) {
  int64_t worst_i = -1;
  const double e = test::worst_row_error(
      ref, [&](int64_t i, int64_t n) { return double(bf16_to_f32(got[size_t(rows[size_t(i)] * ldo + n)])); },
      int64_t(rows.size()), N, &worst_i);
  if (worst_row && worst_i >= 0) *worst_row = rows[size_t(worst_i)];
  return e;
}

// The rows checked against fp64 for an M: all of them up to 64, else the first 8, the last 8 and 8 between.
std::vector<int64_t> checked_rows(int64_t M) {
  std::vector<int64_t> r;
  if (M <= 64) {
    for (int64_t i = 0; i < M; ++i) r.push_back(i);
    return r;
  }
  for (int64_t i = 0; i < 8; ++i) r.push_back(i);
  for (int64_t i = 1; i <= 8; ++i) r.push_back(i * M / 9 + i);
  for (int64_t i = M - 8; i < M; ++i) r.push_back(i);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

std::string config_name(const cuda::Fp8GemmConfig& c) {
  return "tile_n " + std::to_string(c.tile_n) + " stages " + std::to_string(c.stages) +
         (c.persistent ? " persistent" : " grid") + " cluster " + std::to_string(c.cluster) +
         (c.tma_store ? " tma-store" : "");
}

// The configs of one cluster size (the clusters of two have their own test: a hang there keeps the others'
// results).
std::vector<cuda::Fp8GemmConfig> configs(int cluster) {
  std::vector<cuda::Fp8GemmConfig> v;
  for (const cuda::Fp8GemmConfig& c : cuda::kFp8GemmConfigs)
    if (c.cluster == cluster) v.push_back(c);
  return v;
}

TEST(CudaFp8Gemm, QuantizerMatchesCpuBitwise) {
  KILN_REQUIRE_GPU();
  struct Shape {
    int64_t M, K, ldx;
  };
  for (const Shape sh :
       {Shape{1, 16, 16}, Shape{7, 272, 280}, Shape{129, 2560, 2560}, Shape{300, 9728, 9736}}) {
    const int64_t M = sh.M, K = sh.K, Kb = ops::fp8_blocks(K);
    std::vector<bf16_t> x = make_x(M, sh.ldx, uint32_t(M + K));
    // Special rows: zeros (scale 1e-10 / 448), NaN and Inf inside a group, huge and tiny magnitudes.
    for (int64_t c = 0; c < K; ++c) {
      x[size_t(c)] = f32_to_bf16(0.0f);
      if (M > 3) {
        x[size_t(1 * sh.ldx + c)] = f32_to_bf16(bf16_to_f32(x[size_t(1 * sh.ldx + c)]) * 1e30f);
        x[size_t(2 * sh.ldx + c)] = f32_to_bf16(bf16_to_f32(x[size_t(2 * sh.ldx + c)]) * 1e-30f);
      }
    }
    if (M > 5) {
      x[size_t(4 * sh.ldx + 3)] = bf16_t{0x7fc0};  // NaN: ignored by amax, code 0x7f
      x[size_t(5 * sh.ldx + 5)] = bf16_t{0x7f80};  // +Inf: scale Inf, codes NaN (Inf / Inf) and +-0
    }
    std::vector<int64_t> all(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) all[size_t(i)] = i;
    const test::QuantRows ref = test::quantize_rows(x, sh.ldx, K, all);

    const int64_t bytes = cuda::fp8_gemm_workspace_bytes(M, K), m_pad = cuda::fp8_act_scale_rows(M);
    Buffer dx = to_device(x), ws(size_t(bytes), Device::cuda());
    test::poison(ws);
    cuda::fp8_quantize_act(dx.data(), sh.ldx, M, K, ws.data(), bytes, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<uint8_t>(ws, size_t(bytes));
    for (int64_t i = 0; i < M * K; ++i)
      ASSERT_EQ(got[size_t(i)], ref.q[size_t(i)]) << "M " << M << " code " << i;
    const int64_t so = cuda::fp8_act_scale_offset(M, K);
    for (int64_t kb = 0; kb < Kb; ++kb)
      for (int64_t m = 0; m < m_pad; ++m) {
        float s;
        std::memcpy(&s, &got[size_t(so + (kb * m_pad + m) * 4)], 4);
        const float want = m < M ? ref.s[size_t(m * Kb + kb)] : 0.0f;
        ASSERT_EQ(f32_bits(s), f32_bits(want)) << "M " << M << " scale row " << m << " block " << kb;
      }
  }
}

// Every (M, N, K) of the grid, every config given: poisoned output, all M x N written (no NaN left) and
// nothing past N in the row stride, checked rows within 2^-8 of fp64.
void check_shapes(const std::vector<cuda::Fp8GemmConfig>& cfgs) {
  struct Proj {
    const char* name;
    int64_t N, K;
  };
  const Proj projs[] = {{"ragged", 200, 272}, {"odd N", 77, 144},       {"qkv", 6144, 2560},
                        {"o", 2560, 4096},    {"gate_up", 19456, 2560}, {"down", 2560, 9728}};
  const int64_t Ms[] = {1, 7, 64, 129, 1000, 4096, 8192};
  const int64_t max_m = 8192;
  cudaStream_t stream;
  KILN_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const Proj& pj : projs) {
    const bool small = pj.N < 1024;
    const int64_t N = pj.N, K = pj.K, ldx = small ? K + 24 : K, ldw = small ? K + 16 : K,
                  ldo = small ? ((N + 7) / 8) * 8 + 8 : N;
    const std::vector<bf16_t> x = make_x(max_m, ldx, uint32_t(N));
    const Fp8Weight w = make_weight(N, K, ldw, uint32_t(K));
    // The union of the checked rows of every M (a row's output does not depend on M: x is a prefix).
    std::vector<int64_t> rows;
    for (const int64_t M : Ms)
      for (const int64_t r : checked_rows(M)) rows.push_back(r);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    const std::vector<double> ref_all = reference_rows(x, ldx, w, rows);

    Buffer dx = to_device(x), dq = to_device(w.q), ds = to_device(w.s);
    Buffer out(size_t(max_m * ldo) * 2, Device::cuda());
    const int64_t ws_bytes = cuda::fp8_gemm_workspace_bytes(max_m, K);
    Buffer ws(size_t(ws_bytes), Device::cuda());
    for (const int64_t M : Ms) {
      ASSERT_TRUE(cuda::fp8_gemm_supported(M, N, K, ldx, ldw, ldo));
      const std::vector<int64_t> mrows = checked_rows(M);
      std::vector<double> ref;
      for (const int64_t r : mrows) {
        const size_t i = size_t(std::lower_bound(rows.begin(), rows.end(), r) - rows.begin());
        ref.insert(ref.end(), ref_all.begin() + ptrdiff_t(i * size_t(N)),
                   ref_all.begin() + ptrdiff_t((i + 1) * size_t(N)));
      }
      for (const cuda::Fp8GemmConfig& cfg : cfgs) {
        const std::string what = std::string(pj.name) + " M " + std::to_string(M) + " " + config_name(cfg);
        test::poison(out);
        cuda::fp8_gemm(dx.data(), ldx, dq.data(), ldw, static_cast<const float*>(ds.data()), out.data(), ldo,
                       M, N, K, ws.data(), ws_bytes, cfg, stream);
        KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto got = to_host<bf16_t>(out, size_t(M * ldo));
        // Counted, not asserted: one failing config must not hide the others' results.
        int64_t unwritten = 0, past = 0;
        std::string first_unwritten, first_past;
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n)
            if (std::isnan(bf16_to_f32(got[size_t(m * ldo + n)])) && unwritten++ == 0)
              first_unwritten = "[" + std::to_string(m) + ", " + std::to_string(n) + "]";
          for (int64_t n = N; n < ldo; ++n)
            if (got[size_t(m * ldo + n)].bits != 0xffff && past++ == 0)
              first_past = "[" + std::to_string(m) + ", " + std::to_string(n) + "]";
        }
        EXPECT_EQ(unwritten, 0) << what << ": elements not written, the first at " << first_unwritten;
        EXPECT_EQ(past, 0) << what << ": elements written past N, the first at " << first_past;
        if (unwritten > 0) continue;  // the poison (NaN) would make the error check meaningless
        int64_t worst_row = -1;
        const double e = worst_row_error(ref, got, ldo, N, mrows, &worst_row);
        EXPECT_LE(e, kTol) << what << ", row " << worst_row;
        EXPECT_GT(e, 0.0) << what << ": bf16 output must show its rounding";
      }
    }
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The GPU result against the CPU oracle ops::linear_fp8(w8a8) of the same bf16 x: both within 2^-8 of the
// fp64 product, so within 2^-7 of each other (relative Frobenius error over the whole output).
void check_against_oracle(const std::vector<cuda::Fp8GemmConfig>& cfgs) {
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape sh :
       {Shape{1, 2560, 4096}, Shape{7, 200, 272}, Shape{64, 2560, 4096}, Shape{129, 200, 272}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K;
    const std::vector<bf16_t> x = make_x(M, K, 5);
    const Fp8Weight w = make_weight(N, K, K, 6);
    std::vector<bf16_t> cpu(size_t(M * N));
    std::vector<uint8_t> q = w.q;
    std::vector<float> s = w.s;
    ops::linear_fp8(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {M, K}),
                    ops::LinearWeight(Tensor(q.data(), DType::f8e4m3, {N, K}),
                                      Tensor(s.data(), DType::f32, {ops::fp8_blocks(N), ops::fp8_blocks(K)})),
                    Tensor(cpu.data(), DType::bf16, {M, N}), ops::Fp8LinearPath::w8a8);
    Buffer dx = to_device(x), dq = to_device(w.q), ds = to_device(w.s),
           out(size_t(M * N) * 2, Device::cuda());
    const int64_t ws_bytes = cuda::fp8_gemm_workspace_bytes(M, K);
    Buffer ws(size_t(ws_bytes), Device::cuda());
    for (const cuda::Fp8GemmConfig& cfg : cfgs) {
      test::poison(out);
      cuda::fp8_gemm(dx.data(), K, dq.data(), K, static_cast<const float*>(ds.data()), out.data(), N, M, N, K,
                     ws.data(), ws_bytes, cfg, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<bf16_t>(out, size_t(M * N));
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double c = bf16_to_f32(cpu[i]), d = double(bf16_to_f32(got[i])) - c;
        num += d * d;
        den += c * c;
      }
      EXPECT_LE(std::sqrt(num / den), 2 * kTol) << M << "x" << N << "x" << K << " " << config_name(cfg);
    }
  }
}

// Captured once, replayed with new x and new weights written into the same buffers: each replay computes
// from the current contents (the tensor maps hold addresses, not data).
void check_graph_replay(const std::vector<cuda::Fp8GemmConfig>& cfgs) {
  const int64_t M = 300, N = 384, K = 640;
  Buffer dx(size_t(M * K) * 2, Device::cuda()), dq(size_t(N * K), Device::cuda()),
      ds(size_t(ops::fp8_blocks(N) * ops::fp8_blocks(K)) * 4, Device::cuda()),
      out(size_t(M * N) * 2, Device::cuda());
  const int64_t ws_bytes = cuda::fp8_gemm_workspace_bytes(M, K);
  Buffer ws(size_t(ws_bytes), Device::cuda());
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) rows[size_t(i)] = i;
  for (const cuda::Fp8GemmConfig& cfg : cfgs) {
    cudaStream_t stream;
    KILN_CUDA_CHECK(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::fp8_gemm(dx.data(), K, dq.data(), K, static_cast<const float*>(ds.data()), out.data(), N, M, N, K,
                   ws.data(), ws_bytes, cfg, stream);
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (uint32_t round = 0; round < 3; ++round) {
      const std::vector<bf16_t> x = make_x(M, K, 100 + round);
      const Fp8Weight w = make_weight(N, K, K, 200 + round);
      copy_bytes(dx.data(), Device::cuda(), x.data(), Device::cpu(), x.size() * 2);
      copy_bytes(dq.data(), Device::cuda(), w.q.data(), Device::cpu(), w.q.size());
      copy_bytes(ds.data(), Device::cuda(), w.s.data(), Device::cpu(), w.s.size() * 4);
      test::poison(out);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      const auto got = to_host<bf16_t>(out, size_t(M * N));
      const double e = worst_row_error(reference_rows(x, K, w, rows), got, N, N, rows);
      EXPECT_LE(e, kTol) << "replay " << round << " " << config_name(cfg);
    }
    KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
    KILN_CUDA_CHECK(cudaGraphDestroy(graph));
    KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

TEST(CudaFp8Gemm, MatchesFp64ReferenceAcrossShapesAndConfigs) {
  KILN_REQUIRE_FP8_GEMM();
  check_shapes(configs(1));
}

TEST(CudaFp8Gemm, AgreesWithCpuOracle) {
  KILN_REQUIRE_FP8_GEMM();
  check_against_oracle(configs(1));
}

TEST(CudaFp8Gemm, GraphReplayFollowsChangedInputs) {
  KILN_REQUIRE_FP8_GEMM();
  check_graph_replay(configs(1));
}

// The clusters of two (weight tiles multicast): the same three checks.
TEST(CudaFp8GemmCluster, MatchesFp64ReferenceOracleAndGraphReplay) {
  KILN_REQUIRE_FP8_GEMM();
  const auto cfgs = configs(2);
  ASSERT_FALSE(cfgs.empty());
  check_shapes(cfgs);
  check_against_oracle(cfgs);
  check_graph_replay(cfgs);
}

// Refused shapes and arguments: fp8_gemm_supported says no, fp8_gemm throws naming the limit, and the output
// keeps its poison (nothing was enqueued).
TEST(CudaFp8Gemm, BadArgumentsAreErrorsThatWriteNothing) {
  KILN_REQUIRE_FP8_GEMM();
  const int64_t M = 4, N = 64, K = 128;
  EXPECT_FALSE(cuda::fp8_gemm_supported(M, N, 100, 128, 128, N));  // K not a multiple of 16
  EXPECT_FALSE(cuda::fp8_gemm_supported(M, N, K, 132, 128, N));    // ldx not a multiple of 8
  EXPECT_FALSE(cuda::fp8_gemm_supported(M, N, K, K, 136, N));      // ldw not a multiple of 16
  EXPECT_FALSE(cuda::fp8_gemm_supported(M, N, K, K, K, 60));       // ldo < N
  EXPECT_FALSE(cuda::fp8_gemm_supported(0, N, K, K, K, N));        // no rows
  Buffer dx(size_t(M * K) * 2, Device::cuda()), dq(size_t(N * K), Device::cuda()), ds(64, Device::cuda()),
      out(size_t(M * N) * 2, Device::cuda());
  const int64_t ws_bytes = cuda::fp8_gemm_workspace_bytes(M, K);
  Buffer ws(size_t(ws_bytes), Device::cuda());
  test::poison(out);
  const float* s = static_cast<const float*>(ds.data());
  const auto expect_error = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        cuda::fp8_gemm(dx.data(), K, dq.data(), K, s, out.data(), N, M, N, 100, ws.data(), ws_bytes, {},
                       nullptr);
      },
      "K = 100");
  expect_error(
      [&] {
        cuda::fp8_gemm(dx.data(), K, dq.data(), K, s, out.data(), N, M, N, K, ws.data(), ws_bytes - 1, {},
                       nullptr);
      },
      "workspace");
  expect_error(
      [&] {
        cuda::fp8_gemm(dx.data(), K, dq.data(), K, s, out.data(), N, M, N, K, ws.data(), ws_bytes,
                       {96, 6, true}, nullptr);
      },
      "tile_n 96");
  expect_error(
      [&] {
        cuda::fp8_gemm(static_cast<const char*>(dx.data()) + 2, K, dq.data(), K, s, out.data(), N, M, N, K,
                       ws.data(), ws_bytes, {}, nullptr);
      },
      "aligned");
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  for (const bf16_t v : to_host<bf16_t>(out, size_t(M * N))) ASSERT_EQ(v.bits, 0xffff);
}

}  // namespace
}  // namespace kiln
