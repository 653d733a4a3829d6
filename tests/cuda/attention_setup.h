// Shared by the paged-attention GPU tests: a test case (lengths, heads, layout, cache dtype), its host and
// device buffers with NaN-poisoned unused cache rows and garbage page-table entries past each sequence, the
// fp64 reference, the kernel-generation switch and the decode-vs-prefill agreement check.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/cuda_check.h"
#include "ops/cuda/attention.h"
#include "ops/fp8.h"
#include "test_util_cuda.h"

namespace kiln::attn_test {

using test::to_device;
using test::to_host;

struct Case {
  std::vector<int> q_lens, kv_lens;
  int Hq = 8, Hkv = 2, D = 128, page_size = 16;
  bool hnd = false, fp8 = false;
  int table_tokens = 0;  // > 0: the page table reaches this many tokens (a wide table, short contexts)
  // > 1: the fp64 reference (and rel_err) covers only rows i of a sequence with i % ref_stride == 0 or
  // among its last 3 rows, so long prompts stay cheap to check; every row is still checked for being written.
  int ref_stride = 1;
};

// Host copies of everything, the device buffers, and the fp64 reference.
struct AttnSetup {
  Case c;
  int B = 0, T = 0, pages_stride = 0, num_pages = 0;
  std::vector<int32_t> cu_q, kv_lens, page_table;
  std::vector<bf16_t> q;
  std::vector<uint16_t> k16, v16;  // bf16 cache bits
  std::vector<uint8_t> k8, v8, ks, vs;
  std::vector<size_t> seq_base;  // first element of sequence b in kf / vf
  std::vector<float> kf, vf;     // dequantised values (exact in fp32) by (seq, pos, head, d)
  std::vector<double> ref;       // [T, Hq, D] (rows not in `checked`: 0)
  std::vector<char> checked;     // [T]: whether row t has a reference
  std::vector<int> row_seq;      // [T]: the sequence of row t
  double vmax = 0;               // max |v| over the cache values in use
  Buffer dq, dk, dv, dks, dvs, dcu, dkv, dpt;

  int64_t off(int page, int row, int head) const {
    return c.hnd ? ((int64_t(page) * c.Hkv + head) * c.page_size + row) * c.D
                 : ((int64_t(page) * c.page_size + row) * c.Hkv + head) * c.D;
  }

