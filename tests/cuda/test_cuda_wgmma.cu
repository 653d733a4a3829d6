// The Hopper building blocks of prefill v4 alone (src/ops/cuda/sm90.cuh, wgmma_bf16.cuh), one warpgroup,
// against a CPU product: the 128-byte-swizzled shared-memory layout and its descriptors, K-major A and B
// (S = Q K^T: wgmma_m64n128k16_ss over D = 128), A from registers in the accumulator-derived fragment layout
// with an MN-major B (O = P V: wgmma_m64n128k16_rs and _m64n64k16_rs over 128 keys). If prefill v4 fails and
// these pass, the fault is in the pipeline (barriers, TMA, masking), not in the MMA layouts. Runs only on
// an sm_90 device with the sm_90a build (skipped elsewhere, and said so).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kiln/tensor.h"
#include "ops/cuda/wgmma_bf16.cuh"
#include "test_util_cuda.h"

namespace {

using namespace kiln;
namespace sm90 = kiln::cuda::sm90;

constexpr int kM = 64, kK = 128;  // rows of the warpgroup, reduction length (D for S, keys for P V)

// Stores rows x cols bf16 (row-major in global, cols a multiple of 64) into 128-byte-swizzled column blocks
// of `rows` rows at smem address dst, as the prefill v4 kernel lays out Q, K and V. Defined only where its
// callers (the sm_90a kernel bodies below) are compiled: an sm_80 pass would otherwise find it unreferenced.
#ifdef KILN_SM90A
__device__ void store_swizzled(const uint16_t* src, int rows, int cols, uint32_t dst) {
  const int c8 = cols / 8;
  for (int i = int(threadIdx.x); i < rows * c8; i += 128) {
    const int r = i / c8, cc = i % c8;
    const uint4 v = *reinterpret_cast<const uint4*>(src + r * cols + cc * 8);
    const uint32_t a = dst + uint32_t(cc / 8) * uint32_t(rows * 128) + sm90::sw128_offset(r, cc % 8);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
  sm90::fence_proxy_async();
  __syncthreads();
}
#endif  // KILN_SM90A

// Writes accumulator d (N columns) of the warpgroup to out [64][N] in the documented layout.
template <int N>
__device__ void store_acc(const float (&d)[N / 2], float* out) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * warp + lane / 4 + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    out[row * N + col] = d[i];
  }
}

// out [64][128] = a [64][128] * b [128][128]^T (b K-major: row n holds the 128 k of column n).
__global__ void ss_kernel(const uint16_t* a, const uint16_t* b, float* out) {
#ifdef KILN_SM90A
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = (sm90::smem_u32(smem) + 1023u) & ~1023u, sa = base, sb = base + kM * kK * 2;
  store_swizzled(a, kM, kK, sa);
  store_swizzled(b, 128, kK, sb);
  float d[64];
  for (float& x : d) x = 0.0f;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t col = uint32_t(kk / 4), k32 = uint32_t(kk % 4) * 32;
    sm90::wgmma_m64n128k16_ss(d, sm90::sw128_desc(sa + col * (kM * 128) + k32, 16, 1024),
                              sm90::sw128_desc(sb + col * (128 * 128) + k32, 16, 1024), kk > 0 ? 1u : 0u);
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  store_acc<128>(d, out);
#else
  (void)a, (void)b, (void)out;
#endif
}

// out [64][N] = p [64][128] * v [128][N] (v MN-major: row k holds the N columns), p from registers.
template <int N>
__global__ void rs_kernel(const uint16_t* p, const uint16_t* v, float* out) {
#ifdef KILN_SM90A
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t sv = (sm90::smem_u32(smem) + 1023u) & ~1023u;
  store_swizzled(v, kK, N, sv);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, r0 = 16 * warp + lane / 4;
  const auto pair = [&](int r, int k) {
    return uint32_t(p[r * kK + k]) | (uint32_t(p[r * kK + k + 1]) << 16);
  };
  uint32_t pa[kK / 16][4];
  for (int kk = 0; kk < kK / 16; ++kk) {
    const int k = 16 * kk + 2 * (lane % 4);
    pa[kk][0] = pair(r0, k);
    pa[kk][1] = pair(r0 + 8, k);
    pa[kk][2] = pair(r0, k + 8);
    pa[kk][3] = pair(r0 + 8, k + 8);
  }
  float d[N / 2];
  for (float& x : d) x = 0.0f;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const sm90::WgmmaDesc dv = sm90::sw128_desc(sv + uint32_t(kk) * 2048, kK * 128, 1024);
    if constexpr (N == 128)
      sm90::wgmma_m64n128k16_rs(d, pa[kk], dv, 1u);
    else
      sm90::wgmma_m64n64k16_rs(d, pa[kk], dv, 1u);
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  store_acc<N>(d, out);
#else
  (void)p, (void)v, (void)out;
#endif
}

