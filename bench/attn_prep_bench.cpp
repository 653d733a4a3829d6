// attn_prep benchmark: fused (the dispatcher's choice) vs unfused, Qwen3-4B heads (32 Q / 8 KV, D128),
// page 32, HND and NHD, BF16 and FP8 cache, T = 1 .. 8192. Decode-sized T (<= 128) writes Q in place into
// the QKV rows and scatters tokens over random pages at random positions; larger T is a prefill: Q written
// contiguous, positions 0..T-1, consecutive slots. T <= 128 is timed as graph replays (+ amortized).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "bench/kernel_bench.h"
#include "kiln/tensor.h"
#include "ops/attn_prep.h"
#include "ops/cuda/common.cuh"

namespace kiln::bench {
namespace {

using ops::AttnPrepArgs;
using ops::KvLayout;

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 32, kMaxPos = 32768;

struct Set {
  std::vector<Buffer> bufs;
  AttnPrepArgs args;
};

struct Config {
  int T;
  KvLayout layout;
  DType cache;
  bool q_contig() const { return T > 128; }
};

double bytes_moved(const Config& c) {
  const double W = (kHq + 2 * kHkv) * kD, T = c.T;
  const double esz = c.cache == DType::f8e4m3 ? 1 : 2;
  double b = T * W * 2;                                         // qkv read
  b += T * kHq * kD * 2;                                        // Q written
  b += T * 2 * kHkv * kD * esz;                                 // K and V written to the cache
  if (c.cache == DType::f8e4m3) b += T * 2 * kHkv * (kD / 64);  // UE8M0 scales
  b += T * kD * 4;                                              // one cos/sin table row per token
  b += T * (4 + 8);                                             // position and slot
  return b + 2 * kD * 2;                                        // norm weights
}

Set make_set(const Config& c, const std::vector<uint16_t>& qkv_host, const Buffer& table,
             std::mt19937_64& rng) {
  Set s;
  const Device dev = Device::cuda();
  const int64_t W = int64_t(kHq + 2 * kHkv) * kD, T = c.T;
  const int64_t pages = std::max<int64_t>((T + kPage - 1) / kPage + 1, 64);
  auto add = [&](size_t bytes) -> void* {
    s.bufs.emplace_back(std::max<size_t>(bytes, 16), dev);
    return s.bufs.back().data();
  };
  void* qkv = add(qkv_host.size() * 2);
  copy_bytes(qkv, dev, qkv_host.data(), Device::cpu(), qkv_host.size() * 2);
  std::vector<uint16_t> w(kD, f32_to_bf16(1.0f).bits);
  void* qn = add(kD * 2);
  void* kn = add(kD * 2);
  copy_bytes(qn, dev, w.data(), Device::cpu(), kD * 2);
  copy_bytes(kn, dev, w.data(), Device::cpu(), kD * 2);
  std::vector<int32_t> pos(T);
  std::vector<int64_t> slots(T);
  std::vector<int64_t> page_ids(pages);
  for (int64_t i = 0; i < pages; ++i) page_ids[i] = i;
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  for (int64_t t = 0; t < T; ++t) {
    if (c.q_contig()) {  // prefill: one sequence
      pos[t] = int32_t(t);
      slots[t] = t;
    } else {  // decode: T sequences, each on its own page
      pos[t] = int32_t(rng() % kMaxPos);
      slots[t] = page_ids[t % pages] * kPage + int64_t(rng() % kPage);
    }
  }
  void* p = add(T * 4);
  void* sl = add(T * 8);
  copy_bytes(p, dev, pos.data(), Device::cpu(), T * 4);
  copy_bytes(sl, dev, slots.data(), Device::cpu(), T * 8);
  const size_t esz = c.cache == DType::f8e4m3 ? 1 : 2;
  const size_t cache_bytes = size_t(pages) * kPage * kHkv * kD * esz;
  void* kc = add(cache_bytes);
  void* vc = add(cache_bytes);
  AttnPrepArgs& a = s.args;
  a.qkv = Tensor(qkv, DType::bf16, {T, W}, dev);
  if (c.q_contig()) a.q_out = Tensor(add(T * kHq * kD * 2), DType::bf16, {T, kHq, kD}, dev);
  a.q_norm = Tensor(qn, DType::bf16, {kD}, dev);
  a.k_norm = Tensor(kn, DType::bf16, {kD}, dev);
  a.positions = Tensor(p, DType::i32, {T}, dev);
  a.rope = ops::rope_table_view(table, kD, kMaxPos);
  a.slot_mapping = Tensor(sl, DType::i64, {T}, dev);
  const bool nhd = c.layout == KvLayout::nhd;
  auto shape4 = [&](void* ptr, DType t, int64_t last) {
    return nhd ? Tensor(ptr, t, {pages, kPage, kHkv, last}, dev)
               : Tensor(ptr, t, {pages, kHkv, kPage, last}, dev);
  };
  a.cache.k = shape4(kc, c.cache, kD);
  a.cache.v = shape4(vc, c.cache, kD);
  if (c.cache == DType::f8e4m3) {
    a.cache.k_scale = shape4(add(size_t(pages) * kPage * kHkv * 2), DType::u8, kD / 64);
    a.cache.v_scale = shape4(add(size_t(pages) * kPage * kHkv * 2), DType::u8, kD / 64);
  }
  a.cache.layout = c.layout;
  a.cache.page_size = kPage;
  a.num_q_heads = kHq;
  a.num_kv_heads = kHkv;
  a.head_dim = kD;
  return s;
}

size_t set_bytes(const Set& s) {
  size_t b = 0;
  for (const Buffer& x : s.bufs) b += x.bytes();
  return b;
}

void run_attn_prep(const Env& env, std::vector<Row>& rows) {
  std::mt19937_64 rng(42);
  Buffer table = ops::build_rope_table(kD, 1e6, kMaxPos, Device::cuda());
  for (DType cache : {DType::bf16, DType::f8e4m3}) {
    for (KvLayout layout : {KvLayout::hnd, KvLayout::nhd}) {
      for (int T : {1, 2, 4, 8, 16, 32, 64, 128, 512, 4096, 8192}) {
        if (const char* only = std::getenv("KILN_ATTN_PREP_T"); only && std::atoi(only) != T) continue;
        const Config c{T, layout, cache};
        std::vector<uint16_t> qkv(size_t(T) * (kHq + 2 * kHkv) * kD);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (auto& v : qkv) v = f32_to_bf16(nd(rng)).bits;
        // Rotate >= 4 sets whose allocations total > 2.2x the L2 (each sample also starts from a flushed L2).
        std::vector<Set> sets;
        size_t total = 0;
        while (sets.size() < 4 || (total < env.l2_bytes * 22 / 10 && sets.size() < 64)) {
          sets.push_back(make_set(c, qkv, table, rng));
          total += set_bytes(sets.back());
        }
        const std::string shape = "T=" + std::to_string(T) + (layout == KvLayout::hnd ? " HND " : " NHD ") +
                                  (cache == DType::bf16 ? "bf16" : "fp8") +
                                  (c.q_contig() ? " q-contig" : " q-inplace");
        // fused (the dispatcher's choice), fused with PDL (graphed sizes), unfused, and for prefill sizes
        // each fused kernel forced (the dispatcher's threshold and kernel choice come from these rows).
        for (int variant : {0, 1, 2, 3, 4, 5}) {
          if ((variant == 1 && T > 128) || (variant >= 3 && T <= 128)) continue;
          static const char* names[] = {"fused",
                                        "fused+pdl",
                                        "unfused",
                                        "fused:decode-kernel",
                                        "fused:prefill-kernel",
                                        "fused:streaming-kernel"};
          Row r{"attn_prep", names[variant], shape};
          r.bytes = bytes_moved(c);
          auto launch = [&](int i) {
            AttnPrepArgs a = sets[size_t(i) % sets.size()].args;
            a.stream = env.stream;
            a.pdl = variant == 1;
            if (variant < 2) {
              r.path = ops::attn_prep_path_name(ops::attn_prep(a));
            } else if (variant == 2) {
              ops::attn_prep_unfused(a);
              r.path = "cuda_unfused (4 kernels)";
            } else {
              static const ops::AttnPrepKernel k[] = {ops::AttnPrepKernel::decode,
                                                      ops::AttnPrepKernel::prefill,
                                                      ops::AttnPrepKernel::prefill_streaming};
              ops::attn_prep_fused(a, k[variant - 3]);
              r.path = "forced";
            }
          };
          if (T <= 128) {
            time_graph_row(env, launch, int(sets.size()), r);
          } else {
            r.us = time_cold_us(env, launch);
          }
          KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
          rows.push_back(r);
        }
      }
    }
  }
}

}  // namespace

KILN_KERNEL_BENCH("attn_prep", "fused vs unfused attention preparation, Qwen3-4B heads, page 32",
                  run_attn_prep);

}  // namespace kiln::bench
