// The GPU rounding helpers of the attn_prep kernels (src/ops/cuda/attn_prep_common.cuh) against the CPU
// rules of the contract: f32 -> bf16 / f16 (RNE, NaN -> 0x7fff) and f32 -> E4M3 (fp8.h: RNE, saturating,
// NaN -> 0x7f), over every bf16 and f16 bit pattern widened to f32 and 2^20 random f32 bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kiln/tensor.h"
#include "ops/cuda/attn_prep_common.cuh"

namespace {

using namespace kiln;
using namespace kiln::cuda;

__global__ void convert_kernel(const float* in, int n, uint16_t* bf, uint16_t* hf, uint8_t* e4,
                               uint32_t* pair) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = in[i];
  bf[i] = attn::act_round<ActKind::bf16>(v);
  hf[i] = attn::act_round<ActKind::f16>(v);
  e4[i] = uint8_t(attn::e4m3x2(v, 0.f) & 0xffu);
  // The packed forms must agree with the scalar ones (lo = v, hi = -v).
  pair[i] = attn::act_round2<ActKind::bf16>(v, -v) ^ (attn::e4m3x2(1.f, v) >> 8);
}

uint16_t cpu_round(bool bf16, float v) {
  if (std::isnan(v)) return 0x7fff;
  return bf16 ? f32_to_bf16(v).bits : f32_to_f16(v).bits;
}

TEST(AttnPrepConvert, GpuRoundingEqualsContract) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible: GPU conversion test skipped";
  std::vector<float> in;
  for (uint32_t b = 0; b < 65536; ++b) in.push_back(bf16_to_f32(bf16_t{uint16_t(b)}));
  for (uint32_t b = 0; b < 65536; ++b) in.push_back(f16_to_f32(f16_t{uint16_t(b)}));
  std::mt19937 rng(5);
  for (int i = 0; i < (1 << 20); ++i) in.push_back(f32_from_bits(rng()));
  // Scaled bf16 values land on E4M3 ties and subnormals at every exponent the quantiser produces.
  for (uint32_t b = 0; b < 65536; ++b) in.push_back(bf16_to_f32(bf16_t{uint16_t(b)}) * 0.0078125f);
  const int n = int(in.size());
  Buffer d_in(n * 4, Device::cuda()), d_bf(n * 2, Device::cuda()), d_hf(n * 2, Device::cuda()),
      d_e4(n, Device::cuda()), d_pair(n * 4, Device::cuda());
  copy_bytes(d_in.data(), Device::cuda(), in.data(), Device::cpu(), n * 4);
  convert_kernel<<<(n + 255) / 256, 256>>>(
      static_cast<const float*>(d_in.data()), n, static_cast<uint16_t*>(d_bf.data()),
      static_cast<uint16_t*>(d_hf.data()), static_cast<uint8_t*>(d_e4.data()),
      static_cast<uint32_t*>(d_pair.data()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> bf(n), hf(n);
  std::vector<uint8_t> e4(n);
  std::vector<uint32_t> pair(n);
  copy_bytes(bf.data(), Device::cpu(), d_bf.data(), Device::cuda(), n * 2);
  copy_bytes(hf.data(), Device::cpu(), d_hf.data(), Device::cuda(), n * 2);
  copy_bytes(e4.data(), Device::cpu(), d_e4.data(), Device::cuda(), n);
  copy_bytes(pair.data(), Device::cpu(), d_pair.data(), Device::cuda(), n * 4);
  int bad = 0;
  for (int i = 0; i < n && bad < 10; ++i) {
    const float v = in[i];
    const uint32_t want_pair = (uint32_t(cpu_round(true, v)) | uint32_t(cpu_round(true, -v)) << 16) ^
                               ((uint32_t(f32_to_e4m3(1.f)) | uint32_t(f32_to_e4m3(v)) << 8) >> 8);
    if (bf[i] != cpu_round(true, v) || hf[i] != cpu_round(false, v) || e4[i] != f32_to_e4m3(v) ||
        pair[i] != want_pair) {
      ADD_FAILURE() << "input 0x" << std::hex << f32_bits(v) << ": bf16 0x" << bf[i] << " want 0x"
                    << cpu_round(true, v) << ", f16 0x" << hf[i] << " want 0x" << cpu_round(false, v)
                    << ", e4m3 0x" << int(e4[i]) << " want 0x" << int(f32_to_e4m3(v)) << ", pair 0x"
                    << pair[i] << " want 0x" << want_pair;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