bool runs_sm90a() {
  if (!cuda_available()) return false;
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  cudaFuncAttributes attr{};
  return major == 9 && minor == 0 && cudaFuncGetAttributes(&attr, ss_kernel) == cudaSuccess &&
         attr.binaryVersion == 90;
}

std::vector<uint16_t> bits(const std::vector<bf16_t>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
  return b;
}

// Compares got [64][N] with ref; prints the first few mismatches (row, col, got, expected).
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, int N, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::fabs(got[i] - ref[i]) <= 1e-3 * (1 + std::fabs(ref[i]))) continue;
    if (bad++ < 8)
      std::printf("[wgmma %s] row %zu col %zu: got %.6f expected %.6f\n", what, i / size_t(N), i % size_t(N),
                  double(got[i]), ref[i]);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements off";
}

TEST(CudaWgmma, SharedSharedKMajorMatchesCpu) {
  if (!runs_sm90a()) GTEST_SKIP() << "needs an sm_90 device running the sm_90a build: skipped";
  const auto a = test::random_bf16(size_t(kM) * kK, 1), b = test::random_bf16(size_t(128) * kK, 2);
  std::vector<double> ref(size_t(kM) * 128);
  for (int i = 0; i < kM; ++i)
    for (int n = 0; n < 128; ++n) {
      double s = 0;
      for (int k = 0; k < kK; ++k)
        s += double(bf16_to_f32(a[size_t(i * kK + k)])) * bf16_to_f32(b[size_t(n * kK + k)]);
      ref[size_t(i * 128 + n)] = s;
    }
  const Buffer da = test::to_device(bits(a)), db = test::to_device(bits(b));
  Buffer dout(ref.size() * 4, Device::cuda());
  const size_t smem = 1024 + size_t(kM + 128) * kK * 2;
  ASSERT_EQ(cudaFuncSetAttribute(ss_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
            cudaSuccess);
  ss_kernel<<<1, 128, smem>>>(static_cast<const uint16_t*>(da.data()),
                              static_cast<const uint16_t*>(db.data()), static_cast<float*>(dout.data()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(test::to_host<float>(dout, ref.size()), ref, 128, "ss m64n128k16");
}

template <int N>
void check_rs() {
  const auto p = test::random_bf16(size_t(kM) * kK, 3), v = test::random_bf16(size_t(kK) * N, 4);
  std::vector<double> ref(size_t(kM) * N);
  for (int i = 0; i < kM; ++i)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < kK; ++k)
        s += double(bf16_to_f32(p[size_t(i * kK + k)])) * bf16_to_f32(v[size_t(k * N + n)]);
      ref[size_t(i * N + n)] = s;
    }
  const Buffer dp = test::to_device(bits(p)), dv = test::to_device(bits(v));
  Buffer dout(ref.size() * 4, Device::cuda());
  const size_t smem = 1024 + size_t(kK) * N * 2;
  ASSERT_EQ(cudaFuncSetAttribute(rs_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
            cudaSuccess);
  rs_kernel<N><<<1, 128, smem>>>(static_cast<const uint16_t*>(dp.data()),
                                 static_cast<const uint16_t*>(dv.data()), static_cast<float*>(dout.data()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(test::to_host<float>(dout, ref.size()), ref, N, N == 128 ? "rs m64n128k16" : "rs m64n64k16");
}

TEST(CudaWgmma, RegisterAMnMajorBMatchesCpu) {
  if (!runs_sm90a()) GTEST_SKIP() << "needs an sm_90 device running the sm_90a build: skipped";
  check_rs<128>();
  check_rs<64>();
}

}  // namespace
