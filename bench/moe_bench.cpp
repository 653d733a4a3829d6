// moe benchmark: the sparse MLP of Qwen3-30B-A3B (128 experts, top-8, hidden 2048, moe_intermediate 768) on
// random weights and inputs (the router's logits then spread the tokens over the experts about uniformly):
//   experts gather_gemv T = 1 .. 128: the two GEMV launches alone on a routing made beforehand;
//     bytes = the distinct experts that routing chose (read from the device) x 3 H I x 2; the floor is those
//     bytes at the copy rate
//   experts grouped_gemm(_sm90) T = 8 .. 4096: the two grouped GEMM launches alone (mma.sync; wgmma
//     where the device runs sm_90a code); the path column gives TFLOP/s (2 x 3 H I per (token, expert) pair)
//   dense cublaslt T = 4096: the same FLOPs as dense GEMMs ([T k, 2I, H] then [T k, H, I]) through the
//     engine: the matmul rate of this run that the grouped GEMM is held against
//   experts gather_gemv fp8 T = 1 .. 128: the same GEMV on block-FP8 experts (half the bytes), path (c)
//     (KILN_MOE_FP8_E4M3X16 off), and `... fp8 e4m3x16`: path (d), the e4m3 x 16 form
//     (KILN_MOE_FP8_E4M3X16=1); at T = 1 the decode path (gate_up GEMV, then down fused with the combine),
//     bf16 and fp8 (e4m3 16 bytes a lane, 8 bytes a lane: KILN_MOE_FP8_WIDE_LOADS=0's form, and the e4m3 x 16
//     form);
//   mlp (the whole op: router, routing, permutation, experts, combine) at T = 1, 8, 64, 4096 (and one
//     expert-parallel rank's share of it, 16 of the 128 experts), and at
//     T = 1 and 8 its other parts alone; mlp fp8 the same with block-FP8 experts at T = 1, 8, 64 (where the
//     gather GEMV runs, path (c) and, as `mlp fp8 e4m3x16`, path (d)): the router linear,
//     routing + permutation, the combine (the unfused router path, T > 64), and at T = 1, 8, 64 the router
//     GEMV fused with the routing and permutation (the path to 64 tokens; at T = 1 and 8 also its counter
//     form beside the cluster form that runs there)
//   FP8 experts at T = 16, 64 and 256, 1024, 4096 (the prefill sizes; ops/cuda/moe_ops.h
//   kMoeFp8DequantMinTokens): the
//     gather GEMV in its default form (KILN_MOE_FP8_E4M3X16: path (d)), the dequantization of the chosen
//     experts alone, the dequant + wgmma grouped GEMM (FP8's path at and above the threshold), the BF16 wgmma
//     GEMM beside them, and the whole op with FP8 experts under the default threshold (its path column says
//     which ran), and (sm_90a) `experts fp8 w8a8 grouped`: the W8A8 grouped GEMM (inputs quantized to e4m3,
//     e4m3 x e4m3 wgmma), the path by rows takes there with KILN_MOE_FP8_W8A8=1
// Timed as graph replays below 64 tokens, else cold-L2 launches (time_cold_us).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/cuda_check.h"
#include "kiln/tensor.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_ops.h"
#include "ops/cuda/ops_cuda.h"