  explicit AttnSetup(const Case& cs, uint32_t seed) : c(cs) {
    B = int(c.q_lens.size());
    cu_q.assign(size_t(B) + 1, 0);
    for (int b = 0; b < B; ++b) cu_q[size_t(b) + 1] = cu_q[size_t(b)] + c.q_lens[size_t(b)];
    T = cu_q.back();
    kv_lens.assign(c.kv_lens.begin(), c.kv_lens.end());
    for (int b = 0; b < B; ++b)
      pages_stride = std::max(pages_stride, (kv_lens[size_t(b)] + c.page_size - 1) / c.page_size);
    pages_stride = std::max({pages_stride, 1, (c.table_tokens + c.page_size - 1) / c.page_size});
    // Pages in use are distinct, shuffled over 1 .. num_pages - 2. Pages 0 and num_pages - 1 are never
    // written (NaN), and table entries past a sequence's length are garbage: -1, 0, num_pages - 1 or
    // num_pages + 7 (the kernels clamp a bad id into 0 .. num_pages - 1). A kernel that follows one (a page
    // id it does not own) reads NaN rows, and the output is non-finite.
    int used_pages = 0;
    for (int b = 0; b < B; ++b) used_pages += (kv_lens[size_t(b)] + c.page_size - 1) / c.page_size;
    num_pages = used_pages + 2;
    std::vector<int32_t> perm(static_cast<size_t>(used_pages));
    std::iota(perm.begin(), perm.end(), 1);
    std::mt19937 rng(seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int32_t garbage[4] = {-1, 0, num_pages - 1, num_pages + 7};
    page_table.assign(size_t(B) * pages_stride, 0);
    for (int b = 0, next = 0; b < B; ++b)
      for (int i = 0; i < pages_stride; ++i)
        page_table[size_t(b) * pages_stride + i] =
            i * c.page_size < kv_lens[size_t(b)] ? perm[size_t(next++)] : garbage[(b + i) % 4];
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t cache_elems = size_t(num_pages) * c.page_size * c.Hkv * c.D;
    k16.assign(cache_elems, 0x7fc0);  // NaN where nothing was written: must never be read
    v16.assign(cache_elems, 0x7fc0);
    k8.assign(cache_elems, 0x7f);
    v8.assign(cache_elems, 0x7f);
    ks.assign(cache_elems / 64, 127);
    vs.assign(cache_elems / 64, 127);
    seq_base.assign(size_t(B) + 1, 0);
    for (int b = 0; b < B; ++b)
      seq_base[size_t(b) + 1] = seq_base[size_t(b)] + size_t(kv_lens[size_t(b)]) * c.Hkv * c.D;
    kf.assign(seq_base.back(), 0.0f);
    vf.assign(seq_base.back(), 0.0f);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < kv_lens[size_t(b)]; ++t)
        for (int h = 0; h < c.Hkv; ++h) {
          const int page = page_table[size_t(b * pages_stride + t / c.page_size)];
          const int64_t o = off(page, t % c.page_size, h);
          for (int which = 0; which < 2; ++which) {
            std::vector<float> vals(size_t(c.D));
            // Keys get a per-head offset so scores spread and the softmax is not flat.
            for (auto& x : vals) x = u(rng) * (which == 0 ? 2.0f : 1.0f);
            float* dst = (which == 0 ? kf : vf).data() + seq_base[size_t(b)] + (size_t(t) * c.Hkv + h) * c.D;
            if (!c.fp8) {
              auto& bits = which == 0 ? k16 : v16;
              for (int d = 0; d < c.D; ++d) {
                const bf16_t x = f32_to_bf16(vals[size_t(d)]);
                bits[size_t(o + d)] = x.bits;
                dst[d] = bf16_to_f32(x);
              }
            } else {
              auto& q8 = which == 0 ? k8 : v8;
              auto& sc = which == 0 ? ks : vs;
              for (int blk = 0; blk < c.D / 64; ++blk) {
                float amax = 0;
                for (int d = 0; d < 64; ++d) amax = std::max(amax, std::fabs(vals[size_t(blk * 64 + d)]));
                const int e = e4m3_block_exponent(amax);
                sc[size_t(o / 64 + blk)] = ue8m0_from_exponent(e);
                for (int d = blk * 64; d < blk * 64 + 64; ++d) {
                  q8[size_t(o + d)] = f32_to_e4m3(vals[size_t(d)] * exp2_neg(e));
                  dst[d] = e4m3_to_f32(q8[size_t(o + d)]) * ue8m0_to_f32(sc[size_t(o / 64 + blk)]);
                }
              }
            }
          }
        }
    q = test::random_bf16(size_t(T) * c.Hq * c.D, seed + 1);
    for (float x : vf) vmax = std::max(vmax, double(std::fabs(x)));
    row_seq.assign(size_t(T), 0);
    checked.assign(size_t(T), 0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.q_lens[size_t(b)]; ++i) {
        row_seq[size_t(cu_q[size_t(b)] + i)] = b;
        checked[size_t(cu_q[size_t(b)] + i)] =
            c.ref_stride <= 1 || i % c.ref_stride == 0 || i >= c.q_lens[size_t(b)] - 3;
      }
    // fp64 reference, rows spread over the host's threads.
    ref.assign(size_t(T) * c.Hq * c.D, 0.0);
    std::atomic<int> next_row{0};
    auto worker = [&] {
      for (int row = next_row++; row < T; row = next_row++)
        if (checked[size_t(row)]) reference_row(row);
    };
    std::vector<std::thread> pool;
    const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 32u);
    for (unsigned i = 0; i < n_threads; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
    dq = to_device(q);
    if (c.fp8) {
      dk = to_device(k8), dv = to_device(v8), dks = to_device(ks), dvs = to_device(vs);
    } else {
      dk = to_device(k16), dv = to_device(v16);
    }
    dcu = to_device(cu_q), dkv = to_device(kv_lens), dpt = to_device(page_table);
  }

