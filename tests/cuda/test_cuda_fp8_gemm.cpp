// The W8A8 block-FP8 GEMM on Hopper (ops/cuda/fp8_gemm.h): the activation quantizer bitwise against the CPU
// oracle's (ops::quantize_act_fp8), special values included; the GEMM against the fp64 product of the same
// quantized operands (relative Frobenius error <= 2^-8 per row) across M 1 .. 8192, the Qwen3-4B projections
// and ragged N / K, every config, outputs poisoned before the launch; against the CPU oracle
// ops::linear_fp8(w8a8) on small shapes; replayed in a CUDA graph with changed inputs (bitwise the eager
// run); bad arguments refused before anything is enqueued. The split-K configs (CudaFp8GemmSplitK) at M 1 ..
// 200 with poisoned partials, deterministic, the clamped splits bitwise the unsplit kernel, the prequantized
// entry, the tactic cache's split word and GemmEngine running a split tactic.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/cuda/fp8_gemm.h"
#include "ops/cuda/gemm.h"
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
         (c.tma_store ? " tma-store" : "") + (c.split_k > 1 ? " split_k " + std::to_string(c.split_k) : "");
}

// The unsplit configs of one cluster size (the clusters of two have their own test: a hang there keeps the
// others' results; the split-K configs theirs, at the M they are for).
std::vector<cuda::Fp8GemmConfig> configs(int cluster) {
  std::vector<cuda::Fp8GemmConfig> v;
  for (const cuda::Fp8GemmConfig& c : cuda::kFp8GemmConfigs)
    if (c.cluster == cluster && c.split_k == 1) v.push_back(c);
  return v;
}

// The split-K configs.
std::vector<cuda::Fp8GemmConfig> split_configs() {
  std::vector<cuda::Fp8GemmConfig> v;
  for (const cuda::Fp8GemmConfig& c : cuda::kFp8GemmConfigs)
    if (c.split_k > 1) v.push_back(c);
  return v;
}

// The config with the same kernel and no split.
cuda::Fp8GemmConfig unsplit(cuda::Fp8GemmConfig c) {
  c.split_k = 1;
  return c;
}

