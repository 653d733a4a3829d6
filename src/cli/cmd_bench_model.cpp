// `kiln bench model [--shape qwen3-8b|qwen3-4b|qwen3-0.6b|qwen3-30b-a3b | --model DIR] [--context N]
//                   [--steps N] [--prefill N] [--kv-dtype bf16|fp8] [--quantization none|fp8] [--page-size N]
//                   [--batch 8,32,128] [--verify-rows 4,8] [--no-breakdown]`
// Whole-model timing on the GPU with random weights (generated on the device side of the loader):
//   prefill: one prompt of --prefill tokens into an empty cache (median of 3), beside its floor
//            FLOPs / the bf16 matmul rate measured in the same run (an 8192^3 cuBLASLt GEMM);
//   decode:  single-stream TPOT at --context (the cache filled by a prefill first), the median over
//            --steps steps, beside its floor (weight bytes + KV bytes read) / the device-to-device copy
//            rate measured in the same run (bytes read + written, as docs/PERF.md defines it);
//   decode (graph): the same steps replayed from the decode CUDA graph, without and with PDL;
//   --batch: decode of B sequences at --context, eager and from a B-sequence graph (serving's buckets);
//   --verify-rows: speculative decoding's verify step of q rows (the last token and q - 1 drafts) at batch 1
//            from its CUDA graph, beside the decode graph's step at the same context;
//   breakdown: each op of one decode step as L graph-replayed calls (one per layer's weights, so no L2
//            reuse of weights), median of 20 replays / L: kernel time plus the in-graph launch gap, each
//            op captured without and with PDL between its calls.
// `--tp N --model DIR` instead times single-stream decode through the tensor-parallel runner over N GPUs
// (runtime/tp_runner.h; random weights, DIR's config.json): TPOT eager and from the decode graphs (the NCCL
// all-reduces captured inside), each step sampled greedily on rank 0's GPU as serving does.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cli/client_flags.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/model_shapes.h"
#include "kiln/config.h"
#include "model/cuda_graph.h"
#include "model/cuda_step_choice.h"
#include "model/qwen3.h"
#include "runtime/tp_runner.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_profiler_api.h>

#include "bench/kernel_bench.h"
#include "kiln/cuda_check.h"

#include "ops/attention.h"
#include "ops/attn_prep.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope_table.h"
#endif

namespace {

#ifdef KILN_HAVE_CUDA
using namespace kiln;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds of fn() on the default stream, median of `reps` (CUDA events).
double time_ms(int reps, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  KILN_CUDA_CHECK(cudaEventCreate(&a));
  KILN_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(a));
    fn();
    KILN_CUDA_CHECK(cudaEventRecord(b));
    KILN_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

// The copy ceiling, measured as the kernel benchmarks measure it (bench/kernel_bench.h), default stream.
double copy_gbps() {
  return bench::measure_copy_gbps(bench::Env{});
}

double matmul_tflops() {
  const int64_t n = 8192;
  Buffer x(size_t(n * n) * 2, Device::cuda()), w(size_t(n * n) * 2, Device::cuda()),
      o(size_t(n * n) * 2, Device::cuda());
  KILN_CUDA_CHECK(cudaMemset(x.data(), 0x3c, size_t(n * n) * 2));
  KILN_CUDA_CHECK(cudaMemset(w.data(), 0x3c, size_t(n * n) * 2));
  cuda::GemmEngine eng;
  eng.tune({{8192, n, n, cuda::GemmOut::bf16}});
  const double ms =
      time_ms(10, [&] { eng.run(x.data(), w.data(), o.data(), n, n, n, cuda::GemmOut::bf16, nullptr); });
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
}

// A one-sequence batch of tokens [start, start + n) on pages 0, 1, 2, ... in order.
// Appends a sequence of n new tokens at positions [start, start + n) whose pages are
// [first_page, first_page + pages) to b (b.page_size and b.pages_stride = pages set by the caller).
void add_seq(BatchDesc& b, int32_t start, int32_t n, int32_t pages, int32_t first_page, int64_t vocab) {
  if (b.cu_q.empty()) b.cu_q = {0};
  for (int32_t i = 0; i < n; ++i) {
    b.tokens.push_back(int32_t((int64_t(start + i + first_page) * 7919) % vocab));
    b.positions.push_back(start + i);
    b.slot_mapping.push_back(int64_t(first_page) * b.page_size + start + i);
  }
  b.cu_q.push_back(b.cu_q.back() + n);
  b.kv_lens.push_back(start + n);
  for (int32_t p = 0; p < pages; ++p) b.page_table.push_back(first_page + p);
  b.logit_rows.push_back(b.cu_q.back() - 1);
}

BatchDesc one_seq(int32_t start, int32_t n, int32_t pages, int32_t ps, int64_t vocab) {
  BatchDesc b;
  b.page_size = ps;
  b.pages_stride = pages;
  add_seq(b, start, n, pages, 0, vocab);
  return b;
}

// The median milliseconds of `steps` replays of g after `warmups` more, step i running batch(i), each waited
// for.
template <typename MakeBatch>
double median_replay_ms(CudaDecodeGraph& g, int32_t steps, int32_t warmups, MakeBatch&& batch) {
  std::vector<double> t;
  for (int32_t i = 0; i < steps + warmups; ++i) {
    const BatchDesc b = batch(i);
    const auto a = std::chrono::steady_clock::now();
    g.step(b);
    KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(g.stream())));
    if (i >= warmups)
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  return median(t);
}

