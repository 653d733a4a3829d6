// CPU oracle of the block-FP8 linear layers: exactly the rounding points and summation orders that
// ops/fp8_linear.h and docs/NUMERICS.md state. Scalar and readable; each output element is computed by one
// thread in a fixed order, so results never depend on the thread count or on the rest of the batch.
// Built with -ffp-contract=off (src/ops/CMakeLists.txt): the contract says "product, then add", never fma.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/error.h"
#include "ops/cpu/fp8_ref.h"
#include "ops/cpu/parallel.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"

namespace kiln::ops::cpu {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kActEps = 1e-10f;    // vLLM's per_token_group_quant_fp8 eps
constexpr float kWeightEps = 1e-4f;  // DeepGEMM's per_block_cast_to_fp8 clamp

// ops::linear's lane order: l[k mod 8] accumulates in ascending k, then (l0+l4)+(l2+l6) + (l1+l5)+(l3+l7).
// a[0] and b[0] sit at a global k that is a multiple of 8 (a block start, or 0), so lane j owns i = j mod 8.
// The eight lanes are written out so the compiler keeps them in one vector register.
float lane_dot(const float* a, const float* b, int64_t n) {
  float l[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float prod = a[i + j] * b[i + j];
      l[j] += prod;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const float prod = a[i] * b[i];
    l[j] += prod;
  }
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

// e4m3 byte -> fp32, every value exact (e4m3_to_f32 tabulated once: the decode is the hot loop's other half).
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int b = 0; b < 256; ++b) v[b] = e4m3_to_f32(uint8_t(b));
  }
};
const E4m3Table& e4m3_table() {
  static const E4m3Table t;
  return t;
}

// A weight row n decoded to fp32.
void decode_row(const uint8_t* q, int64_t K, float* out) {
  const float* t = e4m3_table().v;
  for (int64_t k = 0; k < K; ++k) out[k] = t[q[k]];
}

int64_t rows_grain(int64_t N) {
  return std::max<int64_t>(1, N / (8 * num_threads()));
}

// The one rounding point of paths (a) and (b): bf16 out, or the fp32 sum kept (f32 out: a tensor-parallel
// rank's partial, rounded after the all-reduce).
void store(const Tensor& out, int64_t m, int64_t n, float acc) {
  if (out.dtype == DType::f32) {
    out.ptr<float>()[m * out.stride[0] + n] = acc;
  } else {
    out.ptr<bf16_t>()[m * out.stride[0] + n] = f32_to_bf16(acc);
  }
}

}  // namespace

float quantize_act_group(const bf16_t* x, int64_t n, uint8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(bf16_to_f32(x[i])));  // NaN ignored
  const float s = std::fmax(amax, kActEps) / kE4m3Max;
  for (int64_t i = 0; i < n; ++i) q[i] = f32_to_e4m3(bf16_to_f32(x[i]) / s);
  return s;
}

void quantize_act_fp8(const Tensor& x, const Tensor& q, const Tensor& scale) {
  const int64_t M = x.shape[0], K = x.shape[1], Kb = fp8_blocks(K);
  for (int64_t m = 0; m < M; ++m) {
    const bf16_t* xr = x.ptr<bf16_t>() + m * x.stride[0];
    uint8_t* qr = q.ptr<uint8_t>() + m * q.stride[0];
    for (int64_t kb = 0; kb < Kb; ++kb) {
      const int64_t k0 = kb * kFp8Block, n = std::min(kFp8Block, K - k0);
      scale.ptr<float>()[m * Kb + kb] = quantize_act_group(xr + k0, n, qr + k0);
    }
  }
}

void linear_fp8_w8a8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out) {
  const int64_t M = x.shape[0], K = x.shape[1], N = weight.shape[0], Kb = fp8_blocks(K);
  // The activations quantized once (as the GPU's quantize kernel would), decoded to fp32.
  std::vector<float> xq(size_t(M * K)), xs(size_t(M * Kb));
  {
    std::vector<uint8_t> qrow(static_cast<size_t>(K));
    for (int64_t m = 0; m < M; ++m) {
      const bf16_t* xr = x.ptr<bf16_t>() + m * x.stride[0];
      for (int64_t kb = 0; kb < Kb; ++kb) {
        const int64_t k0 = kb * kFp8Block, n = std::min(kFp8Block, K - k0);
        xs[size_t(m * Kb + kb)] = quantize_act_group(xr + k0, n, qrow.data() + k0);
      }
      decode_row(qrow.data(), K, xq.data() + m * K);
    }
  }
  const float* S = scale.ptr<float>();
  parallel_for(N, rows_grain(N), [&](int64_t n0, int64_t n1) {
    std::vector<float> wrow(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; ++n) {
      decode_row(weight.ptr<uint8_t>() + n * weight.stride[0], K, wrow.data());
      const float* ws = S + (n / kFp8Block) * Kb;
      for (int64_t m = 0; m < M; ++m) {
        float acc = 0.0f;
        for (int64_t kb = 0; kb < Kb; ++kb) {
          const int64_t k0 = kb * kFp8Block, len = std::min(kFp8Block, K - k0);
          const float p = lane_dot(xq.data() + m * K + k0, wrow.data() + k0, len);
          const float s = xs[size_t(m * Kb + kb)] * ws[kb];
          const float contrib = p * s;
          acc = acc + contrib;
        }
        store(out, m, n, acc);
      }
    }
  });
}

