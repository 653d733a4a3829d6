// Paged attention on the GPU: decode and prefill kernels against an fp64 reference computed from the
// (dequantised) cache, across layouts (NHD, HND), page sizes (16, 32, 64), cache dtypes (bf16, fp8 with
// UE8M0 scales), GQA groups and variable lengths; decode vs prefill on the same rows within 1 bf16 ulp;
// NHD vs HND bitwise; the CPU oracle within 2^-8 relative Frobenius error.
#include <algorithm>
#include <numeric>

#include "ops/cpu/reference.h"
#include "ops/cuda/attention.h"
#include "ops/fp8.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

struct Case {
  std::vector<int> q_lens, kv_lens;
  int Hq = 8, Hkv = 2, D = 128, page_size = 16;
  bool hnd = false, fp8 = false;
};

// Host copies of everything, the device buffers, and the fp64 reference.
struct AttnSetup {
  Case c;
  int B = 0, T = 0, pages_stride = 0, num_pages = 0;
  std::vector<int32_t> cu_q, kv_lens, page_table;
  std::vector<bf16_t> q;
  std::vector<uint16_t> k16, v16;  // bf16 cache bits
  std::vector<uint8_t> k8, v8, ks, vs;
  std::vector<double> kf, vf;  // dequantised values by (seq, pos, head, d)
  std::vector<double> ref;     // [T, Hq, D]
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
    pages_stride = std::max(pages_stride, 1);
    num_pages = B * pages_stride + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    page_table.assign(size_t(B * pages_stride), 0);
    for (size_t i = 0; i < page_table.size(); ++i) page_table[i] = perm[i];
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t cache_elems = size_t(num_pages) * c.page_size * c.Hkv * c.D;
    k16.assign(cache_elems, 0x7fc0);  // NaN where nothing was written: must never be read
    v16.assign(cache_elems, 0x7fc0);
    k8.assign(cache_elems, 0x7f);
    v8.assign(cache_elems, 0x7f);
    ks.assign(cache_elems / 64, 127);
    vs.assign(cache_elems / 64, 127);
    int max_kv = 0;
    for (int b = 0; b < B; ++b) max_kv = std::max(max_kv, kv_lens[size_t(b)]);
    const size_t per_seq = size_t(max_kv) * c.Hkv * c.D;
    kf.assign(size_t(B) * per_seq, 0.0);
    vf.assign(size_t(B) * per_seq, 0.0);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < kv_lens[size_t(b)]; ++t)
        for (int h = 0; h < c.Hkv; ++h) {
          const int page = page_table[size_t(b * pages_stride + t / c.page_size)];
          const int64_t o = off(page, t % c.page_size, h);
          for (int which = 0; which < 2; ++which) {
            std::vector<float> vals(size_t(c.D));
            // Keys get a per-head offset so scores spread and the softmax is not flat.
            for (auto& x : vals) x = u(rng) * (which == 0 ? 2.0f : 1.0f);
            double* dst = (which == 0 ? kf : vf).data() + size_t(b) * per_seq + (size_t(t) * c.Hkv + h) * c.D;
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
                  dst[d] =
                      double(e4m3_to_f32(q8[size_t(o + d)])) * double(ue8m0_to_f32(sc[size_t(o / 64 + blk)]));
                }
              }
            }
          }
        }
    q = test::random_bf16(size_t(T) * c.Hq * c.D, seed + 1);
    // fp64 reference.
    const double scale = 1.0 / std::sqrt(double(c.D));
    ref.assign(size_t(T) * c.Hq * c.D, 0.0);
    const int G = c.Hq / c.Hkv;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.q_lens[size_t(b)]; ++i) {
        const int row = cu_q[size_t(b)] + i, ctx = kv_lens[size_t(b)] - c.q_lens[size_t(b)] + i + 1;
        for (int h = 0; h < c.Hq; ++h) {
          const int hk = h / G;
          std::vector<double> s(static_cast<size_t>(ctx));
          double mx = -1e300;
          for (int t = 0; t < ctx; ++t) {
            double acc = 0;
            const double* kr = kf.data() + size_t(b) * per_seq + (size_t(t) * c.Hkv + hk) * c.D;
            for (int d = 0; d < c.D; ++d)
              acc += double(bf16_to_f32(q[(size_t(row) * c.Hq + h) * c.D + d])) * kr[d];
            s[size_t(t)] = acc * scale;
            mx = std::max(mx, s[size_t(t)]);
          }
          double l = 0;
          for (auto& x : s) l += (x = std::exp(x - mx));
          for (int d = 0; d < c.D; ++d) {
            double o = 0;
            for (int t = 0; t < ctx; ++t)
              o += s[size_t(t)] * vf[size_t(b) * per_seq + (size_t(t) * c.Hkv + hk) * c.D + d];
            ref[(size_t(row) * c.Hq + h) * c.D + d] = o / l;
          }
        }
      }
    dq = to_device(q);
    if (c.fp8) {
      dk = to_device(k8), dv = to_device(v8), dks = to_device(ks), dvs = to_device(vs);
    } else {
      dk = to_device(k16), dv = to_device(v16);
    }
    dcu = to_device(cu_q), dkv = to_device(kv_lens), dpt = to_device(page_table);
  }

  cuda::PagedAttnParams params(void* out) const {
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
            .scale = float(1.0 / std::sqrt(double(c.D)))};
  }

  double rel_err(const std::vector<bf16_t>& got) const {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = double(bf16_to_f32(got[i])) - ref[i];
      num += d * d;
      den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
  }
};

