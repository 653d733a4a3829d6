// Paged attention benchmark at the Qwen3-4B heads (32 Q / 8 KV, D 128), page 32, HND, bf16 and fp8 caches.
// Decode: the decode kernels (cuda::DecodeKernel v1 (small shapes only), v2, v3) for B = 1 at context 1024
// and 8192, B = 8 and 32 at 1024, B = 64 and 128 at 9216, each row timed as CUDA-graph replays of
// paged_attention (decode + combine, as the model's decode graphs run it) plus "amortized" (16 in one graph /
// 16). The page table reaches max(4160, context + 1024) tokens per sequence (4160: the table behind
// docs/PERF.md's 1024-context decode numbers), so the shape-only split count is the engine's. Prefill: one
// 4096- and one 8192-token prompt, the prefill kernel alone (v1, v2, v3 and v4, cuda::PrefillKernel; with an
// fp8 cache v2 runs v1's loads and v3 shares them between two heads; v4 is the Hopper wgmma kernel, its path
// column says whether its tiles came by TMA or were gathered, or that it did not apply and ran v3). Every set
// (>= 4, rotated) has its own page-table permutation, q, out and workspace over one cache pool; every sample
// starts from a flushed L2. Bytes: K and V rows read (fp8: + their UE8M0 scales) + q read + out written; the
// split partials the combine reads are not counted (the floor does not pay them). The prefill row's path
// column adds its FLOPs (4 Hq D per causal (query, key) pair) and TFLOP/s.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>

#include "bench/kernel_bench.h"
#include "kiln/cuda_check.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "ops/cuda/attention.h"

