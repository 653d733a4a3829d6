// GPU parity of the memory-bound ops against the CPU oracle (ops/cpu): embedding and RMSNorm bitwise,
// SiLU-and-mul within 1 bf16 ulp (expf is not correctly rounded on either side).
#include <cuda_runtime_api.h>

#include "ops/cpu/reference.h"
#include "ops/cuda/elementwise.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::random_bf16;
using test::to_device;
using test::to_host;

TEST(CudaElementwise, EmbeddingMatchesCpuBitwise) {
  KILN_REQUIRE_GPU();
  for (int64_t H : {8, 72, 1024, 2560}) {
    const int64_t V = 97, T = 13;
    const auto table = random_bf16(size_t(V * H), 1);
    std::vector<int32_t> ids(T);
    for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 37 + 5) % V);
    std::vector<bf16_t> ref(size_t(T * H));
    std::vector<float> ref32(size_t(T * H));
    ops::cpu::embedding(Tensor(const_cast<bf16_t*>(table.data()), DType::bf16, {V, H}),
                        Tensor(ids.data(), DType::i32, {T}), Tensor(ref.data(), DType::bf16, {T, H}));
    ops::cpu::embedding(Tensor(const_cast<bf16_t*>(table.data()), DType::bf16, {V, H}),
                        Tensor(ids.data(), DType::i32, {T}), Tensor(ref32.data(), DType::f32, {T, H}));
    Buffer dt = to_device(table), di = to_device(ids);
    Buffer out(size_t(T * H) * 2, Device::cuda()), out32(size_t(T * H) * 4, Device::cuda());
    cuda::embedding_gather(static_cast<int32_t*>(di.data()), dt.data(), H, out.data(), H, false, T, V, H,
                           nullptr);
    cuda::embedding_gather(static_cast<int32_t*>(di.data()), dt.data(), H, out32.data(), H, true, T, V, H,
                           nullptr);
    const auto got = to_host<bf16_t>(out, size_t(T * H));
    const auto got32 = to_host<float>(out32, size_t(T * H));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].bits, ref[i].bits) << "H " << H << " i " << i;
      ASSERT_EQ(got32[i], ref32[i]) << "H " << H << " i " << i;
    }
  }
}

TEST(CudaElementwise, OutOfRangeTokenGivesZeroRow) {
  KILN_REQUIRE_GPU();
  const int64_t V = 4, H = 16;
  const auto table = random_bf16(size_t(V * H), 2, 1.0f, 2.0f);
  const std::vector<int32_t> ids = {1, 7, -1};
  Buffer dt = to_device(table), di = to_device(ids), out(3 * H * 2, Device::cuda());
  cuda::embedding_gather(static_cast<int32_t*>(di.data()), dt.data(), H, out.data(), H, false, 3, V, H,
                         nullptr);
  const auto got = to_host<bf16_t>(out, 3 * H);
  for (int64_t i = 0; i < H; ++i) {
    EXPECT_EQ(got[size_t(i)].bits, table[size_t(H + i)].bits);
    EXPECT_EQ(got[size_t(H + i)].bits, 0);
    EXPECT_EQ(got[size_t(2 * H + i)].bits, 0);
  }
}

TEST(CudaElementwise, RmsNormMatchesCpuBitwise) {
  KILN_REQUIRE_GPU();
  for (int64_t H : {8, 72, 1024, 2560, 5120}) {
    for (int64_t T : {1, 7, 33}) {
      const auto x = random_bf16(size_t(T * H), uint32_t(H + T), -4.0f, 4.0f);
      const auto res0 = random_bf16(size_t(T * H), uint32_t(H * T + 9), -4.0f, 4.0f);
      const auto w = random_bf16(size_t(H), uint32_t(H), 0.5f, 1.5f);
      const float eps = 1e-6f;
      // CPU oracle: plain and fused.
      std::vector<bf16_t> ref(size_t(T * H)), ref_add(size_t(T * H)), ref_res = res0;
      ops::cpu::rms_norm(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}),
                         Tensor(const_cast<bf16_t*>(w.data()), DType::bf16, {H}), eps,
                         Tensor(ref.data(), DType::bf16, {T, H}));
      ops::cpu::add_rms_norm(Tensor(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}),
                             Tensor(ref_res.data(), DType::bf16, {T, H}),
                             Tensor(const_cast<bf16_t*>(w.data()), DType::bf16, {H}), eps,
                             Tensor(ref_add.data(), DType::bf16, {T, H}));
      Buffer dx = to_device(x), dr = to_device(res0), dw = to_device(w);
      Buffer out(size_t(T * H) * 2, Device::cuda()), out_add(size_t(T * H) * 2, Device::cuda());
      cuda::rms_norm(dx.data(), H, nullptr, 0, dw.data(), out.data(), H, T, H, eps, false, nullptr);
      cuda::rms_norm(dx.data(), H, dr.data(), H, dw.data(), out_add.data(), H, T, H, eps, true, nullptr);
      const auto got = to_host<bf16_t>(out, size_t(T * H));
      const auto got_add = to_host<bf16_t>(out_add, size_t(T * H));
      const auto got_res = to_host<bf16_t>(dr, size_t(T * H));
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].bits, ref[i].bits) << "rms_norm H " << H << " T " << T << " i " << i;
        ASSERT_EQ(got_res[i].bits, ref_res[i].bits) << "residual H " << H << " T " << T << " i " << i;
        ASSERT_EQ(got_add[i].bits, ref_add[i].bits) << "add_rms_norm H " << H << " T " << T << " i " << i;
      }
    }
  }
}

