// The QKV GEMV fused with the attention preparation (ops/cuda/gemv_attn_prep.h) against the two kernels it
// replaces, bit for bit: cuda::gemv (same config) into the qkv rows, then attn_prep (its fused decode
// kernel). Every buffer either path may touch (qkv with its row padding, Q out, K/V pages, UE8M0 scales) is
// poisoned before each run (qkv with NaN, the others with patterns) and compared in full. Covered: batch rows
// 1, 3, 5, 8 (and the rest), head_dim 64 and 128, GQA 1, 2, 4, 8, bf16 and fp8 caches, NHD and HND, page
// sizes 1 / 16 / 32, plain RoPE and M-RoPE (sectioned and interleaved, distinct t/h/w rows), partial rotary,
// Q in place and contiguous, slot < 0, every GEMV config; launches back to back across grid sizes (the
// per-head counters reset); a replayed CUDA graph with changing inputs, with and without PDL; the op
// dispatcher (ops::linear_attn_prep) fused where the GEMV is the tactic and unfused otherwise; the guards and
// the errors before any launch (host only: that test also runs without a GPU).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "attn_prep_case.h"
#include "common/test_support.h"
#include "gemv_test_util.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_attn_prep.h"
#include "ops/linear.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using cuda::GemvConfig;
using test::Case;
using test::CaseCfg;
using test::DeviceCase;

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> v) {
  return *(v.begin() + rng() % v.size());
}

// One case: the attn_prep buffers (qkv poisoned with NaN: the GEMV writes it), x [T, K] and W [N, K].
struct FusedCase {
  Case in;
  int64_t K;
  Buffer x, w;
  FusedCase(const CaseCfg& c, int64_t k, std::mt19937_64& rng) : in(c, rng), K(k) {
    nan_qkv();
    const int64_t N = int64_t(c.Hq + 2 * c.Hkv) * c.D;
    // Norm-sized activations and weights ~ 1/sqrt(K), so the qkv rows are O(1) like a model's.
    x = test::to_device(test::random_bf16(size_t(c.T * K), uint32_t(rng()), -1.0f, 1.0f));
    const float s = 2.0f / std::sqrt(float(K));
    w = test::to_device(test::random_bf16(size_t(N * K), uint32_t(rng()), -s, s));
  }
  void nan_qkv() { std::memset(in.qkv.data(), 0xff, in.qkv.size()); }
  void new_x(std::mt19937_64& rng) {
    const auto v = test::random_bf16(size_t(in.c.T * K), uint32_t(rng()), -1.0f, 1.0f);
    copy_bytes(x.data(), Device::cuda(), v.data(), Device::cpu(), v.size() * 2);
  }
};

// The unfused composition on the device: gemv (cfg) into the qkv rows, then attn_prep's dispatcher.
void run_reference(FusedCase& f, DeviceCase& dev, GemvConfig cfg, cudaStream_t s = nullptr) {
  ops::AttnPrepArgs a = f.in.args(dev.base, Device::cuda());
  a.stream = s;
  cuda::gemv(f.x.data(), f.K, f.w.data(), f.K, a.qkv.data, a.qkv.stride[0], f.in.c.T, a.qkv.shape[1], f.K,
             cuda::GemvEpilogue::bf16, cfg, s);
  const ops::AttnPrepPath path = ops::attn_prep(a);
  ASSERT_EQ(path, ops::AttnPrepPath::cuda_fused_decode) << f.in.c.describe();
}

void run_fused(FusedCase& f, DeviceCase& dev, GemvConfig cfg, cudaStream_t s = nullptr, bool pdl = false,
               int cap = -1) {
  const ops::AttnPrepArgs a = f.in.args(dev.base, Device::cuda());
  const cuda::AttnPrepParams p = ops::attn_prep_params(a);
  ASSERT_TRUE(cuda::gemv_attn_prep_supported(f.in.c.T, f.K, f.x.data(), f.K, f.w.data(), f.K, p))
      << f.in.c.describe();
  cuda::gemv_attn_prep(f.x.data(), f.K, f.w.data(), f.K, f.in.c.T, f.K, p, cfg, s, pdl, cap);
}

CaseCfg random_cfg(std::mt19937_64& rng) {
  CaseCfg c;
  c.act = DType::bf16;
  c.D = pick(rng, {64, 128});
  const int gqa = pick(rng, {1, 2, 4, 8});
  c.Hkv = pick(rng, {1, 2, 4, 8});
  c.Hq = c.Hkv * gqa;
  c.R = pick(rng, {c.D, c.D, c.D / 2});
  c.mrope = pick(rng, {0, 0, 1, 2});
  if (c.mrope) c.R = c.D;
  c.pos64 = rng() % 2;
  c.pos_pad = pick<int64_t>(rng, {0, 0, 1, 5});
  c.q_contig = rng() % 2;
  c.q_head_pad = c.q_contig ? pick<int64_t>(rng, {0, 8}) : 0;
  c.row_pad = pick<int64_t>(rng, {0, 0, 64, 8});
  c.layout = rng() % 2 ? test::KvLayout::nhd : test::KvLayout::hnd;
  c.page = pick(rng, {1, 16, 32});
  c.cache = pick(rng, {DType::bf16, DType::f8e4m3});
  c.cache_pad = pick<int64_t>(rng, {0, 16});
  c.T = pick(rng, {1, 3, 5, 8, 2, 4, 6, 7});
  c.skip = pick(rng, {0.0, 0.25, 0.5});
  return c;
}