namespace kiln::bench {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 32, kSets = 4;

struct Shape {
  int B = 1, ctx = 0, q_len = 1;  // q_len > 1: one prefill sequence of q_len new tokens
  bool fp8 = false;
  int table_tokens() const { return std::max(4160, ctx + 1024); }
  int pages_per_seq() const { return (table_tokens() + kPage - 1) / kPage; }
  int T() const { return B * q_len; }
};

// One cache pool (K, V, fp8 scales) shared by the sets of a shape, filled with a constant (the timing does
// not depend on the values): bf16 0x3c3c (about 0.0115), e4m3 0x3c (1.5) with scale byte 127 (x 1).
struct Pool {
  Buffer k, v, ks, vs;
  int num_pages = 0;
};

Pool make_pool(const Shape& s) {
  Pool pool;
  pool.num_pages = s.B * s.pages_per_seq();
  const size_t rows = size_t(pool.num_pages) * kPage * kHkv;
  const size_t bytes = rows * kD * (s.fp8 ? 1 : 2);
  pool.k = Buffer(bytes, Device::cuda());
  pool.v = Buffer(bytes, Device::cuda());
  KILN_CUDA_CHECK(cudaMemset(pool.k.data(), 0x3c, bytes));
  KILN_CUDA_CHECK(cudaMemset(pool.v.data(), 0x3c, bytes));
  if (s.fp8) {
    pool.ks = Buffer(rows * (kD / 64), Device::cuda());
    pool.vs = Buffer(rows * (kD / 64), Device::cuda());
    KILN_CUDA_CHECK(cudaMemset(pool.ks.data(), 127, pool.ks.bytes()));
    KILN_CUDA_CHECK(cudaMemset(pool.vs.data(), 127, pool.vs.bytes()));
  }
  return pool;
}

// KILN_ATTN_BENCH_PAGES=contiguous: each sequence's pages in pool order (as a fresh pool hands them out)
// instead of shuffled over the whole pool; the A/B of the two says what the paged gather costs.
bool contiguous_pages() {
  const char* v = std::getenv("KILN_ATTN_BENCH_PAGES");
  return v && std::string(v) == "contiguous";
}
// KILN_ATTN_BENCH_ONLY=TEXT: only the shapes whose name contains TEXT (profiling one shape).
bool shape_selected(const std::string& name) {
  const char* v = std::getenv("KILN_ATTN_BENCH_ONLY");
  return !v || !*v || name.find(v) != std::string::npos;
}
// KILN_ATTN_BENCH_KERNELS=A,B,...: only the rows whose kernel ("decode v3", "prefill v4 unstaged", ...) is
// one of the names (an A/B run of the current kernels without the older generations).
bool kernel_selected(const std::string& kernel) {
  const char* v = std::getenv("KILN_ATTN_BENCH_KERNELS");
  if (!v || !*v) return true;
  const std::string list = std::string(",") + v + ",";
  return list.find("," + kernel + ",") != std::string::npos;
}

// KILN_ATTN_BENCH_SPLITS=N: decode rows run N splits instead of the shape rule's (0: the rule).
int forced_splits() {
  static const int n = [] {
    const char* v = std::getenv("KILN_ATTN_BENCH_SPLITS");
    return v && *v ? std::clamp(std::atoi(v), 0, 128) : 0;
  }();
  return n;
}

struct Set {
  Buffer q, out, cu_q, kv_lens, table, ws;
  cuda::PagedAttnParams p;
};

Set make_set(const Shape& s, const Pool& pool, std::mt19937& rng) {
  Set set;
  const Device dev = Device::cuda();
  const int T = s.T(), stride = s.pages_per_seq();
  std::vector<uint16_t> q(size_t(T) * kHq * kD);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : q) x = f32_to_bf16(u(rng)).bits;
  std::vector<int32_t> cu(size_t(s.B) + 1), lens(size_t(s.B), s.ctx), table(size_t(s.B) * stride);
  for (int b = 0; b <= s.B; ++b) cu[size_t(b)] = b * s.q_len;
  std::iota(table.begin(), table.end(), 0);
  if (!contiguous_pages()) std::shuffle(table.begin(), table.end(), rng);
  auto upload = [&](Buffer& dst, const void* src, size_t bytes) {
    dst = Buffer(bytes, dev);
    copy_bytes(dst.data(), dev, src, Device::cpu(), bytes);
  };
  upload(set.q, q.data(), q.size() * 2);
  set.out = Buffer(q.size() * 2, dev);
  upload(set.cu_q, cu.data(), cu.size() * 4);
  upload(set.kv_lens, lens.data(), lens.size() * 4);
  upload(set.table, table.data(), table.size() * 4);
  const int64_t s_row = kD, s_head = int64_t(kPage) * kD, s_page = int64_t(kPage) * kHkv * kD;  // HND
  set.p = {.q = set.q.data(),
           .q_stride_t = int64_t(kHq) * kD,
           .q_stride_h = kD,
           .out = set.out.data(),
           .o_stride_t = int64_t(kHq) * kD,
           .o_stride_h = kD,
           .k = pool.k.data(),
           .v = pool.v.data(),
           .s_page = s_page,
           .s_row = s_row,
           .s_head = s_head,
           .k_scale = s.fp8 ? static_cast<const uint8_t*>(pool.ks.data()) : nullptr,
           .v_scale = s.fp8 ? static_cast<const uint8_t*>(pool.vs.data()) : nullptr,
           .sc_page = s_page / 64,
           .sc_row = s_row / 64,
           .sc_head = s_head / 64,
           .kv_dtype = s.fp8 ? cuda::KvDtype::f8e4m3 : cuda::KvDtype::bf16,
           .cu_q = static_cast<const int32_t*>(set.cu_q.data()),
           .kv_lens = static_cast<const int32_t*>(set.kv_lens.data()),
           .page_table = static_cast<const int32_t*>(set.table.data()),
           .pages_stride = stride,
           .page_size = kPage,
           .num_pages = pool.num_pages,
           .B = s.B,
           .T = T,
           .Hq = kHq,
           .Hkv = kHkv,
           .D = kD,
           .scale = 1.0f / std::sqrt(float(kD)),
           .max_q_len = s.q_len,
           .prefill_pages = s.B * ((s.ctx + kPage - 1) / kPage)};
  // The decode partials (paged_attention; forced_splits() of them at most) or the fp8 prefill staging copy
  // (paged_attention_prefill).
  const size_t forced = size_t(s.B) * kHq * forced_splits() * (kD + 2) * sizeof(float);
  const size_t ws = std::max({cuda::paged_attention_workspace_bytes(set.p), forced,
                              cuda::paged_attention_prefill_workspace_bytes(set.p)});
  if (ws > 0) set.ws = Buffer(ws, dev);
  return set;
}

