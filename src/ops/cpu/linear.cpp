// CPU GEMM for linear and lm_head: x rows are widened to fp32 once, then every (row, weight row) dot
// product runs the same 8-lane kernel (lane = k mod 8, ascending k, then a pairwise tree), so a result
// never depends on the tiling, the batch or the thread count. Register tiles of MR x rows by NR weight
// rows reuse each load; threads split the weight rows.
#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"

// The 32-byte vector helpers below are internal (anonymous namespace), so the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kiln::ops::cpu {
namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8f load_f32(const float* p) {
  v8f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline v8f load_bf16(const bf16_t* p) {
  v8u16 h;
  __builtin_memcpy(&h, p, sizeof h);
  const v8u32 u = __builtin_convertvector(h, v8u32) << 16;
  v8f f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
[[gnu::always_inline]] inline float reduce8(v8f a) {
  const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}

// acc[i][j] = dot(x row i, w row j) over K for MR x rows and NR weight rows.
template <int MR, int NR>
[[gnu::always_inline]] inline void dot_tile(const float* x, int64_t ldx, const bf16_t* w, int64_t ldw,
                                            int64_t K, float (&acc)[MR][NR]) {
  v8f a[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) a[i][j] = v8f{};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    v8f wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load_bf16(w + j * ldw + k);
    for (int i = 0; i < MR; ++i) {
      const v8f xv = load_f32(x + i * ldx + k);
      for (int j = 0; j < NR; ++j) a[i][j] += xv * wv[j];
    }
  }
  for (; k < K; ++k) {  // tail: element k still goes to lane k mod 8
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) a[i][j][k % 8] += x[i * ldx + k] * bf16_to_f32(w[j * ldw + k]);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = reduce8(a[i][j]);
}

// The same kernel compiled for AVX2 (256-bit lanes, one-instruction bf16 widening) and for the x86-64
// baseline. Both perform the same fp32 operations in the same order (products of bf16 values are exact,
// so no contraction question arises): the results are bitwise equal, only the speed differs.
#if defined(__x86_64__)
template <int MR, int NR>
[[gnu::target("avx2")]] void dot_tile_avx2(const float* x, int64_t ldx, const bf16_t* w, int64_t ldw,
                                           int64_t K, float (&acc)[MR][NR]) {
  dot_tile<MR, NR>(x, ldx, w, ldw, K, acc);
}
#endif
template <int MR, int NR>
void dot_tile_base(const float* x, int64_t ldx, const bf16_t* w, int64_t ldw, int64_t K,
                   float (&acc)[MR][NR]) {
  dot_tile<MR, NR>(x, ldx, w, ldw, K, acc);
}
std::atomic<bool> g_force_baseline{false};

template <int MR, int NR>
void dot_tile_any(const float* x, int64_t ldx, const bf16_t* w, int64_t ldw, int64_t K,
                  float (&acc)[MR][NR]) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && !g_force_baseline.load(std::memory_order_relaxed)) {
    dot_tile_avx2<MR, NR>(x, ldx, w, ldw, K, acc);
    return;
  }
#endif
  dot_tile_base<MR, NR>(x, ldx, w, ldw, K, acc);
}

// Computes C[m, n] = X[m, :] · W[n, :] for all m < M, n < N and hands each value to store(m, n, v).
// X: fp32 [M, K] contiguous (row stride K).
template <typename Store>
void gemm(const float* X, int64_t M, int64_t K, const bf16_t* W, int64_t ldw, int64_t N, const Store& store) {
  constexpr int NR = 4;
  constexpr int64_t kRowBlock = 64;  // x rows kept hot in cache while a weight tile streams past them
  const int64_t grain = std::max<int64_t>(NR, (N / (8 * num_threads())) / NR * NR);
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t mb = 0; mb < M; mb += kRowBlock) {
      const int64_t me = std::min(M, mb + kRowBlock);
      int64_t n = n0;
      auto rows = [&](auto nr_tag) {
        constexpr int nr = decltype(nr_tag)::value;
        const bf16_t* w = W + n * ldw;
        int64_t m = mb;
        for (; m + 2 <= me; m += 2) {
          float acc[2][nr];
          dot_tile_any<2, nr>(X + m * K, K, w, ldw, K, acc);
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < nr; ++j) store(m + i, n + j, acc[i][j]);
        }
        for (; m < me; ++m) {
          float acc[1][nr];
          dot_tile_any<1, nr>(X + m * K, K, w, ldw, K, acc);
          for (int j = 0; j < nr; ++j) store(m, n + j, acc[0][j]);
        }
      };
      for (; n + NR <= n1; n += NR) rows(std::integral_constant<int, NR>{});
      for (; n < n1; ++n) rows(std::integral_constant<int, 1>{});
    }
  });
}

// Widens rows of a bf16 matrix (row index taken from `row_of`) into a contiguous fp32 [R, K] array.
template <typename RowOf>
std::vector<float> widen_rows(const Tensor& x, int64_t R, const RowOf& row_of) {
  const int64_t K = x.shape[1];
  std::vector<float> X(size_t(R * K));
  parallel_for(R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bf16_t* src = x.ptr<bf16_t>() + row_of(r) * x.stride[0];
      for (int64_t k = 0; k < K; ++k) X[size_t(r * K + k)] = bf16_to_f32(src[k]);
    }
  });
  return X;
}

}  // namespace

bool linear_uses_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && !g_force_baseline.load();
#else
  return false;
#endif
}
void linear_force_baseline(bool on) {
  g_force_baseline.store(on);
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& out) {
  const int64_t M = x.shape[0], K = x.shape[1], N = weight.shape[0];
  if (M == 0 || N == 0) return;
  const std::vector<float> X = widen_rows(x, M, [](int64_t r) { return r; });
  bf16_t* o = out.ptr<bf16_t>();
  const int64_t ldo = out.stride[0];
  gemm(X.data(), M, K, weight.ptr<bf16_t>(), weight.stride[0], N,
       [&](int64_t m, int64_t n, float v) { o[m * ldo + n] = f32_to_bf16(v); });
}

void linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const int64_t M = x.shape[0], K = x.shape[1], N = weight.shape[0];
  if (M == 0 || N == 0) return;
  const std::vector<float> X = widen_rows(x, M, [](int64_t r) { return r; });
  bf16_t* o = out.ptr<bf16_t>();
  const bf16_t* b = bias.ptr<bf16_t>();
  const int64_t ldo = out.stride[0];
  gemm(X.data(), M, K, weight.ptr<bf16_t>(), weight.stride[0], N,
       [&](int64_t m, int64_t n, float v) { o[m * ldo + n] = f32_to_bf16(v + bf16_to_f32(b[n])); });
}

void lm_head(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& logits) {
  const int64_t R = rows.shape[0], K = x.shape[1], V = weight.shape[0], T = x.shape[0];
  const int32_t* row = rows.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r) {
    KILN_CHECK(row[r] >= 0 && row[r] < T, "lm_head: row ", row[r], " out of range [0, ", T, ")");
  }
  if (R == 0 || V == 0) return;
  const std::vector<float> X = widen_rows(x, R, [&](int64_t r) { return int64_t(row[r]); });
  float* o = logits.ptr<float>();
  const int64_t ldo = logits.stride[0];
  gemm(X.data(), R, K, weight.ptr<bf16_t>(), weight.stride[0], V,
       [&](int64_t m, int64_t n, float v) { o[m * ldo + n] = bf16_to_f32(f32_to_bf16(v)); });
}

}  // namespace kiln::ops::cpu