TEST(GemvAttnPrep, BitwiseEqualToGemvThenAttnPrep) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261201);
  const char* e = std::getenv("KILN_GEMV_ATTN_PREP_CASES");
  const int n = e ? std::atoi(e) : 160;
  int runs = 0;
  for (int i = 0; i < n; ++i) {
    const CaseCfg cfg = random_cfg(rng);
    FusedCase f(cfg, pick<int64_t>(rng, {256, 520, 1024}), rng);
    DeviceCase dev(f.in);
    for (const GemvConfig g : test::fusable_gemv_configs()) {
      dev.upload(f.in);
      run_reference(f, dev, g);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Case want = dev.download(f.in);
      // Both register caps of the tensor-core kernel (gemv.h: gemv_tail_min_blocks): the same bits.
      for (const int cap : {0, 3}) {
        if (cap == 3 && !g.tensor_cores) continue;
        dev.upload(f.in);
        run_fused(f, dev, g, nullptr, false, cap);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(dev.diff(want), "") << "case " << i << " " << (g.tensor_cores ? "tc" : "fma") << " warps "
                                      << g.warps << " cap " << cap << ": " << cfg.describe();
        ++runs;
      }
    }
  }
  std::printf("[ gemv_attn_prep ] %d cases, %d fused runs compared bit for bit\n", n, runs);
}

// The Qwen3-4B decode shape (K 2560, 32/8 heads, D128, page 32, HND) and the 0.6B one (K 1024, 16/8), bf16
// and fp8 caches, M-RoPE with distinct t/h/w rows, rows 1, 3, 5, 8.
TEST(GemvAttnPrep, ModelShapes) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(5);
  for (const auto& [K, Hq] : {std::pair<int64_t, int>{2560, 32}, {1024, 16}}) {
    for (const int T : {1, 3, 5, 8}) {
      for (const DType cache : {DType::bf16, DType::f8e4m3}) {
        for (const int mrope : {0, 2}) {
          CaseCfg c;
          c.T = T, c.Hq = Hq, c.Hkv = 8, c.D = 128, c.R = 128, c.q_contig = false, c.cache = cache;
          c.mrope = mrope, c.skip = 0.2;
          FusedCase f(c, K, rng);
          DeviceCase dev(f.in);
          for (const GemvConfig g : {GemvConfig{4, false}, GemvConfig{8, true}, GemvConfig{16, true}}) {
            dev.upload(f.in);
            run_reference(f, dev, g);
            Case want = dev.download(f.in);
            dev.upload(f.in);
            run_fused(f, dev, g);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            ASSERT_EQ(dev.diff(want), "") << "K " << K << " warps " << g.warps << ": " << c.describe();
          }
        }
      }
    }
  }
}

