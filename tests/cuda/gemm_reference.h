// fp64 references for the GEMM and GEMV tests (test_cuda_gemm.cpp, test_cuda_gemv.cpp): the exact product
// of bf16 operands and the relative Frobenius error of a result against it.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::test {

// ref[m * N + n] = sum_k x[m * ldx + k] * w[n * ldw + k] in fp64, for m < M, n < N.
inline std::vector<double> gemm_fp64(const std::vector<bf16_t>& x, int64_t ldx, const std::vector<bf16_t>& w,
                                     int64_t ldw, int64_t M, int64_t N, int64_t K) {
  std::vector<double> xf(size_t(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xf[size_t(m * K + k)] = double(bf16_to_f32(x[size_t(m * ldx + k)]));
  std::vector<double> ref(size_t(M * N), 0.0);
  std::vector<double> wrow(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) wrow[size_t(k)] = double(bf16_to_f32(w[size_t(n * ldw + k)]));
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += xf[size_t(m * K + k)] * wrow[size_t(k)];
      ref[size_t(m * N + n)] = s;
    }
  }
  return ref;
}

// Relative Frobenius error of got[m * ldo + n] against ref[m * N + n] over m < M, n < N.
inline double rel_frobenius(const std::vector<double>& ref, int64_t N, const std::vector<float>& got,
                            int64_t ldo, int64_t M) {
  double num = 0, den = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const double r = ref[size_t(m * N + n)], d = double(got[size_t(m * ldo + n)]) - r;
      num += d * d;
      den += r * r;
    }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Relative Frobenius error of got[M, N] (row stride ldo) against x[M, K] · w[N, K]^T in fp64.
inline double rel_error(const std::vector<bf16_t>& x, int64_t ldx, const std::vector<bf16_t>& w,
                        const std::vector<float>& got, int64_t ldo, int64_t M, int64_t N, int64_t K) {
  return rel_frobenius(gemm_fp64(x, ldx, w, K, M, N, K), N, got, ldo, M);
}

inline std::vector<float> widen(const std::vector<bf16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_f32(v[i]);
  return f;
}

}  // namespace kiln::test
