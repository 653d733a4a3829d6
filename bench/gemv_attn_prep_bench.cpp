// gemv_attn_prep benchmark: the decode QKV projection with the attention preparation, Qwen3-4B (K 2560, 32/8
// heads) and Qwen3-0.6B (K 1024, 16/8) at D128, HND page-32 BF16 cache, Q in place, M = 1, 4, 8: the GEMV
// then the fused attn_prep decode kernel (two launches) against gemv_attn_prep (one), for every GEMV config
// (the tensor-core kernel with and without its register cap, gemv.h: gemv_tail_min_blocks), and
// ops::linear_attn_prep with the switch off and on (the tuner's config, what the model runs). W rotated over
// copies exceeding 2.2x the L2, the L2 flushed before every sample; graph replays, plus "amortized" (16 in
// one graph / 16). Bytes: W + x + qkv written + Q / K / V rewritten (W dominates).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/tensor.h"
#include "ops/attn_prep.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_attn_prep.h"
#include "ops/linear.h"
#include "ops/rope_table.h"

namespace kiln::bench {
namespace {

namespace kc = ::kiln::cuda;

constexpr int kHkv = 8, kD = 128, kPage = 32, kPages = 64, kMaxPos = 8192;

std::string config_name(kc::GemvConfig c) {
  return std::string(c.tensor_cores ? "tc" : "fma") + " w" + std::to_string(c.warps);
}

void run_gemv_attn_prep(const Env& env, std::vector<Row>& rows) {
  const Device dev = Device::cuda();
  std::mt19937_64 rng(9);
  Buffer table = ops::build_rope_table(kD, 1e6, kMaxPos, dev);
  for (const auto& [model, K, Hq] : {std::tuple{"4B", int64_t(2560), 32}, {"0.6B", int64_t(1024), 16}}) {
    const int64_t N = int64_t(Hq + 2 * kHkv) * kD;
    const size_t w_bytes = size_t(N * K) * 2;
    const size_t copies = std::max<size_t>(4, (env.l2_bytes * 22 / 10 + w_bytes - 1) / w_bytes);
    std::vector<Buffer> w;
    for (size_t i = 0; i < copies; ++i) {
      w.emplace_back(w_bytes, dev);
      kc::fill_random_bf16(w.back().data(), N * K, 500 + i, 0.02f, 0.0f, env.stream);
    }
    const int64_t M8 = kc::kGemvMaxM;
    Buffer x(size_t(M8 * K) * 2, dev), qkv(size_t(M8 * N) * 2, dev), norm(kD * 2, dev);
    kc::fill_random_bf16(x.data(), M8 * K, 3, 1.0f, 0.0f, env.stream);
    kc::fill_random_bf16(norm.data(), kD, 4, 0.25f, 1.0f, env.stream);
    const size_t cache_bytes = size_t(kPages) * kPage * kHkv * kD * 2;
    Buffer kcache(cache_bytes, dev), vcache(cache_bytes, dev), pos(M8 * 4, dev), slots(M8 * 8, dev);
    std::vector<int32_t> p(M8);
    std::vector<int64_t> s(M8);
    for (int64_t t = 0; t < M8; ++t) p[size_t(t)] = int32_t(rng() % kMaxPos), s[size_t(t)] = t * kPage + 3;
    copy_bytes(pos.data(), dev, p.data(), Device::cpu(), p.size() * 4);
    copy_bytes(slots.data(), dev, s.data(), Device::cpu(), s.size() * 8);
    KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    for (const int64_t M : {1, 4, 8}) {
      ops::AttnPrepArgs a;
      a.qkv = Tensor(qkv.data(), DType::bf16, {M, N}, dev);
      a.q_norm = a.k_norm = Tensor(norm.data(), DType::bf16, {kD}, dev);
      a.eps = 1e-6f;
      a.positions = Tensor(pos.data(), DType::i32, {M}, dev);
      a.rope = ops::rope_table_view(table, kD, kMaxPos);
      a.slot_mapping = Tensor(slots.data(), DType::i64, {M}, dev);
      a.cache.k = Tensor(kcache.data(), DType::bf16, {kPages, kHkv, kPage, kD}, dev);
      a.cache.v = Tensor(vcache.data(), DType::bf16, {kPages, kHkv, kPage, kD}, dev);
      a.cache.layout = ops::KvLayout::hnd;
      a.cache.page_size = kPage;
      a.num_q_heads = Hq, a.num_kv_heads = kHkv, a.head_dim = kD;
      a.stream = env.stream;
      const kc::AttnPrepParams params = ops::attn_prep_params(a);
      const std::string shape = std::string(model) + " qkv M=" + std::to_string(M) +
                                " N=" + std::to_string(N) + " K=" + std::to_string(K) + " HND bf16";
      const double bytes = double(w_bytes) + double(M * K) * 2 + 2.0 * double(M * N) * 2;
      auto wi = [&](int i) { return w[size_t(i) % copies].data(); };
      auto time_row = [&](Row r, const std::function<void(int)>& launch) {
        launch(0);
        KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
        time_graph_row(env, launch, int(copies), r);
        rows.push_back(r);
      };
      for (const kc::GemvConfig cfg : kc::kGemvConfigs) {
        if (!kc::gemv_fusable(cfg)) continue;
        const std::string sfx = config_name(cfg);
        time_row(Row{"gemv_attn_prep", "gemv+attn_prep " + sfx, shape, 0, -1, bytes, "two launches"},
                 [&](int i) {
                   kc::gemv(x.data(), K, wi(i), K, qkv.data(), N, M, N, K, kc::GemvEpilogue::bf16, cfg,
                            env.stream);
                   ops::attn_prep(a);
                 });
        // The tensor-core kernel with and without its register cap (gemv.h: gemv_tail_min_blocks).
        for (const int cap : {0, 3}) {
          if (cap == 3 && !cfg.tensor_cores) continue;
          const std::string v = "fused " + sfx + (cfg.tensor_cores ? " cap" + std::to_string(cap) : "");
          time_row(Row{"gemv_attn_prep", v, shape, 0, -1, bytes, "gemv_attn_prep"}, [&](int i) {
            kc::gemv_attn_prep(x.data(), K, wi(i), K, M, K, params, cfg, env.stream, false, cap);
          });
        }
      }
      // The dispatcher as the model calls it (the tuner's GEMV config, PDL per the context's switch).
      const Tensor tx(x.data(), DType::bf16, {M, K}, dev);
      for (const bool fused : {false, true}) {
        kc::gemm_engine().set_gemv_attn_prep(fused);
        kc::StreamScope scope(env.stream);
        time_row(Row{"gemv_attn_prep", fused ? "op fused" : "op unfused", shape, 0, -1, bytes, "engine"},
                 [&](int i) {
                   ops::linear_attn_prep(tx, Tensor(wi(i), DType::bf16, {N, K}, dev), a);
                 });
      }
      kc::gemm_engine().set_gemv_attn_prep(false);
    }
  }
}

}  // namespace

KILN_KERNEL_BENCH("gemv_attn_prep", "QKV GEMV + attention preparation: two launches vs one",
                  run_gemv_attn_prep);

}  // namespace kiln::bench