enum class Kernel { routed, decode, prefill };

std::vector<bf16_t> run(const AttnSetup& s, Kernel k, int force_splits = 0) {
  const size_t n = size_t(s.T) * s.c.Hq * s.c.D;
  Buffer out(n * 2, Device::cuda());
  copy_bytes(out.data(), Device::cuda(), std::vector<uint16_t>(n, 0x7fc0).data(), Device::cpu(), n * 2);
  const auto p = s.params(out.data());
  const size_t forced = size_t(s.T) * s.c.Hq * std::max(force_splits, 1) * (s.c.D + 2) * 4;
  Buffer ws(std::max(cuda::paged_attention_workspace_bytes(p), forced) + 256, Device::cuda());
  switch (k) {
    case Kernel::routed:
      cuda::paged_attention(p, ws.data(), nullptr, force_splits);
      break;
    case Kernel::decode:
      cuda::paged_attention_decode(p, ws.data(), nullptr, force_splits);
      break;
    case Kernel::prefill:
      cuda::paged_attention_prefill(p, false, nullptr);
      break;
  }
  return to_host<bf16_t>(out, n);
}

int max_ulps(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, test::bf16_ulps(a[i], b[i]));
  return m;
}

// The decode-vs-prefill agreement: |a - b| <= 1 bf16 ulp of max(|a|, |b|), except where the output is a
// near-cancellation (|o| < 2^-8 with |v| <= 1 here): the two kernels sum p_j v_j in different orders, so
// their fp32 results differ by ~1e-6 absolute, which near zero is several bf16 ulps; there the bound is
// 2^-16 absolute. Returns how many elements break it.
size_t agreement_violations(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b, double* max_abs) {
  size_t bad = 0;
  *max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]), d = std::fabs(x - y);
    *max_abs = std::max(*max_abs, d);
    const double big = std::max(std::fabs(x), std::fabs(y));
    const double ulp = big > 0 ? std::ldexp(1.0, std::ilogb(big) - 7) : 0.0;
    if (d > ulp && d > std::ldexp(1.0, -16)) ++bad;
  }
  return bad;
}

TEST(CudaAttention, MixedBatchMatchesFp64AcrossLayoutsPagesDtypes) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 100;
  for (bool fp8 : {false, true})
    for (bool hnd : {false, true})
      for (int ps : {16, 32, 64})
        for (int D : {32, 64, 128}) {
          if (fp8 && D == 32) continue;  // an fp8 cache needs head_dim % 64 == 0
          Case c{.q_lens = {1, 77, 3, 1, 130},
                 .kv_lens = {1, 300, 3, 517, 130},
                 .Hq = 8,
                 .Hkv = 2,
                 .D = D,
                 .page_size = ps,
                 .hnd = hnd,
                 .fp8 = fp8};
          const AttnSetup s(c, seed++);
          const auto got = run(s, Kernel::routed);
          const double err = s.rel_err(got);
          EXPECT_LE(err, 1.0 / 128) << "fp8 " << fp8 << " hnd " << hnd << " page " << ps << " D " << D;
          for (const auto& x : got) ASSERT_TRUE(std::isfinite(bf16_to_f32(x))) << "a row was not written";
        }
}

TEST(CudaAttention, DecodeAndPrefillAgreeWithinOneUlp) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 300;
  for (bool fp8 : {false, true})
    for (int G : {1, 2, 3, 4, 5, 6, 8}) {
      Case c{.q_lens = {1, 1, 1, 1},
             .kv_lens = {1, 17, 1000, 4100},
             .Hq = 2 * G,
             .Hkv = 2,
             .D = 128,
             .page_size = 32,
             .hnd = true,
             .fp8 = fp8};
      const AttnSetup s(c, seed++);
      const auto pre = run(s, Kernel::prefill);
      EXPECT_LE(s.rel_err(pre), 1.0 / 128);
      for (int splits : {0, 1, 3, 64}) {
        const auto dec = run(s, Kernel::decode, splits);
        EXPECT_LE(s.rel_err(dec), 1.0 / 128) << "G " << G << " splits " << splits;
        double max_abs = 0;
        EXPECT_EQ(agreement_violations(dec, pre, &max_abs), 0u)
            << "G " << G << " fp8 " << fp8 << " splits " << splits << " max |diff| " << max_abs
            << " max ulps " << max_ulps(dec, pre);
      }
    }
}

