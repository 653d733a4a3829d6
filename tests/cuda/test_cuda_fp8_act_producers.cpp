// The fused W8A8 activation producers (ops/cuda/fp8_act_producers.h, issue 43): SiLU-and-multiply and the
// (add +) RMSNorm writing the W8A8 GEMM's workspace are byte for byte fp8_quantize_act on the unfused
// kernel's bf16 output (both workspaces poisoned alike first, so a stray or a missing write fails), with K
// not a multiple of 128, M not a multiple of 128, rows of zeros and of large magnitudes; GemmEngine's entry
// (fp8_gemm_takes / fp8_gemm_input / run_prequantized) applies only where run() takes the W8A8 GEMM and
// equals run() bitwise there; and an FP8 model's prefill logits are the same bits with
// KILN_FP8_FUSED_ACT_QUANT on and off while the fused path runs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/model_steps.h"
#include "common/test_support.h"
#include "gemv_test_util.h"
#include "model/qwen3.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_act_producers.h"
#include "ops/cuda/fp8_gemm.h"
#include "ops/cuda/gemm.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

#define KILN_REQUIRE_FP8_GEMM()                                                                      \
  do {                                                                                               \
    KILN_REQUIRE_GPU();                                                                              \
    if (!cuda::fp8_gemm_supported(128, 128, 128, 128, 128, 128)) GTEST_SKIP() << "not an sm_90 GPU"; \
  } while (0)

// Random bf16 [rows, ld] in [-1, 1] with row r scaled: r % 7 == 3 all zeros, r % 7 == 5 by 2^(r % 5 * 30)
// (up to 2^120: squares and products overflow), else by 2^(r % 9 - 4).
std::vector<bf16_t> make_rows(int64_t rows, int64_t ld, uint32_t seed) {
  std::vector<bf16_t> x = test::random_bf16(size_t(rows * ld), seed);
  for (int64_t r = 0; r < rows; ++r) {
    const float f = r % 7 == 3 ? 0.0f : std::ldexp(1.0f, r % 7 == 5 ? int(r % 5) * 30 : int(r % 9) - 4);
    for (int64_t c = 0; c < ld; ++c) {
      bf16_t& v = x[size_t(r * ld + c)];
      v = f32_to_bf16(bf16_to_f32(v) * f);
    }
  }
  return x;
}

// Every byte of two equally sized device buffers: the index of the first difference, or -1.
int64_t first_difference(const Buffer& a, const Buffer& b) {
  const auto x = to_host<uint8_t>(a, a.bytes()), y = to_host<uint8_t>(b, b.bytes());
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return int64_t(i);
  return -1;
}