// Capture once, replay with fresh x, positions, slots (and poisoned outputs) copied into the captured
// buffers; each replay against the eager reference on the same inputs. PDL on and off.
void graph_replays(CaseCfg c, GemvConfig g, bool pdl) {
  std::mt19937_64 rng(17 + c.T);
  FusedCase f(c, 2560, rng);
  DeviceCase dev(f.in);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run_fused(f, dev, g, s, pdl);
  run_fused(f, dev, g, s, pdl);  // twice in one graph: the counters are back at 0 for the second launch
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t ge;
  ASSERT_EQ(cudaGraphInstantiate(&ge, graph, 0), cudaSuccess);
  for (int r = 0; r < 8; ++r) {
    f.in.randomize(rng);
    f.nan_qkv();
    f.new_x(rng);
    // The graph runs the kernel twice on the same rows; the second GEMV rewrites the rows (Q in place
    // included) from x before preparing them again, so the bytes are those of one run.
    dev.upload(f.in);
    run_reference(f, dev, g, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    Case want = dev.download(f.in);
    dev.upload(f.in);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(dev.diff(want), "") << "replay " << r << " pdl " << pdl << ": " << c.describe();
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST(GemvAttnPrep, GraphReplaysWithChangingInputs) {
  KILN_REQUIRE_GPU();
  CaseCfg decode;  // Qwen3-4B decode, 8 rows, BF16 HND cache, Q in place
  decode.T = 8;
  decode.q_contig = false;
  decode.skip = 0.25;   // padded rows: slot < 0
  CaseCfg vl = decode;  // FP8 NHD cache, interleaved M-RoPE, Q contiguous, 3 rows
  vl.T = 3;
  vl.cache = DType::f8e4m3;
  vl.layout = test::KvLayout::nhd;
  vl.mrope = 2;
  vl.q_contig = true;
  for (const bool pdl : {false, true}) {
    graph_replays(decode, GemvConfig{8, true}, pdl);
    graph_replays(vl, GemvConfig{4, false}, pdl);
  }
}

// ops::linear_attn_prep: one kernel where the engine's tactic for the QKV shape is the GEMV and the switch is
// on, the two ops otherwise (switch off, or M outside the tuned bucket); the same bytes either way.
TEST(GemvAttnPrep, OpDispatcher) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(23);
  CaseCfg c;
  c.T = 5;
  c.q_contig = false;
  FusedCase f(c, 2560, rng);
  DeviceCase dev(f.in);
  const int64_t N = int64_t(c.Hq + 2 * c.Hkv) * c.D;
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const std::string path =
      (kiln::test_support::process_scratch_dir("gemv_attn_prep") / "tactics.txt").string();
  test::write_gemv_cache(eng, path, {8, N, f.K, cuda::GemmOut::bf16}, GemvConfig{8, true});
  ASSERT_TRUE(eng.load(path));
  std::filesystem::remove(path);
  const ops::AttnPrepArgs a = f.in.args(dev.base, Device::cuda());
  const Tensor x(f.x.data(), DType::bf16, {c.T, f.K}, Device::cuda()),
      w(f.w.data(), DType::bf16, {N, f.K}, Device::cuda());
  dev.upload(f.in);
  run_reference(f, dev, GemvConfig{8, true});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Case want = dev.download(f.in);
  for (const bool on : {true, false}) {
    eng.set_gemv_attn_prep(on);
    dev.upload(f.in);
    const ops::AttnPrepPath path_taken = ops::linear_attn_prep(x, w, a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(path_taken, on ? ops::AttnPrepPath::cuda_gemv_fused : ops::AttnPrepPath::cuda_fused_decode);
    EXPECT_EQ(dev.diff(want), "") << "switch " << on;
  }
  eng.set_gemv_attn_prep(false);
}

// The guards (host code: runs without a GPU too) and the throw before any launch.
TEST(GemvAttnPrep, GuardsAndBadArguments) {
  cuda::AttnPrepParams p;
  p.T = 1, p.Hq = 32, p.Hkv = 8, p.D = 128, p.rotary_dim = 128;
  void* const a16 = reinterpret_cast<void*>(uintptr_t(1) << 20);  // any 16-byte aligned address
  p.q_dst = a16;
  p.qkv = p.q_norm = p.k_norm = a16;
  p.rope = static_cast<const float*>(a16);
  p.k_cache = p.v_cache = a16;
  p.qkv_row = 6144, p.q_row = 6144, p.q_head = 128;
  p.c_page = 32 * 8 * 128, p.c_row = 128, p.c_head = 32 * 128;
  p.num_slots = 1024, p.page_size = 32;
  const int64_t K = 2560;
  EXPECT_TRUE(cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K, p));
  auto with = [&](auto&& change) {
    cuda::AttnPrepParams q = p;
    change(q);
    return q;
  };
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(2, K, a16, K, a16, K, p));  // T != m
  for (const int m : {0, 9}) {
    EXPECT_FALSE(cuda::gemv_attn_prep_supported(m, K, a16, K, a16, K, with([&](auto& q) { q.T = m; })));
  }
  EXPECT_TRUE(cuda::gemv_attn_prep_supported(8, K, a16, K, a16, K, with([](auto& q) { q.T = 8; })));
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K,
                                              with([](auto& q) { q.act = cuda::ActKind::f16; })));
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K,
                                              with([](auto& q) { q.cache = cuda::CacheKind::f16; })));
  EXPECT_TRUE(cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K,
                                             with([](auto& q) { q.cache = cuda::CacheKind::fp8; })));
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(
      1, K, a16, K, a16, K, with([](auto& q) { q.D = 256, q.rotary_dim = 256, q.qkv_row = 48 * 256; })));
  EXPECT_FALSE(
      cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K, with([](auto& q) { q.rotary_dim = 120; })));
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K, with([](auto& q) {
                                                q.Hq = 512, q.qkv_row = (512 + 16) * 128;
                                              })));  // > kGemvAttnPrepMaxHeads heads
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(1, K, a16, K, a16, K, with([](auto& q) { q.qkv_row = 6140; })));
  const void* odd = static_cast<const char*>(a16) + 8;
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(1, K, odd, K, a16, K, p));              // x not 16-byte aligned
  EXPECT_FALSE(cuda::gemv_attn_prep_supported(1, K + 4, a16, K + 4, a16, K + 4, p));  // K % 8
  // Rejected before anything is launched (no GPU needed to get the error).
  EXPECT_THROW(cuda::gemv_attn_prep(a16, K, a16, K, 2, K, p, GemvConfig{8, true}, nullptr), Error);
  EXPECT_THROW(cuda::gemv_attn_prep(a16, K, a16, K, 1, K, p, GemvConfig{3, true}, nullptr), Error);
  EXPECT_THROW(cuda::gemv_attn_prep(a16, K, a16, K, 1, K, p, GemvConfig{8, true}, nullptr, false, 2), Error);
  EXPECT_NO_THROW(cuda::gemv_attn_prep(a16, K, a16, K, 0, K, p, GemvConfig{8, true}, nullptr));  // m == 0
}

}  // namespace
}  // namespace kiln