  // The fp64 reference of query row `row` (every head).
  void reference_row(int row) {
    const int b = row_seq[size_t(row)], i = row - cu_q[size_t(b)];
    const double scale = 1.0 / std::sqrt(double(c.D));
    const int G = c.Hq / c.Hkv, ctx = kv_lens[size_t(b)] - c.q_lens[size_t(b)] + i + 1;
    std::vector<double> s(static_cast<size_t>(ctx));
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / G;
      double mx = -1e300;
      for (int t = 0; t < ctx; ++t) {
        double acc = 0;
        const float* kr = kf.data() + seq_base[size_t(b)] + (size_t(t) * c.Hkv + hk) * c.D;
        for (int d = 0; d < c.D; ++d)
          acc += double(bf16_to_f32(q[(size_t(row) * c.Hq + h) * c.D + d])) * double(kr[d]);
        s[size_t(t)] = acc * scale;
        mx = std::max(mx, s[size_t(t)]);
      }
      double l = 0;
      for (auto& x : s) l += (x = std::exp(x - mx));
      for (int d = 0; d < c.D; ++d) {
        double o = 0;
        for (int t = 0; t < ctx; ++t)
          o += s[size_t(t)] * vf[seq_base[size_t(b)] + (size_t(t) * c.Hkv + hk) * c.D + d];
        ref[(size_t(row) * c.Hq + h) * c.D + d] = o / l;
      }
    }
  }

  // staged: prefill_pages covers every sequence (an upper bound), so an fp8 cache's prefill goes through the
  // bf16 staging copy where it applies; false leaves it 0 (v4 widens fp8 rows in its producer).
  cuda::PagedAttnParams params(void* out, bool staged = true) const {
    int32_t pages = 0;
    for (int b = 0; b < B; ++b) pages += (kv_lens[size_t(b)] + c.page_size - 1) / c.page_size;
    const int64_t s_row = c.hnd ? c.D : int64_t(c.Hkv) * c.D;
    const int64_t s_head = c.hnd ? int64_t(c.page_size) * c.D : c.D;
    const int64_t s_page = int64_t(c.page_size) * c.Hkv * c.D;
    return {.q = dq.data(),
            .q_stride_t = int64_t(c.Hq) * c.D,
            .q_stride_h = c.D,
            .out = out,
            .o_stride_t = int64_t(c.Hq) * c.D,
            .o_stride_h = c.D,
            .k = dk.data(),
            .v = dv.data(),
            .s_page = s_page,
            .s_row = s_row,
            .s_head = s_head,
            .k_scale = c.fp8 ? static_cast<const uint8_t*>(dks.data()) : nullptr,
            .v_scale = c.fp8 ? static_cast<const uint8_t*>(dvs.data()) : nullptr,
            .sc_page = s_page / 64,
            .sc_row = s_row / 64,
            .sc_head = s_head / 64,
            .kv_dtype = c.fp8 ? cuda::KvDtype::f8e4m3 : cuda::KvDtype::bf16,
            .cu_q = static_cast<const int32_t*>(dcu.data()),
            .kv_lens = static_cast<const int32_t*>(dkv.data()),
            .page_table = static_cast<const int32_t*>(dpt.data()),
            .pages_stride = pages_stride,
            .page_size = c.page_size,
            .num_pages = num_pages,
            .B = B,
            .T = T,
            .Hq = c.Hq,
            .Hkv = c.Hkv,
            .D = c.D,
            .scale = float(1.0 / std::sqrt(double(c.D))),
            .prefill_pages = staged ? pages : 0};
  }