TEST(CudaElementwise, RmsNormRowStrides) {
  KILN_REQUIRE_GPU();
  const int64_t T = 5, H = 64, ld = 96;
  const auto x = random_bf16(size_t(T * ld), 11);
  const auto w = random_bf16(size_t(H), 12, 0.5f, 1.5f);
  std::vector<bf16_t> ref(size_t(T * ld));
  ops::cpu::rms_norm(Tensor::strided(const_cast<bf16_t*>(x.data()), DType::bf16, {T, H}, {ld, 1}),
                     Tensor(const_cast<bf16_t*>(w.data()), DType::bf16, {H}), 1e-6f,
                     Tensor::strided(ref.data(), DType::bf16, {T, H}, {ld, 1}));
  Buffer dx = to_device(x), dw = to_device(w), out(size_t(T * ld) * 2, Device::cuda());
  cuda::rms_norm(dx.data(), ld, nullptr, 0, dw.data(), out.data(), ld, T, H, 1e-6f, false, nullptr);
  const auto got = to_host<bf16_t>(out, size_t(T * ld));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(got[size_t(t * ld + i)].bits, ref[size_t(t * ld + i)].bits);
}

TEST(CudaElementwise, SiluMulWithinOneUlpOfCpu) {
  KILN_REQUIRE_GPU();
  for (int64_t I : {8, 3072, 9728}) {
    const int64_t T = 9;
    const auto in = random_bf16(size_t(T * 2 * I), uint32_t(I), -8.0f, 8.0f);
    std::vector<bf16_t> ref(size_t(T * I));
    ops::cpu::silu_and_mul(Tensor(const_cast<bf16_t*>(in.data()), DType::bf16, {T, 2 * I}),
                           Tensor(ref.data(), DType::bf16, {T, I}));
    Buffer din = to_device(in), out(size_t(T * I) * 2, Device::cuda());
    cuda::silu_mul(din.data(), 2 * I, out.data(), I, T, I, nullptr);
    const auto got = to_host<bf16_t>(out, size_t(T * I));
    size_t exact = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LE(test::bf16_ulps(got[i], ref[i]), 1) << "I " << I << " i " << i;
      exact += got[i].bits == ref[i].bits;
    }
    EXPECT_GE(double(exact), 0.99 * double(got.size())) << "silu_mul should be nearly always bitwise";
  }
}

TEST(CudaElementwise, RoundToBf16AndRandomFill) {
  KILN_REQUIRE_GPU();
  const int64_t R = 3, C = 10, ld = 16;
  std::vector<float> x(size_t(R * ld));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + float(i) * 1.2345e-3f;
  Buffer dx = to_device(x);
  cuda::round_f32_to_bf16(static_cast<float*>(dx.data()), R, C, ld, nullptr);
  const auto got = to_host<float>(dx, x.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const size_t i = size_t(r * ld + c);
      EXPECT_EQ(got[i], c < C ? bf16_to_f32(f32_to_bf16(x[i])) : x[i]);
    }
  // Random fill: reproducible for a seed, different across seeds, inside [offset - scale, offset + scale].
  const int64_t n = 100003;
  Buffer a(n * 2, Device::cuda()), b(n * 2, Device::cuda()), c(n * 2, Device::cuda());
  cuda::fill_random_bf16(a.data(), n, 42, 0.5f, 1.0f, nullptr);
  cuda::fill_random_bf16(b.data(), n, 42, 0.5f, 1.0f, nullptr);
  cuda::fill_random_bf16(c.data(), n, 43, 0.5f, 1.0f, nullptr);
  const auto ha = to_host<bf16_t>(a, n), hb = to_host<bf16_t>(b, n), hc = to_host<bf16_t>(c, n);
  size_t same_c = 0;
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(ha[size_t(i)].bits, hb[size_t(i)].bits);
    same_c += ha[size_t(i)].bits == hc[size_t(i)].bits;
    const float v = bf16_to_f32(ha[size_t(i)]);
    ASSERT_TRUE(v >= 0.5f && v <= 1.5f) << v;
    mean += v;
  }
  EXPECT_LT(same_c, size_t(n / 20));
  EXPECT_NEAR(mean / double(n), 1.0, 0.01);
}

}  // namespace
}  // namespace kiln