// Decode at batch B: B sequences with `ctx` tokens of context each (filled by per-sequence prefills), then
// `steps` decode steps eagerly and replayed from CudaDecodeGraphs of B sequences captured without and with
// PDL, as the serving engine's graph buckets run them. Tokens/s = B / step time; floor = (weights + B x KV at
// ctx) / copy rate.
void bench_batch_decode(Qwen3Model& m, int32_t B, int32_t ctx, int32_t steps, int32_t ps, DType kv,
                        int64_t wbytes, double gbps) {
  const ModelConfig& c = m.config();
  constexpr int32_t warmups = 3;
  // Room for the warm-up steps too: the last step writes position ctx - 1 + steps + warmups - 1.
  const int32_t pages = (ctx + steps + warmups + ps - 1) / ps;
  KvCache cache(c, B * pages + 1, ps, ops::KvLayout::hnd, kv, Device::cuda());
  Buffer logits(size_t(B) * size_t(c.vocab_size) * 4, Device::cuda());
  const Tensor one(logits.data(), DType::f32, {1, c.vocab_size}, Device::cuda());
  for (int32_t i = 0; i < B; ++i) {
    for (int32_t s = 0; s < ctx - 1; s += 4096) {
      BatchDesc b;
      b.page_size = ps;
      b.pages_stride = pages;
      add_seq(b, s, std::min(4096, ctx - 1 - s), pages, 1 + i * pages, c.vocab_size);
      m.forward(b, cache, one);
    }
  }
  auto step_batch = [&](int32_t pos) {
    BatchDesc b;
    b.page_size = ps;
    b.pages_stride = pages;
    for (int32_t i = 0; i < B; ++i) add_seq(b, pos, 1, pages, 1 + i * pages, c.vocab_size);
    return b;
  };
  const Tensor all(logits.data(), DType::f32, {B, c.vocab_size}, Device::cuda());
  std::vector<double> eager;
  for (int32_t i = 0; i < steps + warmups; ++i) {
    const BatchDesc b = step_batch(ctx - 1 + i);
    const auto a = std::chrono::steady_clock::now();
    m.forward(b, cache, all);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    if (i >= warmups)
      eager.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  // Replayed from a graph captured without PDL, then from one captured with it (kiln serve's default).
  auto time_graph = [&](bool pdl) {
    CudaDecodeGraph g(m, cache, pages, B, {}, pdl);
    // The same steps again: the same K/V rewritten.
    return median_replay_ms(g, steps, warmups, [&](int32_t i) { return step_batch(ctx - 1 + i); });
  };
  const double tg_plain = time_graph(false), tg = time_graph(true);
  const double kv_bytes = double(KvCache::bytes_per_token(c, kv)) * ctx * B;
  const double floor_ms = (double(wbytes) + kv_bytes) / (gbps * 1e9) * 1e3;
  const double te = median(eager), tbest = std::min(tg_plain, tg);
  std::printf(
      "decode batch %3d at context %d: eager %.3f ms/step, CUDA graph %.3f, CUDA graph + PDL %.3f ms/step; "
      "best "
      "%.0f tok/s; floor %.3f ms ((%.2f GB weights + %.3f GB KV) / %.0f GB/s); %.0f%% of the floor\n",
      B, ctx, te, tg_plain, tg, B / (tbest * 1e-3), floor_ms, double(wbytes) / 1e9, kv_bytes / 1e9, gbps,
      100.0 * floor_ms / tbest);
}

// A verify step of speculative decoding at batch 1 (model/cuda_graph.h, rows_per_seq = q): q rows with logits
// at each, replayed from its graph, beside the one-row decode graph at the same context (issue 47's targets:
// <= 1.10x the decode step at q = 4, <= 1.25x at q = 8). The same rows every step: the same K/V rewritten.
void bench_verify(Qwen3Model& m, int32_t q, int32_t ctx, int32_t steps, int32_t ps, DType kv) {
  const ModelConfig& c = m.config();
  constexpr int32_t warmups = 3;
  const int32_t pages = (ctx + q + ps - 1) / ps;
  KvCache cache(c, pages + 1, ps, ops::KvLayout::hnd, kv, Device::cuda());
  Buffer lb(size_t(c.vocab_size) * 4, Device::cuda());
  const Tensor one(lb.data(), DType::f32, {1, c.vocab_size}, Device::cuda());
  for (int32_t s = 0; s < ctx - 1; s += 4096) {
    BatchDesc b;
    b.page_size = ps;
    b.pages_stride = pages;
    add_seq(b, s, std::min(4096, ctx - 1 - s), pages, 1, c.vocab_size);
    m.forward(b, cache, one);
  }
  auto time_rows = [&](int32_t rows) {
    CudaDecodeGraph g(m, cache, pages, 1, {}, true, rows);
    BatchDesc b;
    b.page_size = ps;
    b.pages_stride = pages;
    add_seq(b, ctx - 1, rows, pages, 1, c.vocab_size);
    b.logit_rows.clear();
    for (int32_t r = 0; r < rows; ++r) b.logit_rows.push_back(r);
    return median_replay_ms(g, steps, warmups, [&](int32_t) { return b; });
  };
  const double plain = time_rows(1);
  // The verify path's two choices for bitwise plain-decode logits (ops/attention.h decode_rows_per_seq,
  // ops/linear.h LinearTacticRows), each against the path without it (defaults: decode attention up to 4
  // rows, own tactics).
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const int decode_before = cuda::verify_decode_max_rows();
  const bool tactics_before = eng.verify_tactics();
  struct Variant {
    const char* name;
    bool decode_attention, plain_tactics;
  };
  for (const Variant& v : {Variant{"prefill attention, own M tactics", false, false},
                           Variant{"decode attention, own M tactics", true, false},
                           Variant{"decode attention, plain step's tactics (bitwise)", true, true}}) {
    cuda::set_verify_decode_max_rows(v.decode_attention ? cuda::kMaxDecodeRowsPerSeq : 0);
    eng.set_verify_tactics(v.plain_tactics);
    const double verify = time_rows(q);
    std::printf(
        "verify step, batch 1, %d rows at context %d (CUDA graph + PDL), %s: %.3f ms vs the decode step's "
        "%.3f ms: %.2fx; it pays when the mean acceptance length exceeds %.2f\n",
        q, ctx, v.name, verify, plain, verify / plain, verify / plain);
  }
  cuda::set_verify_decode_max_rows(decode_before);
  eng.set_verify_tactics(tactics_before);
}

// Bytes of weights a decode step of `batch` sequences reads: every dense weight, and of a sparse layer its
// router plus the experts the batch is expected to choose under uniform routing, E (1 - (1 - k / E)^batch).
int64_t weight_bytes(const Qwen3Weights& w, bool tied, int64_t batch = 1) {
  int64_t n = w.lm_head.nbytes() + w.final_norm.nbytes() + (tied ? 0 : w.embed.nbytes());
  for (const auto& l : w.layers) {
    n += l.input_norm.nbytes() + l.qkv.nbytes() + l.q_norm.nbytes() + l.k_norm.nbytes() + l.o_proj.nbytes() +
         l.post_norm.nbytes() + l.gate_up.nbytes() + l.down.nbytes();
    if (!l.moe.present()) continue;
    const double E = double(l.moe.num_experts()), k = double(l.moe.top_k);
    const double chosen = E * (1.0 - std::pow(1.0 - k / E, double(batch)));
    const int64_t experts = l.moe.gate_up.nbytes() + l.moe.down.nbytes() +
                            (l.moe.is_fp8() ? l.moe.gate_up_scale.nbytes() + l.moe.down_scale.nbytes() : 0);
    n += l.moe.router.nbytes() + int64_t(chosen / E * double(experts));
  }
  return n;
}

// Each op of one decode step at context `ctx`, timed alone on the model's real weights and cache.
void breakdown(Qwen3Model& m, KvCache& cache, int32_t ctx, int32_t pages, int32_t ps) {
  const ModelConfig& c = m.config();
  const Device dev = Device::cuda();
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, Hq = c.num_heads,
                Hkv = c.num_kv_heads;
  const int64_t qkv_dim = (Hq + 2 * Hkv) * D, L = c.num_layers;
  auto buf = [&](size_t bytes) { return Buffer(std::max<size_t>(bytes, 256), dev); };
  Buffer x = buf(size_t(H) * 2), r = buf(size_t(H) * 2), n = buf(size_t(H) * 2),
         qkv = buf(size_t(qkv_dim) * 2);
  Buffer att = buf(size_t(Hq * D) * 2), gu = buf(size_t(2 * I) * 2), act = buf(size_t(I) * 2);
  Buffer logits = buf(size_t(c.vocab_size) * 4);
  KILN_CUDA_CHECK(cudaMemset(x.data(), 0x3c, size_t(H) * 2));
  KILN_CUDA_CHECK(cudaMemset(r.data(), 0x3c, size_t(H) * 2));
  KILN_CUDA_CHECK(cudaMemset(qkv.data(), 0x3c, size_t(qkv_dim) * 2));
  KILN_CUDA_CHECK(cudaMemset(att.data(), 0x3c, size_t(Hq * D) * 2));
  KILN_CUDA_CHECK(cudaMemset(gu.data(), 0x3c, size_t(2 * I) * 2));
  const BatchDesc b = one_seq(ctx - 1, 1, pages, ps, c.vocab_size);
  std::vector<int32_t> meta_i32 = {b.tokens[0], b.positions[0], 0, 1, ctx, 0};
  Buffer meta = buf(64), slots = buf(8), pt = buf(size_t(pages) * 4);
  KILN_CUDA_CHECK(cudaMemcpy(meta.data(), meta_i32.data(), meta_i32.size() * 4, cudaMemcpyHostToDevice));
  const int64_t slot = ctx - 1;
  KILN_CUDA_CHECK(cudaMemcpy(slots.data(), &slot, 8, cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(pt.data(), b.page_table.data(), size_t(pages) * 4, cudaMemcpyHostToDevice));
  const int32_t* mi = static_cast<const int32_t*>(meta.data());
  Buffer rope = ops::build_rope_table(int(c.rotary_dim()), c.rope_theta, c.rope_scaling, ctx + 1, dev);
  const LayerWeights& lw = m.weights().layers[0];
  const float eps = float(c.rms_norm_eps);
  Tensor tx(x.data(), DType::bf16, {1, H}, dev), tr(r.data(), DType::bf16, {1, H}, dev),
      tn(n.data(), DType::bf16, {1, H}, dev), tq(qkv.data(), DType::bf16, {1, qkv_dim}, dev),
      ta(att.data(), DType::bf16, {1, Hq * D}, dev), tg(gu.data(), DType::bf16, {1, 2 * I}, dev),
      tact(act.data(), DType::bf16, {1, I}, dev);
  ops::AttnPrepArgs prep;
  prep.qkv = tq;
  prep.eps = eps;
  prep.positions = Tensor(const_cast<int32_t*>(mi + 1), DType::i32, {1}, dev);
  prep.rope = ops::rope_table_view(rope, int(c.rotary_dim()), ctx + 1);
  prep.slot_mapping = Tensor(slots.data(), DType::i64, {1}, dev);
  prep.num_q_heads = int(Hq), prep.num_kv_heads = int(Hkv), prep.head_dim = int(D);
  prep.q_norm = lw.q_norm, prep.k_norm = lw.k_norm, prep.cache = cache.layer(0);
  ops::PagedAttentionArgs pa;
  pa.q = Tensor::strided(qkv.data(), DType::bf16, {1, Hq, D}, {qkv_dim, D, 1}, dev);
  pa.cache = cache.layer(0);
  pa.cu_q = Tensor(const_cast<int32_t*>(mi + 2), DType::i32, {2}, dev);
  pa.kv_lens = Tensor(const_cast<int32_t*>(mi + 4), DType::i32, {1}, dev);
  pa.page_table = Tensor(pt.data(), DType::i32, {1, pages}, dev);
  pa.out = Tensor(att.data(), DType::bf16, {1, Hq, D}, dev);
  pa.scale = float(1.0 / std::sqrt(double(D)));
  Tensor row0(const_cast<int32_t*>(mi + 5), DType::i32, {1}, dev);
  Tensor tl(logits.data(), DType::f32, {1, c.vocab_size}, dev);
  struct Op {
    const char* name;
    int64_t per_step;
    std::function<void(int)> fn;  // the call for layer l (GEMMs read layer l's weights: no L2 reuse)
  };
  const auto& layers = m.weights().layers;
  const std::vector<Op> ops_list = {
      {"embedding", 1,
       [&](int) {
         ops::embedding(m.weights().embed, Tensor(const_cast<int32_t*>(mi), DType::i32, {1}, dev), tx);
       }},
      {"rms_norm (first layer)", 1, [&](int l) { ops::rms_norm(tr, layers[size_t(l)].input_norm, eps, tn); }},
      // The ops as the model calls them: the residual add and RMSNorm of the previous projection's output
      // belong to QKV and gate_up (in their GEMV's prologue where the tuner chose the GEMV and
      // KILN_GEMV_NORM_IN is on, else the add_rms_norm kernel first); QKV with attn_prep (one kernel with
      // KILN_GEMV_ATTN_PREP=1, else QKV then attn_prep).
      {"add_rms_norm + qkv + attn_prep (op)", L,
       [&](int l) {
         ops::linear_attn_prep(ops::ResidualNorm{tx, tr, layers[size_t(l)].input_norm, eps, tn},
                               layers[size_t(l)].qkv, prep);
       }},
      {"paged_attention", L, [&](int) { ops::paged_attention(pa); }},
      {"o_proj", L, [&](int l) { ops::linear(ta, layers[size_t(l)].o_proj, tx); }},
      {"add_rms_norm + gate_up + silu_and_mul (op)", L,
       [&](int l) {
         ops::linear_silu_mul(ops::ResidualNorm{tx, tr, layers[size_t(l)].post_norm, eps, tn},
                              layers[size_t(l)].gate_up, tg, tact);
       }},
      {"down", L, [&](int l) { ops::linear(tact, layers[size_t(l)].down, tx); }},
      // Their parts, not in the sum: QKV alone, attn_prep alone, the add + RMSNorm kernel alone.
      {"qkv gemm", 0, [&](int l) { ops::linear(tn, layers[size_t(l)].qkv, tq); }},
      {"attn_prep", 0, [&](int) { ops::attn_prep(prep); }},
      {"add_rms_norm", 0, [&](int l) { ops::add_rms_norm(tx, tr, layers[size_t(l)].post_norm, eps, tn); }},
      {"lm_head", 1, [&](int) { ops::lm_head(tn, row0, m.weights().lm_head, tl); }},
  };
  // Each op: L calls (one per layer) captured in one CUDA graph on a private stream, the replay timed
  // with events (median of 20) and divided by L: kernel time plus the in-graph launch gap, as in a
  // graph-replayed step.
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  prep.stream = s;
  // Each op timed twice: launched plainly, and with programmatic dependent launch (PDL) between its calls.
  const auto time_op = [&](const Op& op, bool pdl) {
    cuda::StreamScope scope(s);
    const bool before = cuda::pdl_enabled();
    cuda::set_pdl(pdl);
    op.fn(0);  // warm-up (plans, scratch)
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < int(L); ++l) op.fn(l);
    KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    cuda::set_pdl(before);
    cudaGraphExec_t e = nullptr;
    KILN_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    cudaEvent_t a, b;
    KILN_CUDA_CHECK(cudaEventCreate(&a));
    KILN_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int r = 0; r < 21; ++r) {
      KILN_CUDA_CHECK(cudaEventRecord(a, s));
      KILN_CUDA_CHECK(cudaGraphLaunch(e, s));
      KILN_CUDA_CHECK(cudaEventRecord(b, s));
      KILN_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (r > 0) t.push_back(double(ms) * 1000.0 / double(L));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    return median(t);
  };
  std::vector<double> us, us_pdl;
  double total = 0, total_pdl = 0;
  int64_t launches = 0;
  for (const auto& op : ops_list) {
    us.push_back(time_op(op, false));
    us_pdl.push_back(time_op(op, true));
    total += us.back() * double(op.per_step);
    total_pdl += us_pdl.back() * double(op.per_step);
    launches += op.per_step;
  }
  cudaStreamDestroy(s);
  std::printf(
      "\nper-op breakdown of one decode step (context %d; each op as %lld graph-replayed calls, one per "
      "layer's weights, median of 20 replays):\n",
      ctx, (long long)L);
  std::printf("  %-44s %10s %10s %8s %12s %7s\n", "op", "us/call", "with PDL", "calls", "us/step", "share");
  for (size_t i = 0; i < ops_list.size(); ++i)
    std::printf("  %-44s %10.2f %10.2f %8lld %12.1f %6.1f%%\n", ops_list[i].name, us[i], us_pdl[i],
                (long long)ops_list[i].per_step, us[i] * double(ops_list[i].per_step),
                100.0 * us[i] * double(ops_list[i].per_step) / total);
  std::printf("  %-44s %10s %10s %8lld %12.1f   (sum over ops; %lld op calls per step; with PDL %.1f)\n",
              "total", "", "", (long long)launches, total, (long long)launches, total_pdl);
}

// --tp N: decode TPOT through TpRunner, eager and from its graphs.
int bench_model_tp(const cli::Flags& f) {
  KILN_CHECK(f.has("model"), "kiln bench model --tp needs --model DIR (its config.json; random weights)");
  EngineOptions eo;
  eo.model_dir = f.str("model");
  eo.tp = int(f.i64("tp", 1));
  eo.device = "cuda";
  eo.load_format = "random";
  eo.kv_layout = "hnd";
  eo.kv_cache_dtype = f.str("kv-dtype", "bf16") == "fp8" ? "fp8_e4m3" : "bf16";
  eo.seed = uint64_t(f.i64("seed", 0));
  const int32_t ctx = int32_t(f.i64("context", 1024)), steps = int32_t(f.i64("steps", 32));
  const int32_t ps = int32_t(f.i64("page-size", 32));
  KILN_CHECK(ctx >= 2 && steps >= 1 && ps > 0, "bad --context/--steps/--page-size");
  eo.max_context_len = ctx + steps + 16;
  const auto t0 = std::chrono::steady_clock::now();
  TpRunner r(eo, tp_runner_options(eo));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t V = r.config().vocab_size;
  const int32_t pages = (ctx + steps + ps - 1) / ps + 1;
  r.allocate_kv(pages, ps);
  std::vector<float> logits;
  for (int32_t s = 0; s < ctx - 1; s += 4096)
    r.forward(one_seq(s, std::min(4096, ctx - 1 - s), pages, ps, V), &logits, nullptr);
  std::vector<ModelRunner::RowSampling> greedy(1);
  greedy[0].temperature = 0.0f;
  std::vector<ModelRunner::SampledRow> sampled;
  auto tpot = [&](int32_t first) {
    std::vector<double> t;
    for (int32_t i = 0; i < steps + 3; ++i) {
      const auto a = std::chrono::steady_clock::now();
      r.forward_sampled(one_seq(first + i, 1, pages, ps, V), greedy, 0, &sampled);
      if (i >= 3)
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    return median(t);
  };
  const double eager = tpot(ctx - 1);
  ModelRunner::GraphPlan gp;
  gp.buckets = {1};
  gp.max_pages_per_seq = pages;
  gp.max_step_tokens = 4096;
  gp.max_seqs = 1;
  r.prepare_graphs(gp);
  KILN_CHECK(r.graph_bucket(one_seq(ctx - 1, 1, pages, ps, V)) == 1, "no decode graph for batch 1");
  const double graph = tpot(ctx - 1);  // rewrites the same slots with the same values
  std::printf(
      "tensor parallelism %d: random weights in %.1f s; decode TPOT at context %d (batch 1, greedy on "
      "the GPU): eager %.3f ms, CUDA graph %.3f ms\n",
      eo.tp, load_s, ctx, eager, graph);
  return 0;
}

int run_bench_model(const cli::Args& args) {
  const cli::Flags f(args,
                     {"shape", "model", "context", "steps", "prefill", "kv-dtype", "page-size", "seed",
                      "batch", "tp", "quantization", "verify-rows"},
                     {"no-breakdown"});
  KILN_CHECK(cuda_available(), "kiln bench model needs a CUDA GPU; none is visible");
  if (f.has("tp")) return bench_model_tp(f);  // --tp 1 too: the TP path with a one-rank NCCL group
  const ModelConfig cfg = f.has("model") ? load_model_config(f.str("model"))
                                         : cli::builtin_qwen3_shape(f.str("shape", "qwen3-4b"));
  const int32_t ctx = int32_t(f.i64("context", 1024)), steps = int32_t(f.i64("steps", 32));
  const int32_t prefill = int32_t(f.i64("prefill", 0)), ps = int32_t(f.i64("page-size", 32));
  KILN_CHECK(ctx >= 1 && steps >= 1 && prefill >= 0 && ps > 0, "bad --context/--steps/--prefill/--page-size");
  const std::string kvd = f.str("kv-dtype", "bf16");
  KILN_CHECK(kvd == "bf16" || kvd == "fp8", "--kv-dtype: bf16 or fp8");
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double gbps = copy_gbps();
  const double tflops = matmul_tflops();
  std::printf("device %s: copy %.0f GB/s (read + written), bf16 matmul %.0f TFLOP/s (8192^3, tuned)\n",
              prop.name, gbps, tflops);
  LoadOptions o;
  o.device = Device::cuda();
  o.load_format = LoadFormat::random;
  o.seed = uint64_t(f.i64("seed", 0));
  // fp8: the random bf16 weights quantized into block-FP8 on the host and kept e4m3 + scales on the device
  // (sm_89+; KILN_FP8_DEQUANT=1 dequantizes them at load instead, for A/B): the weight-only FP8 GEMV for
  // M <= 8 where tuned, dequantize + the bf16 GEMM otherwise (model/fp8_weights.h).
  o.quantization = f.str("quantization", "none");
  o.max_position = std::max(ctx + steps, prefill) + 80;  // + 80: --verify-rows up to 65 past the context
  const auto t0 = std::chrono::steady_clock::now();
  auto m = Qwen3Model::create(cfg, nullptr, o);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = m->config();
  const int64_t wbytes = weight_bytes(m->weights(), c.tie_word_embeddings);
  std::printf(
      "model: hidden %lld, layers %lld, heads %lld/%lld, D %lld, I %lld, vocab %lld; %.2f GB of weights "
      "read per token; random weights in %.1f s\n",
      (long long)c.hidden_size, (long long)c.num_layers, (long long)c.num_heads, (long long)c.num_kv_heads,
      (long long)c.head_dim, (long long)c.intermediate_size, (long long)c.vocab_size, double(wbytes) / 1e9,
      load_s);
  const int32_t max_tokens = std::max(ctx + steps, prefill);
  const int32_t pages = (max_tokens + ps - 1) / ps + 1;
  KvCache cache(c, pages, ps, ops::KvLayout::hnd, kvd == "fp8" ? DType::f8e4m3 : DType::bf16, Device::cuda());
  Buffer logits(size_t(c.vocab_size) * 4, Device::cuda());
  const Tensor tl(logits.data(), DType::f32, {1, c.vocab_size}, Device::cuda());

  if (prefill > 0) {
    const BatchDesc b = one_seq(0, prefill, pages, ps, c.vocab_size);
    m->forward(b, cache, tl);  // warm-up: workspace, GEMM plans
    // One more forward inside a profiler range, so `ncu --profile-from-start off` sees exactly one prompt's
    // kernels (`bench/device.sh prefill`); a no-op without a profiler.
    KILN_CUDA_CHECK(cudaProfilerStart());
    m->forward(b, cache, tl);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    KILN_CUDA_CHECK(cudaProfilerStop());
    const double ms = time_ms(3, [&] { m->forward(b, cache, tl); });
    const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, L = c.num_layers;
    // A sparse layer's MLP: the router and its top-k experts' SwiGLU.
    double per_tok = 0;
    for (int64_t l = 0; l < L; ++l)
      per_tok += 2.0 * double(H * (c.num_heads + 2 * c.num_kv_heads) * D + c.num_heads * D * H +
                              (c.is_moe_layer(l) ? c.moe.num_experts * H + c.moe.num_experts_per_tok * 3 * H *
                                                                               c.moe.moe_intermediate_size
                                                 : 3 * H * I));
    const double attn =
        2.0 * 2.0 * double(L) * double(c.num_heads) * double(D) * double(prefill) * double(prefill) / 2;
    const double flops = per_tok * prefill + attn + 2.0 * double(H) * double(c.vocab_size);
    const double floor_ms = flops / (tflops * 1e12) * 1e3;
    std::printf(
        "\nprefill %d tokens: %.2f ms = %.0f tok/s, %.0f TFLOP/s; floor (%.2e FLOP at %.0f TFLOP/s) %.2f ms "
        "= %.0f tok/s; %.0f%% of the matmul rate\n",
        prefill, ms, prefill / (ms * 1e-3), flops / (ms * 1e-3) / 1e12, flops, tflops, floor_ms,
        prefill / (floor_ms * 1e-3), 100.0 * floor_ms / ms);
  }
  // Fill the cache to ctx - 1 tokens in prefill chunks of <= 4096, then time decode steps.
  for (int32_t s = 0; s < ctx - 1; s += 4096)
    m->forward(one_seq(s, std::min(4096, ctx - 1 - s), pages, ps, c.vocab_size), cache, tl);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> tpot;
  for (int32_t i = 0; i < steps + 3; ++i) {
    const BatchDesc b = one_seq(ctx - 1 + i, 1, pages, ps, c.vocab_size);
    const auto a = std::chrono::steady_clock::now();
    m->forward(b, cache, tl);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    if (i >= 3)
      tpot.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  const double kv_bytes = double(KvCache::bytes_per_token(c, cache.dtype())) * ctx;
  const double floor_ms = (double(wbytes) + kv_bytes) / (gbps * 1e9) * 1e3;
  const double t = median(tpot);
  std::printf(
      "\ndecode TPOT at context %d (eager, batch 1, %s cache): median %.3f ms (min %.3f) over %d steps; "
      "floor %.3f ms ((%.2f GB weights + %.3f GB KV) / %.0f GB/s); %.0f%% of the bandwidth floor\n",
      ctx, kvd.c_str(), t, *std::min_element(tpot.begin(), tpot.end()), steps, floor_ms, double(wbytes) / 1e9,
      kv_bytes / 1e9, gbps, 100.0 * floor_ms / t);
  // The batch-1 residual-norm prologue chosen from the whole step, as kiln serve chooses it before capturing.
  cuda_choose_norm_in_by_step(*m, cache, /*pdl=*/true);
  // The same steps replayed from the decode CUDA graph (staging copies included in each step's time),
  // without and with programmatic dependent launch between kiln's own kernels.
  for (bool pdl : {false, true}) {
    CudaDecodeGraph g(*m, cache, pages, 1, {}, pdl);
    std::vector<double> gt;
    for (int32_t i = 0; i < steps + 3; ++i) {
      const BatchDesc b = one_seq(ctx - 1 + i, 1, pages, ps, c.vocab_size);
      const auto a = std::chrono::steady_clock::now();
      g.step(b);
      KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(g.stream())));
      if (i >= 3)
        gt.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    const double tg = median(gt);
    std::printf(
        "decode TPOT at context %d (CUDA graph%s): median %.3f ms (min %.3f); %.0f%% of the bandwidth "
        "floor\n",
        ctx, pdl ? " + PDL" : "", tg, *std::min_element(gt.begin(), gt.end()), 100.0 * floor_ms / tg);
  }
  if (f.has("batch"))
    for (int64_t B : cli::parse_int_list(f.str("batch"), "batch")) {
      KILN_CHECK(B <= 1024, "--batch ", B, " is too large (at most 1024)");
      bench_batch_decode(*m, int32_t(B), ctx, steps, ps, cache.dtype(),
                         weight_bytes(m->weights(), c.tie_word_embeddings, B), gbps);
    }
  if (f.has("verify-rows"))
    for (int64_t q : cli::parse_int_list(f.str("verify-rows"), "verify-rows")) {
      KILN_CHECK(q >= 2 && q <= 65, "--verify-rows ", q,
                 " must be in [2, 65] (the last token and the drafts)");
      bench_verify(*m, int32_t(q), ctx, steps, ps, cache.dtype());
    }
  // The per-op breakdown times the dense MLP's ops: not a MoE model's.
  if (!f.flag("no-breakdown") && !c.has_moe_layers()) breakdown(*m, cache, ctx, pages, ps);
  return 0;
}
#else
int run_bench_model(const kiln::cli::Args& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") throw kiln::cli::HelpRequested{};  // main() prints the summary
  KILN_FAIL("kiln was built without CUDA: no model benchmark");
}
#endif

}  // namespace

KILN_COMMAND("bench model",
             "time prefill and single-stream decode of a Qwen3 shape on the GPU (random weights)",
             run_bench_model);