  double rel_err(const std::vector<bf16_t>& got) const {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (!checked[i / (size_t(c.Hq) * c.D)]) continue;
      const double d = double(bf16_to_f32(got[i])) - ref[i];
      num += d * d;
      den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
  }

  // For failure messages: how many outputs are non-finite or off the reference by more than
  // 2^-6 (1 + |ref|), and the first such (row, sequence, token, head, d) with got / expected.
  std::string first_mismatch(const std::vector<bf16_t>& got) const {
    size_t bad = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i) {
      const size_t row = i / (size_t(c.Hq) * c.D);
      const double x = bf16_to_f32(got[i]);
      const bool off =
          !std::isfinite(x) || (checked[row] && std::fabs(x - ref[i]) > (1 + std::fabs(ref[i])) / 64);
      if (off && bad++ == 0) first = i;
    }
    if (bad == 0) return "no element off by > 2^-6 (1 + |ref|)";
    const size_t row = first / (size_t(c.Hq) * c.D);
    const int b = row_seq[row];
    return std::to_string(bad) + " of " + std::to_string(got.size()) + " elements off; first: row " +
           std::to_string(row) + " (seq " + std::to_string(b) + ", token " +
           std::to_string(int(row) - cu_q[size_t(b)]) + " of q_len " + std::to_string(c.q_lens[size_t(b)]) +
           ", kv_len " + std::to_string(kv_lens[size_t(b)]) + "), head " +
           std::to_string(first / c.D % c.Hq) + ", d " + std::to_string(first % c.D) + ": got " +
           std::to_string(bf16_to_f32(got[first])) + " expected " +
           (checked[row] ? std::to_string(ref[first]) : std::string("(unchecked row)"));
  }
};

enum class Kernel { routed, decode, prefill };

// The kernel generations under test: v1 (decode and prefill v1), v2 (decode and prefill v2), v3 and v4
// (decode v3, prefill v3 or v4: there is no decode v4). kGens: the bitwise-equal prefill generations;
// kAllGens adds v4 (Hopper; elsewhere it runs v3), held to the fp64 bound and a stated agreement tolerance.
enum class Gen { v1, v2, v3, v4 };
constexpr Gen kGens[] = {Gen::v1, Gen::v2, Gen::v3};
constexpr Gen kAllGens[] = {Gen::v1, Gen::v2, Gen::v3, Gen::v4};
inline const char* gen_name(Gen g) {
  return g == Gen::v1 ? "v1" : g == Gen::v2 ? "v2" : g == Gen::v3 ? "v3" : "v4";
}

// Selects the decode and prefill kernels of one generation for a scope (and names it in failure messages),
// then restores the choice it found (the defaults, or KILN_ATTN_DECODE / KILN_ATTN_PREFILL's).
struct UseKernels {
  ::testing::ScopedTrace trace;
  const cuda::DecodeKernel prev_decode = cuda::decode_kernel();
  const cuda::PrefillKernel prev_prefill = cuda::prefill_kernel();
  explicit UseKernels(Gen g) : trace(__FILE__, __LINE__, std::string("kernels ") + gen_name(g)) {
    cuda::set_decode_kernel(g == Gen::v1   ? cuda::DecodeKernel::v1
                            : g == Gen::v2 ? cuda::DecodeKernel::v2
                                           : cuda::DecodeKernel::v3);
    cuda::set_prefill_kernel(g == Gen::v1   ? cuda::PrefillKernel::v1
                             : g == Gen::v2 ? cuda::PrefillKernel::v2
                             : g == Gen::v3 ? cuda::PrefillKernel::v3
                                            : cuda::PrefillKernel::v4);
  }
  ~UseKernels() {
    cuda::set_decode_kernel(prev_decode);
    cuda::set_prefill_kernel(prev_prefill);
  }
  UseKernels(const UseKernels&) = delete;
  UseKernels& operator=(const UseKernels&) = delete;
};