namespace kiln::bench {
namespace {

namespace kc = ::kiln::cuda;

constexpr int64_t kE = 128, kK = 8, kH = 2048, kI = 768;

struct MoeSetup {
  Buffer router, gate_up, down;
  Buffer gate_up8, down8, gate_up_s, down_s;  // block-FP8 experts (bytes of no meaning: timing only)
  ops::MoeWeights w, w8;
  explicit MoeSetup(cudaStream_t s)
      : router(size_t(kE * kH) * 2, Device::cuda()),
        gate_up(size_t(kE * 2 * kI * kH) * 2, Device::cuda()),
        down(size_t(kE * kH * kI) * 2, Device::cuda()),
        gate_up8(size_t(kE * 2 * kI * kH), Device::cuda()),
        down8(size_t(kE * kH * kI), Device::cuda()),
        gate_up_s(size_t(kE * (2 * kI / 128) * (kH / 128)) * 4, Device::cuda()),
        down_s(size_t(kE * (kH / 128) * (kI / 128)) * 4, Device::cuda()) {
    kc::fill_random_bf16(router.data(), kE * kH, 1, 0.05f, 0.0f, s);
    kc::fill_random_bf16(gate_up.data(), kE * 2 * kI * kH, 2, 0.03f, 0.0f, s);
    kc::fill_random_bf16(down.data(), kE * kH * kI, 3, 0.03f, 0.0f, s);
    w.router = Tensor(router.data(), DType::bf16, {kE, kH}, Device::cuda());
    w.gate_up = Tensor(gate_up.data(), DType::bf16, {kE, 2 * kI, kH}, Device::cuda());
    w.down = Tensor(down.data(), DType::bf16, {kE, kH, kI}, Device::cuda());
    w.top_k = kK;
    w.norm_topk_prob = true;
    // e4m3 bytes: the bf16 bits of small random values (finite e4m3 values but for rare NaN bytes, which
    // change no timing); scales 0x3c3c3c3c (~0.0115).
    kc::fill_random_bf16(gate_up8.data(), kE * kI * kH, 4, 0.03f, 0.0f, s);
    kc::fill_random_bf16(down8.data(), kE * kH * kI / 2, 5, 0.03f, 0.0f, s);
    KILN_CUDA_CHECK(cudaMemsetAsync(gate_up_s.data(), 0x3c, gate_up_s.bytes(), s));
    KILN_CUDA_CHECK(cudaMemsetAsync(down_s.data(), 0x3c, down_s.bytes(), s));
    w8 = w;
    w8.gate_up = Tensor(gate_up8.data(), DType::f8e4m3, {kE, 2 * kI, kH}, Device::cuda());
    w8.down = Tensor(down8.data(), DType::f8e4m3, {kE, kH, kI}, Device::cuda());
    w8.gate_up_scale = Tensor(gate_up_s.data(), DType::f32, {kE, 2 * kI / 128, kH / 128}, Device::cuda());
    w8.down_scale = Tensor(down_s.data(), DType::f32, {kE, kH / 128, kI / 128}, Device::cuda());
  }
};

// The FP8 rows at T = 16, 64 and prefill sizes (the header's last bullet): which of the GEMV, dequant +
// grouped GEMM and the W8A8 grouped GEMM is faster at each T picks kMoeFp8DequantMinTokens (16 and 64: where
// the W8A8 kernel might overtake the GEMV, which reads FP8 experts at under 40 % of the copy rate there:
// E10).
void run_moe_fp8_prefill(const Env& env, const MoeSetup& m, std::vector<Row>& rows) {
  const double flops_pair = 2.0 * double(3 * kH * kI);
  for (const int64_t T : {int64_t(16), int64_t(64), int64_t(256), int64_t(1024), int64_t(4096)}) {
    const std::string shape = "30B-A3B T=" + std::to_string(T) + " E=128 k=8 H=2048 I=768";
    const kc::MoeShape s{.T = T, .E = kE, .k = kK, .H = kH, .I = kI, .fp8_dequant = true};
    Buffer x(size_t(T * kH) * 2, Device::cuda()), out(size_t(T * kH) * 2, Device::cuda());
    Buffer scratch(kc::moe_scratch_bytes(s), Device::cuda());  // the bf16 expert copy included
    kc::fill_random_bf16(x.data(), T * kH, 30 + uint64_t(T), 1.0f, 0.0f, env.stream);
    const Tensor xt(x.data(), DType::bf16, {T, kH}, Device::cuda());
    const Tensor ot(out.data(), DType::bf16, {T, kH}, Device::cuda());
    ops::cuda::moe_mlp(xt, m.w, ot, scratch.data(), scratch.bytes());  // a routing for the expert-only rows
    KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
    int32_t active = 0;
    KILN_CUDA_CHECK(cudaMemcpy(&active, b.active + kE, 4, cudaMemcpyDeviceToHost));
    const double fp8_bytes = double(active) * double(3 * kH * kI);  // the chosen experts in e4m3
    const auto* xp = static_cast<const uint16_t*>(x.data());
    const kc::MoeFp8Scales scales{.gate_up = static_cast<const float*>(m.gate_up_s.data()),
                                  .down = static_cast<const float*>(m.down_s.data())};
    const auto timed = [&](Row r, const std::function<void(int)>& launch) {
      launch(0);
      KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
      r.us = time_cold_us(env, launch);
      if (r.path.empty()) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.0f TFLOP/s, %d experts",
                      flops_pair * double(T * kK) / (r.us * 1e6), active);
        r.path = buf;
      }
      rows.push_back(r);
    };
    const auto experts = [&](kc::MoeExpertKernel k, bool fp8) {
      return [&, k, fp8](int) {
        kc::moe_experts_launch(k, xp, kH, fp8 ? m.gate_up8.data() : m.gate_up.data(),
                               fp8 ? m.down8.data() : m.down.data(), s, b, env.stream,
                               fp8 ? scales : kc::MoeFp8Scales{});
      };
    };
    Row r{"moe", "experts fp8 gather_gemv", shape};
    r.bytes = fp8_bytes;
    timed(r, experts(kc::MoeExpertKernel::gather_gemv, true));
    r = Row{"moe", "experts fp8 dequant alone", shape};
    r.bytes = fp8_bytes * 3;  // e4m3 read, bf16 written
    r.path = "part of dequant + grouped GEMM";
    timed(r, [&](int) {
      kc::dequantize_fp8_experts(m.gate_up8.data(), scales.gate_up, b.gate_up_bf16, kE, 2 * kI, kH, b.counts,
                                 0, env.stream);
      kc::dequantize_fp8_experts(m.down8.data(), scales.down, b.down_bf16, kE, kH, kI, b.counts, 0,
                                 env.stream);
    });
    const bool sm90 = kc::moe_grouped_gemm_sm90_applies();
    const kc::MoeExpertKernel gemm =
        sm90 ? kc::MoeExpertKernel::grouped_gemm_sm90 : kc::MoeExpertKernel::grouped_gemm;
    r = Row{"moe", sm90 ? "experts fp8 dequant + wgmma" : "experts fp8 dequant + grouped_gemm", shape};
    r.bytes = fp8_bytes * 3 + fp8_bytes * 2;  // the dequant, then the GEMM's read of the bf16 copy
    timed(r, experts(gemm, true));
    r = Row{"moe", sm90 ? "experts grouped_gemm_sm90" : "experts grouped_gemm", shape};
    r.bytes = fp8_bytes * 2;
    timed(r, experts(gemm, false));
    if (kc::moe_grouped_gemm_fp8_sm90_applies()) {
      // W8A8: the four launches (gate_up inputs quantized, its GEMM, act quantized, the down GEMM) on the
      // same routing; the W8A8 workspace carved where the bf16 copy was (the parts before it coincide).
      const kc::MoeShape s8{.T = T, .E = kE, .k = kK, .H = kH, .I = kI, .fp8_w8a8 = true};
      Buffer w8a8_scratch(kc::moe_scratch_bytes(s8), Device::cuda());
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(w8a8_scratch.data(), scratch.data(),
                          kc::moe_scratch_bytes(kc::MoeShape{.T = T, .E = kE, .k = kK, .H = kH, .I = kI}),
                          cudaMemcpyDeviceToDevice, env.stream));
      const kc::MoeBuffers b8 = kc::moe_scratch_layout(s8, w8a8_scratch.data());
      r = Row{"moe", "experts fp8 w8a8 grouped", shape};
      r.bytes =
          fp8_bytes + double(T * kK) * double(kH + kI) * (2 + 1);  // e4m3 weights; inputs read, e4m3 written
      timed(r, [&](int) {
        kc::moe_experts_launch(kc::MoeExpertKernel::grouped_gemm_fp8_sm90, xp, kH, m.gate_up8.data(),
                               m.down8.data(), s8, b8, env.stream, scales);
      });
    }
    r = Row{"moe", "mlp fp8 (route + experts + combine)", shape};
    r.bytes = fp8_bytes + double(kE * kH) * 2;
    r.path = ops::cuda::moe_fp8_w8a8_runs(m.w8, T)      ? "W8A8 grouped GEMM (by rows)"
             : ops::cuda::moe_fp8_dequant_runs(m.w8, T) ? "dequant + grouped GEMM (by rows)"
                                                        : "gather GEMV (by rows)";
    Buffer op_scratch(ops::cuda::moe_scratch_bytes(m.w8, kH, T), Device::cuda());
    timed(r, [&](int) { ops::cuda::moe_mlp(xt, m.w8, ot, op_scratch.data(), op_scratch.bytes()); });
  }
}