// K and V rows read (each sequence's causal context once per KV head), q read, out written.
double bytes_moved(const Shape& s) {
  const double keys = double(s.B) * s.ctx;
  double b = keys * kHkv * kD * (s.fp8 ? 1 : 2) * 2;
  if (s.fp8) b += keys * kHkv * (kD / 64) * 2;
  return b + double(s.T()) * kHq * kD * 2 * 2;
}

std::string shape_name(const Shape& s) {
  std::string n = "B=" + std::to_string(s.B) + " ctx=" + std::to_string(s.ctx);
  if (s.q_len > 1) n += " q_len=" + std::to_string(s.q_len);
  return n + " table=" + std::to_string(s.table_tokens()) + " 32/8 D128 page32 HND " +
         (s.fp8 ? "fp8" : "bf16") + (contiguous_pages() ? " contiguous-pages" : "");
}

void run_decode(const Env& env, std::vector<Row>& rows) {
  std::mt19937 rng(7);
  const Shape shapes[] = {{1, 1024}, {1, 8192}, {8, 1024}, {32, 1024}, {64, 9216}, {128, 9216}};
  const cuda::DecodeKernel before = cuda::decode_kernel();
  for (bool fp8 : {false, true}) {
    for (Shape s : shapes) {
      s.fp8 = fp8;
      if (!shape_selected(shape_name(s))) continue;
      const Pool pool = make_pool(s);
      std::vector<Set> sets;
      for (int i = 0; i < kSets; ++i) sets.push_back(make_set(s, pool, rng));
      for (cuda::DecodeKernel k : {cuda::DecodeKernel::v1, cuda::DecodeKernel::v2, cuda::DecodeKernel::v3}) {
        if (k == cuda::DecodeKernel::v1 && s.B * s.ctx > 32 * 1024) continue;  // v1: measured before, slow
        if (!kernel_selected(std::string("decode ") + cuda::decode_kernel_name(k))) continue;
        cuda::set_decode_kernel(k);
        const int splits =
            forced_splits() > 0 ? forced_splits() : cuda::paged_attention_decode_splits(sets[0].p);
        Row r{"attention", std::string("decode ") + cuda::decode_kernel_name(k), shape_name(s)};
        r.bytes = bytes_moved(s);
        r.path =
            "decode" + std::string(splits > 1 ? " + combine, splits=" + std::to_string(splits) : ", 1 split");
        auto launch = [&](int i) {
          const Set& set = sets[size_t(i) % sets.size()];
          // The combine with PDL, as the model's decode graphs launch it.
          cuda::paged_attention(set.p, set.ws.data(), env.stream, forced_splits(), /*pdl=*/true);
        };
        time_graph_row(env, launch, int(sets.size()), r);
        rows.push_back(r);
      }
    }
  }
  cuda::set_decode_kernel(before);
}

void run_prefill(const Env& env, std::vector<Row>& rows) {
  std::mt19937 rng(8);
  const cuda::PrefillKernel before = cuda::prefill_kernel();
  for (int len : {4096, 8192})
    for (bool fp8 : {false, true}) {
      const Shape s{.B = 1, .ctx = len, .q_len = len, .fp8 = fp8};
      if (!shape_selected(shape_name(s))) continue;
      const Pool pool = make_pool(s);
      std::vector<Set> sets;
      for (int i = 0; i < kSets; ++i) sets.push_back(make_set(s, pool, rng));
      // v4 twice with an fp8 cache: through the bf16 staging copy (the default) and without it.
      const int variants = fp8 ? 5 : 4;
      for (int vi = 0; vi < variants; ++vi) {
        const cuda::PrefillKernel k = cuda::PrefillKernel(std::min(vi, 3));
        const bool staged = vi == 3 && fp8;
        Row r{"attention",
              std::string("prefill ") + cuda::prefill_kernel_name(k) + (vi == 4 ? " unstaged" : ""),
              shape_name(s)};
        if (!kernel_selected(r.variant)) continue;
        cuda::set_prefill_kernel(k);
        r.bytes = bytes_moved(s);
        r.us = time_cold_us(env, [&](int i) {
          const Set& set = sets[size_t(i) % sets.size()];
          cuda::paged_attention_prefill(set.p, /*skip_single_rows=*/false, vi == 4 ? nullptr : set.ws.data(),
                                        env.stream);
        });
        KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
        const double pairs = double(s.q_len) * (s.q_len + 1) / 2;  // causal (query, key) pairs, ctx == q_len
        const double flop = 4.0 * kHq * kD * pairs;
        const char* what = !fp8                           ? "prefill kernel"
                           : k == cuda::PrefillKernel::v3 ? "fp8: v1 loads, shared by 2 heads"
                                                          : "fp8: v1 loads";
        if (k == cuda::PrefillKernel::v4)
          what = !cuda::prefill_sm90_applies(sets[0].p)   ? "v4 does not apply here: ran v3"
                 : cuda::prefill_sm90_uses_tma(sets[0].p) ? "wgmma, TMA tiles"
                 : staged && cuda::prefill_fp8_staging_bytes(sets[0].p) > 0
                     ? "fp8 staged to bf16, then wgmma + TMA"
                     : "wgmma, fp8 widened by the producer warpgroup";
        char path[112];
        std::snprintf(path, sizeof(path), "%s, %.3g FLOP, %.1f TFLOP/s", what, flop,
                      flop / (r.us * 1e-6) / 1e12);
        r.path = path;
        rows.push_back(r);
      }
    }
  cuda::set_prefill_kernel(before);
}