// pdl: launched with programmatic dependent launch on a stream of its own (each kernel may start before the
// previous one ends and must wait for it with griddepcontrol.wait before reading its inputs), as the model's
// graphs run them.
// staged: see AttnSetup::params. min_q_len: the params' host bound (0: unknown). before: launched on the
// attention's stream right before it (its predecessor), once the poisoned buffers are in place.
inline std::vector<bf16_t> run(const AttnSetup& s, Kernel k, int force_splits = 0, bool pdl = false,
                               bool staged = true, int32_t min_q_len = 0,
                               const std::function<void(cudaStream_t)>& before = {}) {
  const size_t n = size_t(s.T) * s.c.Hq * s.c.D;
  Buffer out(n * 2, Device::cuda());
  copy_bytes(out.data(), Device::cuda(), std::vector<uint16_t>(n, 0x7fc0).data(), Device::cpu(), n * 2);
  auto p = s.params(out.data(), staged);
  p.min_q_len = min_q_len;
  const size_t forced = size_t(s.B) * s.c.Hq * std::max(force_splits, 1) * (s.c.D + 2) * 4;
  // Forced splits' partials, then the fp8 staging copy (or the staging copy alone at offset 0 for
  // paged_attention_prefill); poisoned like the rest.
  const size_t ws_bytes = cuda::paged_attention_workspace_bytes(p) + forced +
                          cuda::paged_attention_prefill_workspace_bytes(p) + 512;
  Buffer ws(ws_bytes, Device::cuda());
  // NaN everywhere: a split the combine reads but no decode block wrote poisons the output.
  copy_bytes(ws.data(), Device::cuda(), std::vector<uint8_t>(ws_bytes, 0xff).data(), Device::cpu(), ws_bytes);
  cudaStream_t st = nullptr;
  if (pdl) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the poison is in place (the copies ran on another stream)
  }
  if (before) before(st);
  switch (k) {
    case Kernel::routed:
      cuda::paged_attention(p, ws.data(), st, force_splits, pdl);
      break;
    case Kernel::decode:
      cuda::paged_attention_decode(p, ws.data(), st, force_splits, pdl);
      break;
    case Kernel::prefill:
      cuda::paged_attention_prefill(p, false, ws.data(), st, pdl);
      break;
  }
  if (st) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    KILN_CUDA_CHECK(cudaStreamDestroy(st));
  }
  return to_host<bf16_t>(out, n);
}

inline int max_ulps(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, test::bf16_ulps(a[i], b[i]));
  return m;
}

// The decode-vs-prefill agreement: |a - b| <= 1 bf16 ulp of max(|a|, |b|) + extra, except where the output
// is a near-cancellation (|o| < 2^-8 with |v| <= 1 here): the two kernels sum p_j v_j in different orders,
// so their fp32 results differ by ~1e-6 absolute, which near zero is several bf16 ulps; there the bound is
// 2^-16 absolute. extra: 0 for v1-v3; for v4, which rounds p to bf16 before P V (|p - bf16(p)| <= 2^-9 p
// while l sums the unrounded p), 2^-9 max|v| (agreement_extra; docs/NUMERICS.md). Returns how many
// elements break it.
inline size_t agreement_violations(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b,
                                   double* max_abs, double extra = 0) {
  size_t bad = 0;
  *max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]), d = std::fabs(x - y);
    *max_abs = std::max(*max_abs, d);
    const double big = std::max(std::fabs(x), std::fabs(y));
    const double ulp = big > 0 ? std::ldexp(1.0, std::ilogb(big) - 7) : 0.0;
    if (d > ulp + extra && d > std::ldexp(1.0, -16)) ++bad;
  }
  return bad;
}

// The extra agreement tolerance of a kernel generation against the decode kernel (see agreement_violations).
inline double agreement_extra(Gen g, const AttnSetup& s) {
  return g == Gen::v4 ? std::ldexp(s.vmax, -9) : 0.0;
}

}  // namespace kiln::attn_test