// Workspace bytes every config of cfgs needs for M x N x K (the quantized input, the largest split's
// partials).
int64_t workspace_for(const std::vector<cuda::Fp8GemmConfig>& cfgs, int64_t M, int64_t N, int64_t K) {
  int64_t b = cuda::fp8_gemm_workspace_bytes(M, K);
  for (const cuda::Fp8GemmConfig& c : cfgs) b = std::max(b, cuda::fp8_gemm_workspace_bytes(M, N, K, c));
  return b;
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

struct Proj {
  const char* name;
  int64_t N, K;
};
const std::vector<Proj> kProjs = {{"ragged", 200, 272}, {"odd N", 77, 144},       {"qkv", 6144, 2560},
                                  {"o", 2560, 4096},    {"gate_up", 19456, 2560}, {"down", 2560, 9728}};

// Every (M, N, K) of the grid, every config given: poisoned output and workspace (a split's partial tiles
// NaN until written), all M x N written (no NaN left) and nothing past N in the row stride, checked rows
// within 2^-8 of fp64.
void check_grid(const std::vector<cuda::Fp8GemmConfig>& cfgs, const std::vector<Proj>& projs,
                const std::vector<int64_t>& Ms) {
  const int64_t max_m = *std::max_element(Ms.begin(), Ms.end());
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
    int64_t ws_bytes = 0;
    for (const int64_t M : Ms) ws_bytes = std::max(ws_bytes, workspace_for(cfgs, M, N, K));
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
        test::poison(ws);
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

void check_shapes(const std::vector<cuda::Fp8GemmConfig>& cfgs) {
  check_grid(cfgs, kProjs, {1, 7, 64, 129, 1000, 4096, 8192});
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
    const int64_t ws_bytes = workspace_for(cfgs, M, N, K);
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
// from the current contents (the tensor maps hold addresses, not data), bitwise the eager call on them.
void check_graph_replay(const std::vector<cuda::Fp8GemmConfig>& cfgs) {
  const int64_t M = 300, N = 384, K = 640;
  Buffer dx(size_t(M * K) * 2, Device::cuda()), dq(size_t(N * K), Device::cuda()),
      ds(size_t(ops::fp8_blocks(N) * ops::fp8_blocks(K)) * 4, Device::cuda()),
      out(size_t(M * N) * 2, Device::cuda()), eager(size_t(M * N) * 2, Device::cuda());
  const int64_t ws_bytes = workspace_for(cfgs, M, N, K);
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
      test::poison(eager);
      test::poison(ws);
      cuda::fp8_gemm(dx.data(), K, dq.data(), K, static_cast<const float*>(ds.data()), eager.data(), N, M, N,
                     K, ws.data(), ws_bytes, cfg, stream);
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_EQ(to_host<uint8_t>(eager, eager.bytes()), to_host<uint8_t>(out, out.bytes()))
          << "replay " << round << " against the eager call, " << config_name(cfg);
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

// Split-K (fp8_gemm.h): every split config at the M it is for (1 .. 128, and 200: two M tiles) on the
// Qwen3-4B projections and ragged shapes (K 272 and 1040: a last K block of 16, fewer K blocks than some
// splits; odd N), partials poisoned: within 2^-8 of fp64 per checked row, every element written, nothing past
// N.
TEST(CudaFp8GemmSplitK, MatchesFp64ReferenceAtSmallM) {
  KILN_REQUIRE_FP8_GEMM();
  const auto cfgs = split_configs();
  ASSERT_FALSE(cfgs.empty());
  std::vector<Proj> projs = kProjs;
  projs.push_back({"ragged K", 320, 1040});
  check_grid(cfgs, projs, {1, 16, 32, 64, 128, 200});
}

TEST(CudaFp8GemmSplitK, AgreesWithCpuOracleAndGraphReplay) {
  KILN_REQUIRE_FP8_GEMM();
  const auto cfgs = split_configs();
  check_against_oracle(cfgs);
  check_graph_replay(cfgs);
}

// Runs cfg on (x, w) at M rows (stride K, output stride N) with the output and the workspace poisoned; out's
// bytes.
std::vector<uint8_t> run_config(const Buffer& dx, const Fp8Weight& w, const Buffer& dq, const Buffer& ds,
                                int64_t M, cuda::Fp8GemmConfig cfg) {
  const int64_t N = w.N, K = w.K, ws_bytes = cuda::fp8_gemm_workspace_bytes(M, N, K, cfg);
  Buffer out(size_t(M * N) * 2, Device::cuda()), ws(size_t(ws_bytes), Device::cuda());
  test::poison(out);
  test::poison(ws);
  cuda::fp8_gemm(dx.data(), K, dq.data(), w.ld, static_cast<const float*>(ds.data()), out.data(), N, M, N, K,
                 ws.data(), ws_bytes, cfg, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<uint8_t>(out, out.bytes());
}

// The split each config runs (fp8_gemm_split), deterministic results (two runs bitwise equal), and a split
// that clamps to 1 (M > kFp8GemmSplitKMaxM, or one K block) is bitwise the unsplit config's kernel, needing
// no more workspace than it.
TEST(CudaFp8GemmSplitK, DeterministicAndAClampedSplitIsTheUnsplitKernelBitwise) {
  KILN_REQUIRE_FP8_GEMM();
  const cuda::Fp8GemmConfig c8{128, 6, true, 1, false, 8};
  EXPECT_EQ(cuda::fp8_gemm_split(c8, 32, 4096), 8);
  EXPECT_EQ(cuda::fp8_gemm_split(c8, 32, 272), 3);  // 3 K blocks
  EXPECT_EQ(cuda::fp8_gemm_split(c8, 32, 128), 1);
  EXPECT_EQ(cuda::fp8_gemm_split(c8, cuda::kFp8GemmSplitKMaxM, 4096), 8);
  EXPECT_EQ(cuda::fp8_gemm_split(c8, cuda::kFp8GemmSplitKMaxM + 1, 4096), 1);
  EXPECT_EQ(cuda::fp8_gemm_split(unsplit(c8), 32, 4096), 1);
  EXPECT_EQ(cuda::fp8_gemm_workspace_bytes(32, 2560, 4096, unsplit(c8)),
            cuda::fp8_gemm_workspace_bytes(32, 4096));
  EXPECT_EQ(cuda::fp8_gemm_workspace_bytes(600, 2560, 4096, c8), cuda::fp8_gemm_workspace_bytes(600, 4096));
  EXPECT_GE(cuda::fp8_gemm_workspace_bytes(32, 2560, 4096, c8),
            cuda::fp8_gemm_workspace_bytes(32, 4096) + 8 * 32 * 2560 * 4);

  const int64_t N = 2560, K = 4096, Mbig = cuda::kFp8GemmSplitKMaxM + 88;
  const std::vector<bf16_t> x = make_x(Mbig, K, 31);
  const Fp8Weight w = make_weight(N, K, K, 32), w1 = make_weight(N, 128, 128, 33);
  Buffer dx = to_device(x), dq = to_device(w.q), ds = to_device(w.s), dq1 = to_device(w1.q),
         ds1 = to_device(w1.s);
  for (const cuda::Fp8GemmConfig& cfg : split_configs()) {
    const std::string what = config_name(cfg);
    const auto a = run_config(dx, w, dq, ds, 32, cfg);
    EXPECT_EQ(a, run_config(dx, w, dq, ds, 32, cfg)) << what << ": two runs differ";
    EXPECT_EQ(run_config(dx, w, dq, ds, Mbig, cfg), run_config(dx, w, dq, ds, Mbig, unsplit(cfg)))
        << what << " at M " << Mbig << " (split clamped to 1)";
    EXPECT_EQ(run_config(dx, w1, dq1, ds1, 32, cfg), run_config(dx, w1, dq1, ds1, 32, unsplit(cfg)))
        << what << " at K 128 (one K block)";
  }
}

// fp8_gemm_quantized takes the split configs: on the quantizer's workspace, bitwise fp8_gemm with the config.
TEST(CudaFp8GemmSplitK, PrequantizedEntryTakesSplitConfigsBitwise) {
  KILN_REQUIRE_FP8_GEMM();
  struct Shape {
    int64_t M, N, K;
  };
  // N 72: a partial last tile whose rows still meet the 16-byte output rows (ldo = N a multiple of 8).
  for (const Shape sh : {Shape{32, 2560, 9728}, Shape{16, 72, 144}, Shape{64, 6144, 2560}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K;
    const std::vector<bf16_t> x = make_x(M, K, 41);
    const Fp8Weight w = make_weight(N, K, K, 42);
    Buffer dx = to_device(x), dq = to_device(w.q), ds = to_device(w.s),
           out(size_t(M * N) * 2, Device::cuda());
    for (const cuda::Fp8GemmConfig& cfg : split_configs()) {
      const int64_t ws_bytes = cuda::fp8_gemm_workspace_bytes(M, N, K, cfg);
      Buffer ws(size_t(ws_bytes), Device::cuda());
      test::poison(ws);
      test::poison(out);
      cuda::fp8_quantize_act(dx.data(), K, M, K, ws.data(), ws_bytes, nullptr);
      cuda::fp8_gemm_quantized(dq.data(), K, static_cast<const float*>(ds.data()), out.data(), N, M, N, K,
                               ws.data(), ws_bytes, cfg, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(to_host<uint8_t>(out, out.bytes()), run_config(dx, w, dq, ds, M, cfg))
          << M << "x" << N << "x" << K << " " << config_name(cfg);
    }
  }
}

// A workspace holding the quantized input but not a split's partials is refused before anything is enqueued.
TEST(CudaFp8GemmSplitK, WorkspaceWithoutRoomForThePartialsIsAnError) {
  KILN_REQUIRE_FP8_GEMM();
  const int64_t M = 4, N = 64, K = 512;
  const cuda::Fp8GemmConfig cfg{128, 6, true, 1, false, 4};
  const int64_t short_bytes = cuda::fp8_gemm_workspace_bytes(M, K);
  ASSERT_LT(short_bytes, cuda::fp8_gemm_workspace_bytes(M, N, K, cfg));
  Buffer dx(size_t(M * K) * 2, Device::cuda()), dq(size_t(N * K), Device::cuda()), ds(64, Device::cuda()),
      out(size_t(M * N) * 2, Device::cuda()), ws(size_t(short_bytes), Device::cuda());
  test::poison(out);
  const float* s = static_cast<const float*>(ds.data());
  for (const bool prequantized : {false, true}) {
    try {
      if (prequantized)
        cuda::fp8_gemm_quantized(dq.data(), K, s, out.data(), N, M, N, K, ws.data(), short_bytes, cfg,
                                 nullptr);
      else
        cuda::fp8_gemm(dx.data(), K, dq.data(), K, s, out.data(), N, M, N, K, ws.data(), short_bytes, cfg,
                       nullptr);
      ADD_FAILURE() << "no error (prequantized " << prequantized << ")";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
    }
  }
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  for (const bf16_t v : to_host<bf16_t>(out, size_t(M * N))) ASSERT_EQ(v.bits, 0xffff);
}

// The tactic cache (gemm.h): an fp8gemm line's word 5 is split_k (1 written as 0, so a v5 line reads as
// split_k 1); a split no config has, or 1 written as 1, is a damaged line.
TEST(CudaFp8GemmSplitK, TacticLinesCarryTheSplit) {
  const cuda::GemmShape s32{32, 2560, 9728, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  for (const cuda::Fp8GemmConfig& c : cuda::kFp8GemmConfigs) {
    cuda::GemmTactic t;
    t.kind = cuda::GemmKind::fp8gemm;
    t.fp8gemm = c;
    t.us = 12.5f;
    t.describe = "w8a8";
    const std::string line = cuda::format_tactic_line(s32, t);
    cuda::GemmShape s2;
    cuda::GemmTactic t2;
    ASSERT_TRUE(cuda::parse_tactic_line(line, s2, t2)) << line;
    EXPECT_EQ(s2, s32);
    EXPECT_EQ(t2.fp8gemm, c) << line;
    EXPECT_EQ(cuda::format_tactic_line(s2, t2), line);
  }
  cuda::GemmShape s2;
  cuda::GemmTactic t2;
  ASSERT_TRUE(cuda::parse_tactic_line("32 2560 9728 bf16:e4m3 9 fp8gemm 80 6 1 1 0 0 0 0 # v5", s2, t2));
  EXPECT_EQ(t2.fp8gemm, cuda::kFp8GemmConfigs[0]);
  EXPECT_EQ(t2.fp8gemm.split_k, 1);
  ASSERT_TRUE(cuda::parse_tactic_line("32 2560 9728 bf16:e4m3 9 fp8gemm 40 8 1 1 0 3 0 0 # split", s2, t2));
  EXPECT_EQ(t2.fp8gemm, (cuda::Fp8GemmConfig{64, 8, true, 1, false, 3}));
  EXPECT_FALSE(
      cuda::parse_tactic_line("32 2560 9728 bf16:e4m3 9 fp8gemm 80 6 1 1 0 5 0 0 # split 5", s2, t2));
  EXPECT_FALSE(
      cuda::parse_tactic_line("32 2560 9728 bf16:e4m3 9 fp8gemm 80 6 1 1 0 1 0 0 # split 1", s2, t2));
  EXPECT_FALSE(
      cuda::parse_tactic_line("32 2560 9728 bf16:e4m3 9 fp8gemm 80 6 1 2 0 2 0 0 # cluster", s2, t2));
}

// GemmEngine with a split tactic (a v6 cache) runs it, growing its workspace for the partials: bitwise
// fp8_gemm with that config. The same shape's unsplit tactic in a v5 cache still loads and runs.
TEST(CudaFp8GemmSplitK, EngineRunsASplitTacticFromTheCache) {
  KILN_REQUIRE_FP8_GEMM();
  const int64_t M = 32, N = 2560, K = 4096;
  const std::vector<bf16_t> x = make_x(M, K, 51);
  const Fp8Weight w = make_weight(N, K, K, 52);
  Buffer dx = to_device(x), dq = to_device(w.q), ds = to_device(w.s), out(size_t(M * N) * 2, Device::cuda());
  const cuda::GemvWeight gw{dq.data(), K, static_cast<const float*>(ds.data())};
  const cuda::GemmShape shape{M, N, K, cuda::GemmOut::bf16, cuda::GemmWeight::fp8};
  const auto dir = test_support::process_scratch_dir("cuda_fp8_gemm_split");
  for (const auto& [header, cfg] :
       {std::pair<std::string, cuda::Fp8GemmConfig>{"kiln-gemm-tactics v6", {128, 6, true, 1, false, 6}},
        {"kiln-gemm-tactics v5", cuda::kFp8GemmConfigs[0]}}) {
    cuda::GemmEngine eng;
    const std::string path = (dir / "tactics.txt").string();
    {
      std::ofstream f(path);
      cuda::GemmTactic t;
      t.kind = cuda::GemmKind::fp8gemm;
      t.fp8gemm = cfg;
      t.us = 1.0f;
      t.describe = "w8a8";
      f << header << "\nkey " << eng.key() << "\n" << cuda::format_tactic_line(shape, t) << "\n";
    }
    ASSERT_TRUE(eng.load(path)) << header;
    ASSERT_EQ(eng.tactics().at(shape).fp8gemm, cfg) << header;
    test::poison(out);
    eng.run(dx.data(), K, gw, out.data(), N, M, N, K, cuda::GemmOut::bf16, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(eng.fp8_gemm_dispatches(), 1) << header;
    EXPECT_EQ(eng.fp8_dequant_dispatches(), 0) << header;
    EXPECT_EQ(to_host<uint8_t>(out, out.bytes()), run_config(dx, w, dq, ds, M, cfg)) << config_name(cfg);
  }
}

}  // namespace
}  // namespace kiln