// A token-tree verify step (attention_tree.cu after the causal routing): one sequence's root and 12 nodes (4
// children of the root, each with a chain of 2 below it: a K = 4, 3-level tree), in one window of 13, beside
// the same call without tree fields (every row causal). The difference is the tree kernel's.
void run_tree(const Env& env, std::vector<Row>& rows) {
  std::mt19937 rng(9);
  constexpr int kNodes = 12;
  std::vector<uint64_t> mask(size_t(1 + kNodes));
  mask[0] = 1;
  for (int i = 0; i < kNodes; ++i) {
    const int parent = i < 4 ? -1 : i - 4;
    mask[size_t(1 + i)] = (parent < 0 ? uint64_t(1) : mask[size_t(1 + parent)]) | (uint64_t(1) << (1 + i));
  }
  const int32_t window = 1 + kNodes;
  const Device dev = Device::cuda();
  Buffer dmask(mask.size() * 8, dev), dwindow(4, dev);
  copy_bytes(dmask.data(), dev, mask.data(), Device::cpu(), mask.size() * 8);
  copy_bytes(dwindow.data(), dev, &window, Device::cpu(), 4);
  for (bool fp8 : {false, true})
    for (const int ctx : {1024, 8192}) {
      const Shape s{.B = 1, .ctx = ctx, .q_len = 1 + kNodes, .fp8 = fp8};
      if (!shape_selected(shape_name(s))) continue;
      const Pool pool = make_pool(s);
      std::vector<Set> sets;
      for (int i = 0; i < kSets; ++i) sets.push_back(make_set(s, pool, rng));
      for (const bool tree : {false, true}) {
        Row r{"attention", tree ? "tree verify" : "tree verify, causal rows", shape_name(s) + " tree K4x3"};
        if (!kernel_selected(r.variant)) continue;
        r.bytes = bytes_moved(s);
        std::vector<cuda::PagedAttnParams> ps;
        for (const Set& set : sets) {
          cuda::PagedAttnParams p = set.p;
          if (tree) {
            p.tree_window = static_cast<const int32_t*>(dwindow.data());
            p.tree_mask = static_cast<const uint64_t*>(dmask.data());
          }
          ps.push_back(p);
        }
        Buffer ws(std::max<size_t>(256, cuda::paged_attention_workspace_bytes(ps[0])), dev);
        const int splits = tree ? cuda::paged_attention_tree_splits(ps[0]) : 0;
        r.path = tree ? "causal routing, then the tree kernel, splits=" + std::to_string(splits)
                      : "causal routing only";
        auto launch = [&](int i) {
          cuda::paged_attention(ps[size_t(i) % ps.size()], ws.data(), env.stream, 0, /*pdl=*/true);
        };
        time_graph_row(env, launch, int(sets.size()), r);
        rows.push_back(r);
      }
    }
}

void run_attention(const Env& env, std::vector<Row>& rows) {
  run_decode(env, rows);
  run_prefill(env, rows);
  run_tree(env, rows);
}

}  // namespace

KILN_KERNEL_BENCH(
    "attention",
    "paged attention: decode (v1, v2, v3) and prefill (v1, v2, v3, v4) kernels, a token-tree verify step, "
    "Qwen3-4B heads, page 32",
    run_attention);

}  // namespace kiln::bench
