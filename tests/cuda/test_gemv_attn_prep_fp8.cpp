// The fused QKV GEMV + attention preparation (ops/cuda/gemv_attn_prep.h) on block-FP8 weights: bitwise the
// fused kernel on dequantize_fp8's bf16 weight (itself bitwise gemv then attn_prep: test_gemv_attn_prep.cpp),
// every buffer compared (qkv, Q, K/V pages, UE8M0 scales) after poisoning. Rows 1..8, head_dim 64 and 128,
// bf16 and fp8 caches, NHD and HND, K a multiple of 8 but not of 128, every one-tile config and both register
// caps; then a graph replayed with changing inputs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>

#include "attn_prep_case.h"
#include "fp8_weight_util.h"
#include "gemv_test_util.h"
#include "ops/cuda/gemv_attn_prep.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using cuda::GemvConfig;
using test::Case;
using test::CaseCfg;
using test::DeviceCase;

void run_fused(Case& in, DeviceCase& dev, const Buffer& x, int64_t k, const cuda::GemvWeight& w,
               GemvConfig cfg, cudaStream_t s = nullptr, bool pdl = false, int cap = -1) {
  const ops::AttnPrepArgs a = in.args(dev.base, Device::cuda());
  const cuda::AttnPrepParams p = ops::attn_prep_params(a);
  ASSERT_TRUE(cuda::gemv_attn_prep_supported(in.c.T, k, x.data(), k, w, p)) << in.c.describe();
  cuda::gemv_attn_prep(x.data(), k, w, in.c.T, k, p, cfg, s, pdl, cap);
}

TEST(GemvAttnPrepFp8, BitwiseTheFusedKernelOnDequantizedWeights) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(43);
  int runs = 0;
  for (int i = 0; i < 24; ++i) {
    CaseCfg c;
    c.D = i % 2 ? 64 : 128;
    c.Hkv = 1 + int(rng() % 4);
    c.Hq = c.Hkv * (1 + int(rng() % 4));
    c.R = c.D;
    c.T = 1 + i % 8;
    c.cache = i % 3 == 0 ? DType::f8e4m3 : DType::bf16;
    c.layout = i % 4 < 2 ? test::KvLayout::hnd : test::KvLayout::nhd;
    c.q_contig = i % 5 != 0;
    c.mrope = i % 6 == 5 ? 2 : 0;
    c.skip = 0.25;
    Case in(c, rng);
    const int64_t K = i % 2 ? 520 : 1032, N = int64_t(c.Hq + 2 * c.Hkv) * c.D;
    const test::Fp8TestWeight w(N, K, uint32_t(rng()));
    // Norm-sized activations so the qkv rows stay O(1) against weights up to ~3.5.
    const Buffer x = test::to_device(test::random_bf16(size_t(c.T * K), uint32_t(rng()), -0.05f, 0.05f));
    std::memset(in.qkv.data(), 0xff, in.qkv.size());
    DeviceCase dev(in);
    for (const GemvConfig g : test::fusable_gemv_configs())
      for (const int cap : {0, 3}) {
        if (cap == 3 && !g.tensor_cores) continue;
        dev.upload(in);
        run_fused(in, dev, x, K, w.bf16(), g, nullptr, false, cap);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        Case want = dev.download(in);
        dev.upload(in);
        run_fused(in, dev, x, K, w.fp8(), g, nullptr, false, cap);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(dev.diff(want), "")
            << "case " << i << " " << test::gemv_config_name(g) << " cap " << cap << ": " << c.describe();
        ++runs;
      }
  }
  std::printf("[ gemv_attn_prep fp8 ] %d fused runs compared bit for bit\n", runs);
}

TEST(GemvAttnPrepFp8, GraphReplaysWithChangingInputs) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(44);
  CaseCfg c;  // Qwen3-4B-like decode rows on a K that is not a multiple of 128, Q in place, slots < 0
  c.T = 8;
  c.Hq = 8;
  c.Hkv = 2;
  c.q_contig = false;
  c.skip = 0.25;
  const int64_t K = 1032, N = int64_t(c.Hq + 2 * c.Hkv) * c.D;
  Case in(c, rng);
  const test::Fp8TestWeight w(N, K, 45);
  Buffer x(size_t(c.T * K) * 2, Device::cuda());
  DeviceCase dev(in);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run_fused(in, dev, x, K, w.fp8(), GemvConfig{8, true}, s, true);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t ge;
  ASSERT_EQ(cudaGraphInstantiate(&ge, graph, 0), cudaSuccess);
  for (int r = 0; r < 4; ++r) {
    in.randomize(rng);
    std::memset(in.qkv.data(), 0xff, in.qkv.size());
    const auto xv = test::random_bf16(size_t(c.T * K), uint32_t(rng()), -0.05f, 0.05f);
    copy_bytes(x.data(), Device::cuda(), xv.data(), Device::cpu(), xv.size() * 2);
    dev.upload(in);
    run_fused(in, dev, x, K, w.bf16(), GemvConfig{8, true}, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    Case want = dev.download(in);
    dev.upload(in);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(dev.diff(want), "") << "replay " << r;
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace kiln