TEST(CudaAttention, MultiRowSequencesInADecodeShapedLaunch) {
  KILN_REQUIRE_GPU();
  // T == B with a 3-row sequence (so others have none): the decode kernel walks every row.
  Case c{.q_lens = {3, 0, 0, 1}, .kv_lens = {40, 5, 0, 9}, .Hq = 4, .Hkv = 4, .D = 64, .page_size = 16};
  const AttnSetup s(c, 7);
  const auto routed = run(s, Kernel::routed);
  const auto pre = run(s, Kernel::prefill);
  EXPECT_LE(s.rel_err(routed), 1.0 / 128);
  double max_abs = 0;
  EXPECT_EQ(agreement_violations(routed, pre, &max_abs), 0u) << max_abs;
}

TEST(CudaAttention, NhdAndHndBitwiseEqual) {
  KILN_REQUIRE_GPU();
  Case c{.q_lens = {5, 1}, .kv_lens = {200, 333}, .Hq = 8, .Hkv = 2, .D = 128, .page_size = 16};
  const AttnSetup a(c, 9);
  c.hnd = true;
  const AttnSetup b(c, 9);
  for (Kernel k : {Kernel::routed, Kernel::prefill}) {
    const auto x = run(a, k), y = run(b, k);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i].bits, y[i].bits) << i;
  }
}

TEST(CudaAttention, MatchesCpuOracle) {
  KILN_REQUIRE_GPU();
  Case c{.q_lens = {1, 33, 2}, .kv_lens = {70, 100, 2}, .Hq = 8, .Hkv = 2, .D = 128, .page_size = 16};
  const AttnSetup s(c, 21);
  const auto got = run(s, Kernel::routed);
  std::vector<bf16_t> cpu_out(got.size());
  const int64_t shape[4] = {s.num_pages, c.page_size, c.Hkv, c.D};
  ops::PagedAttentionArgs a;
  a.q = Tensor(const_cast<bf16_t*>(s.q.data()), DType::bf16, {s.T, c.Hq, c.D});
  a.cache.k =
      Tensor(const_cast<uint16_t*>(s.k16.data()), DType::bf16, {shape[0], shape[1], shape[2], shape[3]});
  a.cache.v =
      Tensor(const_cast<uint16_t*>(s.v16.data()), DType::bf16, {shape[0], shape[1], shape[2], shape[3]});
  a.cache.layout = ops::KvLayout::nhd;
  a.cache.page_size = c.page_size;
  a.cu_q = Tensor(const_cast<int32_t*>(s.cu_q.data()), DType::i32, {s.B + 1});
  a.kv_lens = Tensor(const_cast<int32_t*>(s.kv_lens.data()), DType::i32, {s.B});
  a.page_table = Tensor(const_cast<int32_t*>(s.page_table.data()), DType::i32, {s.B, s.pages_stride});
  a.out = Tensor(cpu_out.data(), DType::bf16, {s.T, c.Hq, c.D});
  a.scale = float(1.0 / std::sqrt(128.0));
  ops::cpu::paged_attention(a);
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(bf16_to_f32(got[i])) - double(bf16_to_f32(cpu_out[i]));
    num += d * d;
    den += double(bf16_to_f32(cpu_out[i])) * double(bf16_to_f32(cpu_out[i]));
  }
  EXPECT_LE(std::sqrt(num / den), 1.0 / 256);
}

TEST(CudaAttention, BadParamsAreErrors) {
  KILN_REQUIRE_GPU();
  Case c{.q_lens = {1}, .kv_lens = {4}, .Hq = 4, .Hkv = 2, .D = 128, .page_size = 16};
  const AttnSetup s(c, 3);
  Buffer out(4 * 128 * 2, Device::cuda());
  auto p = s.params(out.data());
  p.D = 96;
  EXPECT_THROW(cuda::paged_attention(p, nullptr, nullptr), Error);
  p = s.params(out.data());
  p.Hq = 3;
  EXPECT_THROW(cuda::paged_attention(p, nullptr, nullptr), Error);
  p = s.params(out.data());
  p.out = const_cast<void*>(p.q);
  EXPECT_THROW(cuda::paged_attention(p, nullptr, nullptr), Error);
  p = s.params(out.data());
  p.Hq = 24, p.Hkv = 2;  // group of 12
  EXPECT_THROW(cuda::paged_attention_decode(p, nullptr, nullptr, 1), Error);
}

}  // namespace
}  // namespace kiln