void run_moe(const Env& env, std::vector<Row>& rows) {
  const kc::StreamScope scope(env.stream);
  MoeSetup m(env.stream);
  run_moe_fp8_prefill(env, m, rows);
  const double expert_bytes = double(3 * kH * kI) * 2;
  const auto shape = [](int64_t T) { return "30B-A3B T=" + std::to_string(T) + " E=128 k=8 H=2048 I=768"; };
  for (const int64_t T :
       {int64_t(1), int64_t(4), int64_t(8), int64_t(16), int64_t(64), int64_t(512), int64_t(4096)}) {
    const kc::MoeShape s{.T = T, .E = kE, .k = kK, .H = kH, .I = kI};
    Buffer x(size_t(T * kH) * 2, Device::cuda()), out(size_t(T * kH) * 2, Device::cuda());
    // Room for the FP8 op too (its bf16 expert copy where KILN_MOE_FP8_DEQUANT_MIN_TOKENS reaches T).
    Buffer scratch(std::max(kc::moe_scratch_bytes(s), ops::cuda::moe_scratch_bytes(m.w8, kH, T)),
                   Device::cuda());
    kc::fill_random_bf16(x.data(), T * kH, 10 + uint64_t(T), 1.0f, 0.0f, env.stream);
    const Tensor xt(x.data(), DType::bf16, {T, kH}, Device::cuda());
    const Tensor ot(out.data(), DType::bf16, {T, kH}, Device::cuda());
    // A routing in the scratch, for the expert-only rows; its distinct experts for the bytes.
    ops::cuda::moe_mlp(xt, m.w, ot, scratch.data(), scratch.bytes());
    KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch.data());
    int32_t active = 0;
    KILN_CUDA_CHECK(cudaMemcpy(&active, b.active + kE, 4, cudaMemcpyDeviceToHost));
    const double flops = 2.0 * double(T * kK) * double(3 * kH * kI);
    const auto experts = [&](kc::MoeExpertKernel k) {
      return [&, k](int) {
        kc::moe_experts_launch(k, static_cast<const uint16_t*>(x.data()), kH,
                               static_cast<const uint16_t*>(m.gate_up.data()),
                               static_cast<const uint16_t*>(m.down.data()), s, b, env.stream);
      };
    };
    const auto timed = [&](Row r, const std::function<void(int)>& launch) {
      launch(0);
      KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
      if (T < 64)
        time_graph_row(env, launch, 1, r);
      else
        r.us = time_cold_us(env, launch);
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.0f TFLOP/s, %d experts", flops / (r.us * 1e-6) / 1e12, active);
      if (r.path.empty()) r.path = buf;  // the parts beside the experts name themselves
      rows.push_back(r);
    };
    if (T <= 128) {
      const bool x16_before = kc::moe_fp8_e4m3x16();
      Row r{"moe", "experts gather_gemv", shape(T)};
      r.bytes = double(active) * expert_bytes + double(T * kK) * double(kH + kI) * 2 * 2;
      timed(r, experts(kc::MoeExpertKernel::gather_gemv));
      const kc::MoeProductParams g = kc::moe_gate_up_params(
          static_cast<const uint16_t*>(x.data()), kH, static_cast<const uint16_t*>(m.gate_up.data()), s, b);
      const kc::MoeProductParams d = kc::moe_down_params(static_cast<const uint16_t*>(m.down.data()), s, b);
      const kc::MoeFp8Scales scales{.gate_up = static_cast<const float*>(m.gate_up_s.data()),
                                    .down = static_cast<const float*>(m.down_s.data())};
      if (T == 1) {  // the decode path: gate_up GEMV, then down fused with the combine
        kc::MoeProductParams g8 = g, d8 = d;
        kc::moe_set_fp8(g8, m.gate_up8.data(), scales.gate_up);
        kc::moe_set_fp8(d8, m.down8.data(), scales.down);
        const bool wide_before = kc::moe_fp8_wide_loads();
        // bf16; path (c), e4m3 16 and 8 bytes a lane (KILN_MOE_FP8_WIDE_LOADS); path (d)
        // (KILN_MOE_FP8_E4M3X16)
        for (const int form : {0, 1, 2, 3}) {
          const bool fp8 = form > 0;
          kc::moe_set_fp8_wide_loads(form == 1);
          kc::moe_set_fp8_e4m3x16(form == 3);
          const char* name = form == 1   ? " fp8"
                             : form == 2 ? " fp8 8-byte loads"
                             : form == 3 ? " fp8 e4m3x16"
                                         : "";
          Row f{"moe", std::string("experts + combine fused") + name, shape(T)};
          f.bytes = double(active) * expert_bytes / (fp8 ? 2 : 1) + double(kK) * double(kH + kI) * 2 * 2;
          timed(f, [&](int) {
            kc::moe_gather_gemv_launch(s, fp8 ? g8 : g, nullptr, env.stream);
            kc::moe_down_combine_launch(s, fp8 ? d8 : d, b, static_cast<uint16_t*>(out.data()), kH,
                                        env.stream);
          });
        }
        kc::moe_set_fp8_wide_loads(wide_before);
      }
      r.bytes = double(active) * expert_bytes / 2 + double(T * kK) * double(kH + kI) * 2 * 2;
      for (const bool x16 : {false, true}) {  // path (c), then path (d)
        kc::moe_set_fp8_e4m3x16(x16);
        r.variant = x16 ? "experts gather_gemv fp8 e4m3x16" : "experts gather_gemv fp8";
        timed(r, [&](int) {
          kc::moe_experts_launch(kc::MoeExpertKernel::gather_gemv, static_cast<const uint16_t*>(x.data()), kH,
                                 m.gate_up8.data(), m.down8.data(), s, b, env.stream, scales);
        });
      }
      kc::moe_set_fp8_e4m3x16(x16_before);
    }
    if (T >= 8) {
      Row r{"moe", "experts grouped_gemm", shape(T)};
      r.bytes = double(active) * expert_bytes + double(T * kK) * double(kH + kI) * 2 * 2;
      timed(r, experts(kc::MoeExpertKernel::grouped_gemm));
      if (kc::moe_grouped_gemm_sm90_applies()) {
        r.variant = "experts grouped_gemm_sm90";
        timed(r, experts(kc::MoeExpertKernel::grouped_gemm_sm90));
      }
    }
    if (T == 4096) {  // the same FLOPs as two dense GEMMs through the engine (its tuned or heuristic tactic)
      kc::GemmEngine& eng = kc::gemm_engine();
      const int64_t M = T * kK;
      Buffer a(size_t(M * kH) * 2, Device::cuda()), gu(size_t(M * 2 * kI) * 2, Device::cuda()),
          y(size_t(M * kH) * 2, Device::cuda());
      kc::fill_random_bf16(a.data(), M * kH, 5, 1.0f, 0.0f, env.stream);
      Row r{"moe", "dense cublaslt", "M=" + std::to_string(M) + " [2I, H] then [H, I] (same FLOPs)"};
      r.bytes = double(M * kH) * 2 * 2 + double(M * 2 * kI) * 2 * 2;
      timed(r, [&](int) {
        eng.run(a.data(), kH, m.gate_up.data(), kH, gu.data(), 2 * kI, M, 2 * kI, kH, kc::GemmOut::bf16,
                env.stream);
        eng.run(gu.data(), 2 * kI, m.down.data(), kI, y.data(), kH, M, kH, kI, kc::GemmOut::bf16, env.stream);
      });
    }
    if (T == 1 || T == 8 || T == 64 || T == 4096) {
      Row r{"moe", "mlp (route + experts + combine)", shape(T)};
      r.bytes = double(active) * expert_bytes + double(kE * kH) * 2;
      timed(r, [&](int) { ops::cuda::moe_mlp(xt, m.w, ot, scratch.data(), scratch.bytes()); });
      // One rank's share under expert parallelism over 8 ranks (experts [0, 16)): the routing over all 128,
      // then about an eighth of the pairs (bytes: an eighth of the chosen experts'). The all-reduce and the
      // other ranks wait for machines with several GPUs.
      ops::MoeWeights share = m.w;
      share.gate_up = Tensor(m.gate_up.data(), DType::bf16, {kE / 8, 2 * kI, kH}, Device::cuda());
      share.down = Tensor(m.down.data(), DType::bf16, {kE / 8, kH, kI}, Device::cuda());
      r.variant = "mlp EP share (16 of 128 experts)";
      r.bytes = double(active) / 8 * expert_bytes + double(kE * kH) * 2;
      r.path.clear();
      timed(r, [&](int) { ops::cuda::moe_mlp(xt, share, ot, scratch.data(), scratch.bytes()); });
      if (T <= 64) {
        // Where the gather GEMV runs, the row without a suffix is path (c) and `e4m3x16` path (d) (the
        // default); elsewhere the switch does not apply and one row is timed.
        const bool gemv = !ops::cuda::moe_fp8_w8a8_runs(m.w8, T) && !ops::cuda::moe_fp8_dequant_runs(m.w8, T);
        const bool x16_before = kc::moe_fp8_e4m3x16();
        r.bytes = double(active) * expert_bytes / 2 + double(kE * kH) * 2;
        for (const bool x16 : gemv ? std::vector<bool>{false, true} : std::vector<bool>{x16_before}) {
          kc::moe_set_fp8_e4m3x16(x16);
          r.variant = gemv && x16 ? "mlp fp8 e4m3x16 (route + experts + combine)"
                                  : "mlp fp8 (route + experts + combine)";
          r.path.clear();
          timed(r, [&](int) { ops::cuda::moe_mlp(xt, m.w8, ot, scratch.data(), scratch.bytes()); });
        }
        kc::moe_set_fp8_e4m3x16(x16_before);
      }
    }
    if (T == 1 || T == 8 || T == 64) {  // the router GEMV fused with the routing (the op's path to 64 tokens)
      Row r{"moe", "router + route fused", shape(T)};
      r.bytes = double(kE * kH) * 2 + double(T * kH) * 2;
      r.path = "part of mlp";
      timed(r, [&](int) {
        kc::moe_router_route_launch(static_cast<const uint16_t*>(x.data()), kH,
                                    static_cast<const uint16_t*>(m.router.data()), s, true, b, env.stream);
        kc::moe_permute_launch(s, b, env.stream);
      });
      if (T <= 8) {  // the counter form where the cluster form runs (moe.h): the same bits
        r.variant = "router + route fused, counter form";
        timed(r, [&](int) {
          kc::moe_router_route_launch(static_cast<const uint16_t*>(x.data()), kH,
                                      static_cast<const uint16_t*>(m.router.data()), s, true, b, env.stream,
                                      nullptr, true);
        });
      }
    }
    if (T == 1 || T == 8) {  // the parts of the whole op beside the experts, each alone
      const Tensor logits(b.logits, DType::bf16, {T, kE}, Device::cuda());
      Row r{"moe", "router linear", shape(T)};
      r.bytes = double(kE * kH) * 2;
      r.path = "part of mlp";
      timed(r, [&](int) { ops::cuda::linear(xt, m.w.router, logits); });
      r = Row{"moe", "route + permutation", shape(T)};
      r.bytes = double(T * kE) * 2;
      r.path = "part of mlp";
      timed(r, [&](int) {
        kc::moe_route_launch(b.logits, kE, s, true, b, env.stream);
        kc::moe_permute_launch(s, b, env.stream);
      });
      r = Row{"moe", "combine", shape(T)};
      r.bytes = double(T * kK) * double(kH) * 2 + double(T * kH) * 2;
      r.path = "part of mlp";
      timed(r,
            [&](int) { kc::moe_combine_launch(s, b, static_cast<uint16_t*>(out.data()), kH, env.stream); });
    }
  }
}

}  // namespace

KILN_KERNEL_BENCH("moe", "Qwen3-30B-A3B sparse MLP: gather GEMV, grouped GEMM, dense GEMMs of the same FLOPs",
                  run_moe);

}  // namespace kiln::bench