void linear_fp8_weight_only(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out) {
  const int64_t M = x.shape[0], K = x.shape[1], N = weight.shape[0], Kb = fp8_blocks(K);
  std::vector<float> xf(size_t(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xf[size_t(m * K + k)] = bf16_to_f32(x.ptr<bf16_t>()[m * x.stride[0] + k]);
  const float* S = scale.ptr<float>();
  parallel_for(N, rows_grain(N), [&](int64_t n0, int64_t n1) {
    std::vector<float> wf(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* q = weight.ptr<uint8_t>() + n * weight.stride[0];
      const float* ws = S + (n / kFp8Block) * Kb;
      decode_row(q, K, wf.data());
      for (int64_t k = 0; k < K; ++k) wf[size_t(k)] *= ws[k / kFp8Block];
      for (int64_t m = 0; m < M; ++m) store(out, m, n, lane_dot(xf.data() + m * K, wf.data(), K));
    }
  });
}

void quantize_weight_fp8(const Tensor& w, const Tensor& q, const Tensor& scale, const std::string& name) {
  const int64_t N = w.shape[0], K = w.shape[1], Nb = fp8_blocks(N), Kb = fp8_blocks(K);
  const bf16_t* W = w.ptr<bf16_t>();
  uint8_t* Q = q.ptr<uint8_t>();
  float* S = scale.ptr<float>();
  for (int64_t i = 0; i < N * K; ++i)
    KILN_CHECK(std::isfinite(bf16_to_f32(W[i])), "--quantization fp8: ", name,
               " holds a non-finite value at [", i / K, ", ", i % K, "]");
  parallel_for(Nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      const int64_t r0 = nb * kFp8Block, r1 = std::min(N, r0 + kFp8Block);
      for (int64_t kb = 0; kb < Kb; ++kb) {
        const int64_t c0 = kb * kFp8Block, c1 = std::min(K, c0 + kFp8Block);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(bf16_to_f32(W[r * K + c])));
        const float a = std::fmax(amax, kWeightEps);
        // torch's `448.0 / amax` (Tensor.__rtruediv__) is a reciprocal then a product; 448 / a differs in
        // the last bit for some a, and the fixture's e4m3 ties then round the other way.
        const float mul = (1.0f / a) * kE4m3Max;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) Q[r * K + c] = f32_to_e4m3(bf16_to_f32(W[r * K + c]) * mul);
        S[nb * Kb + kb] = a / kE4m3Max;
      }
    }
  });
}

void dequantize_fp8(const Tensor& weight, const Tensor& scale, const Tensor& out) {
  const int64_t N = weight.shape[0], K = weight.shape[1], Kb = fp8_blocks(K);
  const float* S = scale.ptr<float>();
  parallel_for(N, rows_grain(N), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* q = weight.ptr<uint8_t>() + n * weight.stride[0];
      bf16_t* o = out.ptr<bf16_t>() + n * out.stride[0];
      const float* ws = S + (n / kFp8Block) * Kb;
      for (int64_t k = 0; k < K; ++k) {
        const float v = e4m3_to_f32(q[k]) * ws[k / kFp8Block];
        o[k] = std::isnan(v) ? bf16_t{0x7fff} : f32_to_bf16(v);  // the canonical NaN, as __float2bfloat16_rn
      }
    }
  });
}

// Path (d) (ops/fp8_linear.h): the CUDA e4m3 x 16 GEMV's order for `threads` threads a block, emulated per
// output: the threads' partials over their 16-element chunks, each warp's xor butterfly, the warps in order.
void linear_fp8_chunk16(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out,
                        int threads) {
  const int64_t M = x.shape[0], K = x.shape[1], N = weight.shape[0], Kb = fp8_blocks(K), chunks = K / 16;
  const float* S = scale.ptr<float>();
  const float* table = e4m3_table().v;
  parallel_for(N, rows_grain(N), [&](int64_t n0, int64_t n1) {
    std::vector<float> wf(static_cast<size_t>(K)), part(static_cast<size_t>(threads));
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* q = weight.ptr<uint8_t>() + n * weight.stride[0];
      for (int64_t k = 0; k < K; ++k)  // the NaN codes read as +-480 (the kernel's integer decode)
        wf[size_t(k)] = (q[k] & 0x7fu) == 0x7fu ? (q[k] & 0x80u ? -480.0f : 480.0f) : table[q[k]];
      const float* ws = S + (n / kFp8Block) * Kb;
      for (int64_t m = 0; m < M; ++m) {
        const bf16_t* xr = x.ptr<bf16_t>() + m * x.stride[0];
        for (int t = 0; t < threads; ++t) {
          float acc = 0.0f;
          for (int64_t c = t; c < chunks; c += threads) {
            float sum = 0.0f;
            for (int64_t e = 16 * c; e < 16 * c + 16; ++e)
              sum = std::fma(bf16_to_f32(xr[e]), wf[size_t(e)], sum);
            acc = std::fma(sum, ws[c / 8], acc);
          }
          part[size_t(t)] = acc;
        }
        float total = 0.0f;
        for (int w = 0; w < threads / 32; ++w) {
          float v[32];
          for (int l = 0; l < 32; ++l) v[l] = part[size_t(32 * w + l)];
          for (int off = 16; off >= 1; off /= 2) {
            float nv[32];
            for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ off];
            std::copy(nv, nv + 32, v);
          }
          total = w == 0 ? v[0] : total + v[0];
        }
        store(out, m, n, total);
      }
    }
  });
}

}  // namespace kiln::ops::cpu
