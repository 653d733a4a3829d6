// Qwen3-VL's varlen attention on the GPU (the tensor-core kernel the vision tower runs) against an fp64
// reference: segments of odd lengths in one fused QKV buffer, head_dim 64 and 128, several query-tile sizes,
// outputs within a bound derived per element from the softmax weights (see the first test), and segments that
// must not see each other's keys. Split from test_cuda_vision.cpp, which covers the other vision ops, the
// towers and the engine with images.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/cuda/vision_attention.h"
#include "ops/vision_attention.h"
#include "test_util_cuda.h"
#include "vision_test_util.h"

namespace kiln {
namespace {

using test::dev_t;
using test::rel_frob;

// A varlen-attention problem as the tower runs it: q, k and v are views into one fused QKV buffer
// [T, 3 Hn D]; out has a padded token stride (Hn D + 8) so a store past a row's D elements shows.
struct VarlenCase {
  int Hn = 0, D = 0;
  int64_t T = 0, qkv_stride = 0, out_stride = 0;
  std::vector<int32_t> cu;
  std::vector<bf16_t> qkv;
  Tensor part(bf16_t* base, int k, Device d) const {
    return Tensor::strided(base + k * Hn * D, DType::bf16, {T, Hn, D}, {qkv_stride, D, 1}, d);
  }
  float scale() const { return float(1.0 / std::sqrt(double(D))); }
};

// Segments of lengths 1, 7, 33, 100, 257 and 1000 (none a multiple of a 64-key tile or a query tile), q and k
// in [-3, 3] so scores reach about +-10 (the running max matters), v in [-1, 1].
VarlenCase make_varlen_case(int D, int Hn, uint32_t seed) {
  VarlenCase c;
  c.Hn = Hn, c.D = D;
  c.cu = {0};
  for (int len : {1, 7, 33, 100, 257, 1000}) c.cu.push_back(c.cu.back() + len);
  c.T = c.cu.back();
  c.qkv_stride = 3 * int64_t(Hn) * D;
  c.out_stride = int64_t(Hn) * D + 8;
  const auto qk = test::random_bf16(size_t(c.T * c.qkv_stride), seed, -3, 3);
  const auto v = test::random_bf16(size_t(c.T * c.qkv_stride), seed + 1, -1, 1);
  c.qkv = qk;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t i = 2 * Hn * D; i < c.qkv_stride; ++i)
      c.qkv[size_t(t * c.qkv_stride + i)] = v[size_t(t * c.qkv_stride + i)];
  return c;
}

// The GPU's out buffer [T, out_stride] (padding included), poisoned with bf16 NaN 0xFFFF before the launch:
// tile_rows < 0 through ops::varlen_attention (the dispatcher), else the tensor-core kernel with that block
// height.
std::vector<bf16_t> run_varlen_gpu(const VarlenCase& c, int tile_rows) {
  const Buffer dqkv = test::to_device(c.qkv), dcu = test::to_device(c.cu);
  const Buffer dout = test::to_device(std::vector<bf16_t>(size_t(c.T * c.out_stride), bf16_t{0xffff}));
  auto* base = static_cast<bf16_t*>(dqkv.data());
  const Tensor out =
      Tensor::strided(dout.data(), DType::bf16, {c.T, c.Hn, c.D}, {c.out_stride, c.D, 1}, Device::cuda());
  const Tensor cu = dev_t(dcu, {int64_t(c.cu.size())}, DType::i32);
  if (tile_rows < 0) {
    ops::varlen_attention(c.part(base, 0, Device::cuda()), c.part(base, 1, Device::cuda()),
                          c.part(base, 2, Device::cuda()), cu, out, c.scale());
  } else {
    const int64_t D = c.D;
    const cuda::VarlenAttnParams p{.q = static_cast<const uint16_t*>(dqkv.data()),
                                   .k = static_cast<const uint16_t*>(dqkv.data()) + c.Hn * D,
                                   .v = static_cast<const uint16_t*>(dqkv.data()) + 2 * c.Hn * D,
                                   .cu = static_cast<const int32_t*>(dcu.data()),
                                   .out = static_cast<uint16_t*>(dout.data()),
                                   .qs = c.qkv_stride,
                                   .qh = D,
                                   .ks = c.qkv_stride,
                                   .kh = D,
                                   .vs = c.qkv_stride,
                                   .vh = D,
                                   .os = c.out_stride,
                                   .oh = D,
                                   .T = c.T,
                                   .Hn = c.Hn,
                                   .S = int32_t(c.cu.size() - 1),
                                   .D = int32_t(D),
                                   .scale = c.scale()};
    EXPECT_TRUE(cuda::varlen_attention_mma_applies(p));
    cuda::launch_varlen_attention_mma(p, nullptr, tile_rows);
  }
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return test::to_host<bf16_t>(dout, size_t(c.T * c.out_stride));
}

// Rows [b, e) x heads of a padded out buffer as a dense vector.
std::vector<bf16_t> dense_rows(const VarlenCase& c, const std::vector<bf16_t>& out, int64_t b, int64_t e) {
  std::vector<bf16_t> r;
  for (int64_t t = b; t < e; ++t)
    r.insert(r.end(), out.begin() + t * c.out_stride, out.begin() + t * c.out_stride + c.Hn * c.D);
  return r;
}

// The tensor-core kernel (head_dim 64 with 64- and 128-row blocks, 128 with 64-row blocks, and the
// dispatcher's own choice) on six odd segments in one call, 3 heads, q/k/v strided in a fused QKV buffer:
//  - every output element written (out poisoned with NaN first), the padding after each row untouched;
//  - against the CPU oracle (ops::varlen_attention on the host): relative Frobenius error <= 2^-7;
//  - against fp64 per (segment, head): relative Frobenius error <= 2^-7, and per element
//    |err| <= 2^-7 (sum_j p_j |v_j| / l + |o|) + 2^-16: bf16 P (2^-8 relative each) and the output's one bf16
//    rounding (2^-8) stay under half of that; a key of another segment, a lost key or a misplaced fragment
//    does not.
TEST(CudaVision, VarlenAttentionTensorCoresMatchReference) {
  KILN_REQUIRE_GPU();
  for (int D : {64, 128}) {
    const VarlenCase c = make_varlen_case(D, 3, 20 + uint32_t(D));
    const int Hn = c.Hn;
    const int64_t T = c.T;
    std::vector<bf16_t> want(size_t(T * Hn * D));
    auto qkv = c.qkv;
    auto cu = c.cu;
    ops::varlen_attention(c.part(qkv.data(), 0, Device::cpu()), c.part(qkv.data(), 1, Device::cpu()),
                          c.part(qkv.data(), 2, Device::cpu()),
                          Tensor(cu.data(), DType::i32, {int64_t(cu.size())}),
                          Tensor(want.data(), DType::bf16, {T, Hn, D}), c.scale());
    // fp64: ref[t, h, d] and bound[t, h, d] = sum_j p_j |v_j[d]| / l.
    std::vector<double> f(c.qkv.size()), ref(want.size()), absw(want.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(c.qkv[i]);
    std::vector<double> sc;
    for (size_t s = 0; s + 1 < c.cu.size(); ++s) {
      const int64_t b = c.cu[s], e = c.cu[s + 1];
      for (int64_t t = b; t < e; ++t)
        for (int h = 0; h < Hn; ++h) {
          const double* q = &f[size_t(t * c.qkv_stride + h * D)];
          sc.assign(size_t(e - b), 0.0);
          double mx = -1e300;
          for (int64_t j = b; j < e; ++j) {
            const double* k = &f[size_t(j * c.qkv_stride + (Hn + h) * D)];
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += q[d] * k[d];
            sc[size_t(j - b)] = dot * double(c.scale());
            mx = std::max(mx, sc[size_t(j - b)]);
          }
          double l = 0;
          for (double& x : sc) l += (x = std::exp(x - mx));
          double* o = &ref[size_t((t * Hn + h) * D)];
          double* a = &absw[size_t((t * Hn + h) * D)];
          for (int64_t j = b; j < e; ++j) {
            const double* v = &f[size_t(j * c.qkv_stride + (2 * Hn + h) * D)];
            const double pj = sc[size_t(j - b)] / l;
            for (int d = 0; d < D; ++d) o[d] += pj * v[d], a[d] += pj * std::abs(v[d]);
          }
        }
    }
    for (int tile_rows : {-1, 64, 128}) {
      if (tile_rows == 128 && D != 64) continue;
      SCOPED_TRACE("D " + std::to_string(D) + ", tile_rows " + std::to_string(tile_rows));
      const std::vector<bf16_t> got_padded = run_varlen_gpu(c, tile_rows);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = Hn * D; i < c.out_stride; ++i)
          ASSERT_EQ(got_padded[size_t(t * c.out_stride + i)].bits, 0xffff) << "padding written, row " << t;
      const std::vector<bf16_t> got = dense_rows(c, got_padded, 0, T);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(std::isfinite(bf16_to_f32(got[i]))) << "element " << i << " not written (or not finite)";
      EXPECT_LE(rel_frob(got, want), std::ldexp(1.0, -7)) << "against the CPU oracle";
      double worst_frob = 0, worst_ratio = 0;
      int64_t bad_rows = 0;
      for (size_t s = 0; s + 1 < c.cu.size(); ++s)
        for (int h = 0; h < Hn; ++h) {
          double num = 0, den = 0;
          for (int64_t t = c.cu[s]; t < c.cu[s + 1]; ++t) {
            double row_ratio = 0, row_err = 0;  // the row's max |err| / bound and max |err|
            for (int d = 0; d < D; ++d) {
              const size_t i = size_t((t * Hn + h) * D + d);
              const double err = std::abs(double(bf16_to_f32(got[i])) - ref[i]);
              num += err * err, den += ref[i] * ref[i];
              const double bound = std::ldexp(absw[i] + std::abs(ref[i]), -7) + std::ldexp(1.0, -16);
              row_ratio = std::max(row_ratio, err / bound), row_err = std::max(row_err, err);
            }
            worst_ratio = std::max(worst_ratio, row_ratio);
            if (row_ratio > 1 && ++bad_rows <= 5)
              ADD_FAILURE() << "segment " << s << " row " << t << " head " << h << ": max |err| " << row_err
                            << " is " << row_ratio << "x its bound";
          }
          const double frob = std::sqrt(num / std::max(den, 1e-30));
          worst_frob = std::max(worst_frob, frob);
          EXPECT_LE(frob, std::ldexp(1.0, -7)) << "segment " << s << " head " << h << " against fp64";
        }
      EXPECT_EQ(bad_rows, 0) << "rows past their per-element fp64 bound";
      std::printf(
          "varlen attention D %d tile_rows %d: worst (segment, head) rel. Frobenius %.3g, worst "
          "|err| / bound %.3f\n",
          D, tile_rows, worst_frob, worst_ratio);
    }
  }
}

// Segments stay apart: V of the 257-row segment times 256 (exact in bf16) leaves every other segment's output
// bitwise unchanged (a block reads only its own segment's keys; 0 * a huge V would still be 0, but any
// weight leaking across segments would not), and scales that segment's own output by 256 to within 2^-7.
TEST(CudaVision, VarlenAttentionTensorCoresKeepSegmentsApart) {
  KILN_REQUIRE_GPU();
  for (int D : {64, 128}) {
    VarlenCase c = make_varlen_case(D, 2, 40 + uint32_t(D));
    const int64_t b = c.cu[4], e = c.cu[5];
    for (int tile_rows : {64, 128}) {
      if (tile_rows == 128 && D != 64) continue;
      SCOPED_TRACE("D " + std::to_string(D) + ", tile_rows " + std::to_string(tile_rows));
      VarlenCase big = c;
      for (int64_t t = b; t < e; ++t)
        for (int64_t i = 2 * c.Hn * D; i < c.qkv_stride; ++i) {
          bf16_t& x = big.qkv[size_t(t * c.qkv_stride + i)];
          x = f32_to_bf16(bf16_to_f32(x) * 256.0f);
        }
      const std::vector<bf16_t> a = run_varlen_gpu(c, tile_rows), g = run_varlen_gpu(big, tile_rows);
      for (int64_t t = 0; t < c.T; ++t) {
        if (t >= b && t < e) continue;
        for (int64_t i = 0; i < c.Hn * D; ++i)
          ASSERT_EQ(a[size_t(t * c.out_stride + i)].bits, g[size_t(t * c.out_stride + i)].bits)
              << "row " << t << " (outside the scaled segment) changed";
      }
      std::vector<bf16_t> scaled = dense_rows(c, a, b, e);
      for (bf16_t& x : scaled) x = f32_to_bf16(bf16_to_f32(x) * 256.0f);
      EXPECT_LE(rel_frob(dense_rows(c, g, b, e), scaled), std::ldexp(1.0, -7));
    }
  }
}

}  // namespace
}  // namespace kiln