TEST(CudaFp8ActProducers, SiluMulWorkspaceIsTheQuantizerOnSiluMulBitwise) {
  KILN_REQUIRE_FP8_GEMM();
  struct Case {
    int64_t m, i, pad;  // gate_up row stride 2 i + pad
  };
  for (const Case c : {Case{1, 16, 0}, Case{9, 208, 8}, Case{37, 400, 0}, Case{130, 1040, 16},
                       Case{300, 9728, 0}, Case{257, 2560, 24}}) {
    const int64_t ld = 2 * c.i + c.pad, bytes = cuda::fp8_gemm_workspace_bytes(c.m, c.i);
    const Buffer gate_up = to_device(make_rows(c.m, ld, uint32_t(11 + c.m + c.i)));
    Buffer act(size_t(c.m * c.i) * 2, Device::cuda()), want(size_t(bytes), Device::cuda()),
        got(size_t(bytes), Device::cuda());
    test::poison(want);
    test::poison(got);
    cuda::silu_mul(gate_up.data(), ld, act.data(), c.i, c.m, c.i, nullptr);
    cuda::fp8_quantize_act(act.data(), c.i, c.m, c.i, want.data(), bytes, nullptr);
    cuda::silu_mul_quantize_act(gate_up.data(), ld, c.m, c.i, got.data(), bytes, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t d = first_difference(want, got);
    EXPECT_EQ(d, -1) << "M " << c.m << " I " << c.i << ": byte " << d << " (scales from "
                     << cuda::fp8_act_scale_offset(c.m, c.i) << ")";
  }
}

TEST(CudaFp8ActProducers, RmsNormWorkspaceIsTheQuantizerOnRmsNormBitwise) {
  KILN_REQUIRE_FP8_GEMM();
  // K 4112 and 5120: rows longer than the register cache (32 x 16 chunks), the second pass.
  for (const int64_t k :
       {int64_t(16), int64_t(208), int64_t(2560), int64_t(4096), int64_t(4112), int64_t(5120)})
    for (const int64_t m : {int64_t(1), int64_t(37), int64_t(130), int64_t(300)})
      for (const bool add : {false, true})
        for (const bool store : {false, true}) {
          const int64_t ld = k + 8, bytes = cuda::fp8_gemm_workspace_bytes(m, k);
          const auto xh = make_rows(m, ld, uint32_t(k + m)), rh = make_rows(m, ld, uint32_t(k + m + 1));
          const auto wh = test::random_bf16(size_t(k), uint32_t(k), 0.5f, 1.5f);
          const Buffer x = to_device(xh), w = to_device(wh), res_a = to_device(rh), res_b = to_device(rh);
          Buffer out_a(size_t(m * ld) * 2, Device::cuda()), out_b(size_t(m * ld) * 2, Device::cuda());
          Buffer want(size_t(bytes), Device::cuda()), got(size_t(bytes), Device::cuda());
          for (const Buffer* b : {&out_a, &out_b, &want, &got}) test::poison(*b);
          const float eps = 1e-6f;
          cuda::rms_norm(x.data(), ld, res_a.data(), ld, w.data(), out_a.data(), ld, m, k, eps, add, nullptr);
          cuda::fp8_quantize_act(out_a.data(), ld, m, k, want.data(), bytes, nullptr);
          cuda::rms_norm_quantize_act(x.data(), ld, add ? res_b.data() : nullptr, ld, w.data(),
                                      store ? out_b.data() : nullptr, ld, m, k, eps, add, got.data(), bytes,
                                      nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const std::string where = "K " + std::to_string(k) + " M " + std::to_string(m) +
                                    (add ? " add" : "") + (store ? " out" : "");
          EXPECT_EQ(first_difference(want, got), -1) << where << ": the workspace";
          EXPECT_EQ(first_difference(res_a, res_b), -1) << where << ": the residual";
          if (store) {
            // Only the rows' K columns are the output; the stride's padding stays poisoned in both.
            EXPECT_EQ(first_difference(out_a, out_b), -1) << where << ": the normed rows";
          } else {
            const auto o = to_host<uint8_t>(out_b, out_b.bytes());
            EXPECT_EQ(std::count(o.begin(), o.end(), uint8_t(0xff)), int64_t(o.size())) << where;
          }
        }
}

TEST(CudaFp8ActProducers, RefusesBadArgumentsBeforeLaunching) {
  KILN_REQUIRE_FP8_GEMM();
  Buffer in(size_t(64 * 1024), Device::cuda()), ws(size_t(1) << 20, Device::cuda());
  EXPECT_THROW(cuda::silu_mul_quantize_act(in.data(), 16, 2, 8, ws.data(), int64_t(ws.bytes()), nullptr),
               Error);  // I not a multiple of 16
  EXPECT_THROW(cuda::silu_mul_quantize_act(in.data(), 16, 2, 16, ws.data(), 64, nullptr), Error);  // small
  EXPECT_THROW(cuda::rms_norm_quantize_act(in.data(), 12, nullptr, 0, in.data(), nullptr, 0, 2, 16, 1e-6f,
                                           false, ws.data(), int64_t(ws.bytes()), nullptr),
               Error);  // ldx < K
  EXPECT_THROW(cuda::rms_norm_quantize_act(in.data(), 16, nullptr, 16, in.data(), nullptr, 0, 2, 16, 1e-6f,
                                           true, ws.data(), int64_t(ws.bytes()), nullptr),
               Error);  // add without a residual
}

// Random e4m3 codes (no NaN code) and block scales in [2^-12, 2^-6] for an [n, k] weight.
struct DeviceFp8Weight {
  Buffer q, s;
  cuda::GemvWeight view(int64_t k) const { return {q.data(), k, static_cast<const float*>(s.data())}; }
};
DeviceFp8Weight make_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> q(size_t(n * k));
  for (auto& b : q) {
    b = uint8_t(rng() & 0xff);
    if ((b & 0x7f) == 0x7f) b = uint8_t(b - 1);
  }
  std::vector<float> s(size_t(ops::fp8_blocks(n) * ops::fp8_blocks(k)));
  std::uniform_real_distribution<float> e(-12.0f, -6.0f);
  for (auto& v : s) v = std::exp2(e(rng));
  return {to_device(q), to_device(s)};
}

TEST(CudaFp8ActProducers, EngineEntryOnlyWhereRunTakesTheW8a8GemmAndBitwiseRun) {
  KILN_REQUIRE_FP8_GEMM();
  const int64_t N = 776, I = 1040;
  const DeviceFp8Weight wd = make_weight(N, I, 5);
  const cuda::GemvWeight w = wd.view(I);
  cuda::GemmEngine eng;
  EXPECT_EQ(eng.fp8_fused_act_quant_min_m(), cuda::GemmEngine::kFp8FusedActQuantMinM) << "the default";
  eng.set_fp8_fused_act_quant(true);
  Buffer out(size_t(600 * N) * 2, Device::cuda()), ref(size_t(600 * N) * 2, Device::cuda());
  // No tactic: cuBLASLt / dequantization for every M, so no pre-quantized input.
  EXPECT_FALSE(eng.fp8_gemm_takes(w, out.data(), N, 100, N, I));
  EXPECT_EQ(eng.fp8_gemm_input(w, out.data(), N, 100, N, I, nullptr).data, nullptr);
  EXPECT_THROW(eng.run_prequantized(w, out.data(), N, 100, N, I, nullptr), Error);
  const std::string path = (test_support::process_scratch_dir("cuda_fp8_act") / "w8a8.txt").string();
  test::write_w8a8_cache(eng, path, {{16, N, I, cuda::GemmOut::bf16, cuda::GemmWeight::fp8}});
  ASSERT_TRUE(eng.load(path));
  EXPECT_FALSE(eng.fp8_gemm_takes(w, out.data(), N, 8, N, I)) << "decode sizes take the GEMV";
  EXPECT_FALSE(eng.fp8_gemm_takes({w.data, I, nullptr}, out.data(), N, 100, N, I)) << "a bf16 weight";
  EXPECT_FALSE(eng.fp8_gemm_takes(w, out.data(), N, 100, N, 1024)) << "an untuned shape";
  eng.set_fp8_fused_act_quant(false);
  EXPECT_FALSE(eng.fp8_gemm_takes(w, out.data(), N, 100, N, I)) << "switched off";
  eng.set_fp8_fused_act_quant_min_m(100);
  EXPECT_FALSE(eng.fp8_gemm_takes(w, out.data(), N, 99, N, I)) << "below the threshold";
  EXPECT_TRUE(eng.fp8_gemm_takes(w, out.data(), N, 100, N, I)) << "at the threshold";
  eng.set_fp8_fused_act_quant(true);
  for (const int64_t M : {int64_t(9), int64_t(100), int64_t(600)}) {  // buckets 16 and below borrowed
    ASSERT_TRUE(eng.fp8_gemm_takes(w, out.data(), N, M, N, I)) << "M " << M;
    const Buffer gate_up = to_device(make_rows(M, 2 * I, uint32_t(M)));
    Buffer act(size_t(M * I) * 2, Device::cuda());
    test::poison(out);
    test::poison(ref);
    cuda::silu_mul(gate_up.data(), 2 * I, act.data(), I, M, I, nullptr);
    const int64_t gemm0 = eng.fp8_gemm_dispatches(), pre0 = eng.fp8_prequantized_dispatches();
    eng.run(act.data(), I, w, ref.data(), N, M, N, I, cuda::GemmOut::bf16, nullptr);
    const auto ws = eng.fp8_gemm_input(w, out.data(), N, M, N, I, nullptr);
    ASSERT_NE(ws.data, nullptr);
    cuda::silu_mul_quantize_act(gate_up.data(), 2 * I, M, I, ws.data, ws.bytes, nullptr);
    eng.run_prequantized(w, out.data(), N, M, N, I, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(eng.fp8_gemm_dispatches(), gemm0 + 2) << "M " << M;
    EXPECT_EQ(eng.fp8_prequantized_dispatches(), pre0 + 1) << "M " << M;
    EXPECT_EQ(first_difference(ref, out), -1) << "M " << M;
  }
}

// The FP8 model of the prefill test: K = hidden 208 (a multiple of 16, not of 128), three layers (the last
// runs its down projection unfused: the final norm follows it).
ModelConfig w8a8_config() {
  ModelConfig c = test::tiny_graph_config();
  c.hidden_size = 208;
  c.num_layers = 3;
  return c;
}

TEST(CudaFp8ActProducers, ModelPrefillLogitsBitwiseWithTheSwitchOnAndOff) {
  KILN_REQUIRE_FP8_GEMM();
  const ModelConfig c = w8a8_config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_heads * c.head_dim,
                qkv = q + 2 * c.num_kv_heads * c.head_dim;
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const int64_t fused_before = eng.fp8_fused_act_quant_min_m();
  const auto dir = test_support::process_scratch_dir("cuda_fp8_act_model");
  const std::string saved = (dir / "saved.txt").string(), path = (dir / "w8a8.txt").string();
  eng.save(saved);
  std::vector<cuda::GemmShape> shapes;
  for (const auto& [n, k] : {std::pair{qkv, H}, std::pair{H, q}, std::pair{2 * I, H}, std::pair{H, I}})
    shapes.push_back({16, n, k, cuda::GemmOut::bf16, cuda::GemmWeight::fp8});
  test::write_w8a8_cache(eng, path, shapes);
  ASSERT_TRUE(eng.load(path));
  setenv("KILN_AUTOTUNE", "0", 1);
  setenv("KILN_FP8_DEQUANT", "0", 1);
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 21;
  o.quantization = "fp8";
  auto m = Qwen3Model::create(c, nullptr, o);
  unsetenv("KILN_FP8_DEQUANT");
  ASSERT_TRUE(m->weights().layers[0].down.is_fp8());
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 45; ++t) prompt.push_back((t * 37 + 11) % int32_t(c.vocab_size));
  const auto steps = [&](bool fused) {
    eng.set_fp8_fused_act_quant(fused);
    return test::model_steps(*m, prompt, 2, {}, DType::bf16, ops::KvLayout::hnd, 16);
  };
  const int64_t gemm0 = eng.fp8_gemm_dispatches(), pre0 = eng.fp8_prequantized_dispatches();
  const auto off = steps(false);
  const int64_t gemm1 = eng.fp8_gemm_dispatches(), pre1 = eng.fp8_prequantized_dispatches();
  const auto on = steps(true);
  const int64_t gemm2 = eng.fp8_gemm_dispatches(), pre2 = eng.fp8_prequantized_dispatches();
  eng.set_fp8_fused_act_quant_min_m(fused_before);
  eng.load(saved);
  EXPECT_EQ(pre1, pre0) << "the switch off still fused";
  EXPECT_GT(gemm1, gemm0) << "the W8A8 GEMM never ran";
  // Per prefill of 3 layers: gate_up x 3 and QKV x 2 after a pending add + norm, down x 2 with a pending
  // norm.
  EXPECT_EQ(pre2 - pre1, 7) << "fused producers run";
  EXPECT_EQ(gemm2 - gemm1, gemm1 - gemm0) << "the same projections took the W8A8 GEMM";
  ASSERT_EQ(on.size(), off.size());
  for (size_t s = 0; s < on.size(); ++s) {
    ASSERT_EQ(on[s].size(), off[s].size());
    for (size_t v = 0; v < on[s].size(); ++v)
      ASSERT_EQ(std::memcmp(&on[s][v], &off[s][v], 4), 0) << "step " << s << " logit " << v;
  }
}

}  // namespace
}  // namespace kiln
