// Paged attention on the GPU: decode and prefill kernels against an fp64 reference computed from the
// (dequantised) cache, across layouts (NHD, HND), page sizes (16, 32, 64), cache dtypes (bf16, fp8 with
// UE8M0 scales), GQA groups and variable lengths; decode vs prefill on the same rows within 1 bf16 ulp;
// NHD vs HND bitwise; the CPU oracle within 2^-8 relative Frobenius error. Every test that runs the decode
// kernel runs every variant (cuda::DecodeKernel v1, v2 and v3, see ops/cuda/attention.h); the workspace is
// poisoned with NaN first, so a combine that reads a split nobody wrote shows up as a non-finite output.
// Likewise the prefill kernels (cuda::PrefillKernel v1, v2, v3), which must also be bitwise equal. Cache rows
// nobody wrote are NaN and page-table entries past a sequence's length are garbage ids (clamped onto
// NaN pages), so a read past a row's context also shows up; PDL launches must give the same bits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <string>

#include "kiln/cuda_check.h"
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
  int table_tokens = 0;  // > 0: the page table reaches this many tokens (a wide table, short contexts)
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
  std::vector<double> ref;       // [T, Hq, D]
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

// The kernel generations under test: v1, v2 and v3 (decode and prefill of that version each).
enum class Gen { v1, v2, v3 };
constexpr Gen kGens[] = {Gen::v1, Gen::v2, Gen::v3};
const char* gen_name(Gen g) {
  return g == Gen::v1 ? "v1" : g == Gen::v2 ? "v2" : "v3";
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
                                            : cuda::PrefillKernel::v3);
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
std::vector<bf16_t> run(const AttnSetup& s, Kernel k, int force_splits = 0, bool pdl = false) {
  const size_t n = size_t(s.T) * s.c.Hq * s.c.D;
  Buffer out(n * 2, Device::cuda());
  copy_bytes(out.data(), Device::cuda(), std::vector<uint16_t>(n, 0x7fc0).data(), Device::cpu(), n * 2);
  const auto p = s.params(out.data());
  const size_t forced = size_t(s.B) * s.c.Hq * std::max(force_splits, 1) * (s.c.D + 2) * 4;
  const size_t ws_bytes = std::max(cuda::paged_attention_workspace_bytes(p), forced) + 256;
  Buffer ws(ws_bytes, Device::cuda());
  // NaN everywhere: a split the combine reads but no decode block wrote poisons the output.
  copy_bytes(ws.data(), Device::cuda(), std::vector<uint8_t>(ws_bytes, 0xff).data(), Device::cpu(), ws_bytes);
  cudaStream_t st = nullptr;
  if (pdl) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the poison is in place (the copies ran on another stream)
  }
  switch (k) {
    case Kernel::routed:
      cuda::paged_attention(p, ws.data(), st, force_splits, pdl);
      break;
    case Kernel::decode:
      cuda::paged_attention_decode(p, ws.data(), st, force_splits, pdl);
      break;
    case Kernel::prefill:
      cuda::paged_attention_prefill(p, false, st, pdl);
      break;
  }
  if (st) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    KILN_CUDA_CHECK(cudaStreamDestroy(st));
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
          for (Gen gen : kGens) {
            const UseKernels use(gen);
            const auto got = run(s, Kernel::routed);
            const double err = s.rel_err(got);
            EXPECT_LE(err, 1.0 / 128) << "fp8 " << fp8 << " hnd " << hnd << " page " << ps << " D " << D;
            for (const auto& x : got) ASSERT_TRUE(std::isfinite(bf16_to_f32(x))) << "a row was not written";
            // decode -> combine -> prefill chained with PDL: the same bits.
            const auto got_pdl = run(s, Kernel::routed, 0, /*pdl=*/true);
            size_t diff = 0;
            for (size_t i = 0; i < got.size(); ++i) diff += got[i].bits != got_pdl[i].bits;
            EXPECT_EQ(diff, 0u) << "PDL launch differs: fp8 " << fp8 << " hnd " << hnd << " page " << ps
                                << " D " << D;
          }
        }
}

TEST(CudaAttention, DecodeAndPrefillAgreeWithinOneUlp) {
  KILN_REQUIRE_GPU();
  // Every group size at D 128; at D 64 and 32 (other lanes per key, keys per warp and tile geometry) the
  // tile-softmax path (G <= 4) and the per-key path (G > 4) at their extremes.
  uint32_t seed = 300;
  for (int D : {128, 64, 32})
    for (bool fp8 : {false, true})
      for (int G : {1, 2, 3, 4, 5, 6, 8}) {
        if ((fp8 && D == 32) || (D != 128 && G != 1 && G != 4 && G != 5 && G != 8)) continue;
        Case c{.q_lens = {1, 1, 1, 1},
               .kv_lens = {1, 17, 1000, 4100},
               .Hq = 2 * G,
               .Hkv = 2,
               .D = D,
               .page_size = 32,
               .hnd = true,
               .fp8 = fp8};
        const AttnSetup s(c, seed++);
        for (Gen gen : kGens) {
          const UseKernels use(gen);
          const auto pre = run(s, Kernel::prefill);
          EXPECT_LE(s.rel_err(pre), 1.0 / 128);
          for (int splits : {0, 1, 3, 64, 128}) {
            const auto dec = run(s, Kernel::decode, splits);
            EXPECT_LE(s.rel_err(dec), 1.0 / 128) << "D " << D << " G " << G << " splits " << splits;
            double max_abs = 0;
            EXPECT_EQ(agreement_violations(dec, pre, &max_abs), 0u)
                << "D " << D << " G " << G << " fp8 " << fp8 << " splits " << splits << " max |diff| "
                << max_abs << " max ulps " << max_ulps(dec, pre);
          }
        }
      }
}

TEST(CudaAttention, MultiRowSequencesInADecodeShapedLaunch) {
  KILN_REQUIRE_GPU();
  // T == B with a 3-row sequence (so others have none): the decode kernel walks every row. The second
  // case's rows (contexts 398..400) span several v2 chunks, so the combine merges splits row by row.
  for (int len : {40, 400}) {
    Case c{.q_lens = {3, 0, 0, 1}, .kv_lens = {len, 5, 0, 9}, .Hq = 4, .Hkv = 4, .D = 64, .page_size = 16};
    const AttnSetup s(c, 7);
    for (Gen gen : kGens) {
      const UseKernels use(gen);
      const auto pre = run(s, Kernel::prefill);
      for (int splits : {0, 1, 2, 7}) {
        const auto routed = run(s, Kernel::routed, splits);
        EXPECT_LE(s.rel_err(routed), 1.0 / 128) << "len " << len << " splits " << splits;
        double max_abs = 0;
        EXPECT_EQ(agreement_violations(routed, pre, &max_abs), 0u)
            << "len " << len << " splits " << splits << " " << max_abs;
        const auto routed_pdl = run(s, Kernel::routed, splits, /*pdl=*/true);
        size_t diff = 0;
        for (size_t i = 0; i < routed.size(); ++i) diff += routed[i].bits != routed_pdl[i].bits;
        EXPECT_EQ(diff, 0u) << "PDL launch differs: len " << len << " splits " << splits;
      }
    }
  }
}

TEST(CudaAttention, NhdAndHndBitwiseEqual) {
  KILN_REQUIRE_GPU();
  Case c{.q_lens = {5, 1}, .kv_lens = {200, 333}, .Hq = 8, .Hkv = 2, .D = 128, .page_size = 16};
  const AttnSetup a(c, 9);
  c.hnd = true;
  const AttnSetup b(c, 9);
  for (Gen gen : kGens) {
    const UseKernels use(gen);
    for (Kernel k : {Kernel::routed, Kernel::prefill}) {
      const auto x = run(a, k), y = run(b, k);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i].bits, y[i].bits) << i;
    }
  }
}

TEST(CudaAttention, MatchesCpuOracle) {
  KILN_REQUIRE_GPU();
  Case c{.q_lens = {1, 33, 2}, .kv_lens = {70, 100, 2}, .Hq = 8, .Hkv = 2, .D = 128, .page_size = 16};
  const AttnSetup s(c, 21);
  std::vector<bf16_t> cpu_out(size_t(s.T) * c.Hq * c.D);
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
  for (Gen gen : kGens) {
    const UseKernels use(gen);
    const auto got = run(s, Kernel::routed);
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = double(bf16_to_f32(got[i])) - double(bf16_to_f32(cpu_out[i]));
      num += d * d;
      den += double(bf16_to_f32(cpu_out[i])) * double(bf16_to_f32(cpu_out[i]));
    }
    EXPECT_LE(std::sqrt(num / den), 1.0 / 256);
  }
}

// The prefill outputs of every generation, bitwise compared with v1's; also v3 within 2^-7 of fp64.
void expect_prefill_gens_bitwise_equal(const AttnSetup& s, const std::string& what) {
  std::vector<bf16_t> out[3];
  for (Gen gen : kGens) {
    const UseKernels use(gen);
    out[int(gen)] = run(s, Kernel::prefill);
  }
  EXPECT_LE(s.rel_err(out[2]), 1.0 / 128) << what;
  for (int g = 1; g < 3; ++g) {
    size_t diff = 0;
    for (size_t i = 0; i < out[0].size(); ++i) diff += out[0][i].bits != out[g][i].bits;
    EXPECT_EQ(diff, 0u) << "v1 vs " << gen_name(Gen(g)) << ": " << what;
  }
}

TEST(CudaAttention, PrefillV1V2V3BitwiseEqual) {
  KILN_REQUIRE_GPU();
  // The same math in the same order: v2 only changes how K/V tiles reach shared memory (fp8 runs v1), v3
  // which warps of a block share them (two query heads per block, fp8 included; G 1 and D 32 run v2).
  uint32_t seed = 700;
  for (bool fp8 : {false, true})
    for (bool hnd : {false, true})
      for (int ps : {16, 32, 64})
        for (int D : {32, 64, 128}) {
          if (fp8 && D == 32) continue;
          Case c{.q_lens = {1, 77, 3, 200, 130, 64},
                 .kv_lens = {1, 300, 3, 517, 130, 65},
                 .Hq = 8,
                 .Hkv = 2,
                 .D = D,
                 .page_size = ps,
                 .hnd = hnd,
                 .fp8 = fp8};
          const AttnSetup s(c, seed++);
          expect_prefill_gens_bitwise_equal(s, "fp8 " + std::to_string(fp8) + " hnd " + std::to_string(hnd) +
                                                   " page " + std::to_string(ps) + " D " + std::to_string(D));
        }
  // Every group size v3 meets (G it divides into pairs and G it does not: the last block of a group then
  // has an idle head slot), both layouts, D 64 and 128, a 1030-row prompt over a 200-token cached prefix
  // (17 query tiles, the last partial) next to short sequences and one-row ones.
  for (int G : {1, 2, 3, 4, 5, 8})
    for (bool hnd : {false, true})
      for (int D : {64, 128}) {
        Case c{.q_lens = {1030, 1, 5, 64, 70},
               .kv_lens = {1230, 9, 5, 100, 70},
               .Hq = 2 * G,
               .Hkv = 2,
               .D = D,
               .page_size = G % 3 == 0   ? 16
                            : G % 3 == 1 ? 32
                                         : 64,
               .hnd = hnd};
        const AttnSetup s(c, seed++);
        expect_prefill_gens_bitwise_equal(
            s, "G " + std::to_string(G) + " hnd " + std::to_string(hnd) + " D " + std::to_string(D));
      }
}

// Checks one setup with every kernel generation: routed launches (the given decode split counts) within
// 2^-7 of fp64, every output finite, within 1 bf16 ulp of the prefill kernel and v1 within 1 ulp of the
// others.
void check_decode_variants(const AttnSetup& s, std::initializer_list<int> splits_list,
                           const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<std::vector<bf16_t>> by_kernel;
  for (Gen gen : kGens) {
    const UseKernels use(gen);
    const auto pre = run(s, Kernel::prefill);
    EXPECT_LE(s.rel_err(pre), 1.0 / 128);
    for (int splits : splits_list) {
      const auto got = run(s, Kernel::routed, splits);
      size_t bad = 0;
      for (const auto& x : got) bad += !std::isfinite(bf16_to_f32(x));
      EXPECT_EQ(bad, 0u) << "splits " << splits << ": non-finite outputs";
      EXPECT_LE(s.rel_err(got), 1.0 / 128) << "splits " << splits;
      double max_abs = 0;
      EXPECT_EQ(agreement_violations(got, pre, &max_abs), 0u)
          << "splits " << splits << " vs prefill, max |diff| " << max_abs;
      if (splits == 0) by_kernel.push_back(got);
    }
  }
  for (size_t g = 1; g < by_kernel.size(); ++g) {
    double max_abs = 0;
    EXPECT_EQ(agreement_violations(by_kernel[0], by_kernel[g], &max_abs), 0u)
        << "v1 vs " << gen_name(Gen(g)) << " " << max_abs;
  }
}

TEST(CudaAttention, LongContextInAWideTable) {
  KILN_REQUIRE_GPU();
  // A table reaching 65536 tokens (4096 pages of 16) so the shape-only split count is 128, while the real
  // contexts are 1, 33, 1024 and 8193..12000 tokens: v2 must size its chunks from kv_lens.
  uint32_t seed = 500;
  for (bool fp8 : {false, true})
    for (bool hnd : {false, true}) {
      Case c{.q_lens = {1, 1, 1, 1, 1},
             .kv_lens = {8193, 1, 1024, 33, 12000},
             .Hq = 8,
             .Hkv = 2,
             .D = 128,
             .page_size = 16,
             .hnd = hnd,
             .fp8 = fp8,
             .table_tokens = 65536};
      const AttnSetup s(c, seed++);
      check_decode_variants(s, {0, 1, 7, 128},
                            std::string("fp8 ") + (fp8 ? "1" : "0") + (hnd ? " HND" : " NHD"));
    }
}

TEST(CudaAttention, LargeBatchMixedLengths) {
  KILN_REQUIRE_GPU();
  // B = 128 one-token rows with lengths 1, short (2..40), medium (200..700) and long (2000..4100), the
  // Qwen3-4B group (G 4) at D 128, page 32, HND; then the same lengths at G 1 with Hkv 32, where
  // B * Hkv = 4096 blocks make the shape-only split count 1 (no workspace at all).
  std::mt19937 rng(77);
  Case c{.Hq = 8, .Hkv = 2, .D = 128, .page_size = 32, .hnd = true};
  for (int b = 0; b < 128; ++b) {
    c.q_lens.push_back(1);
    const int kind = b % 4;
    c.kv_lens.push_back(kind == 0   ? 1
                        : kind == 1 ? 2 + int(rng() % 39)
                        : kind == 2 ? 200 + int(rng() % 501)
                                    : 2000 + int(rng() % 2101));
  }
  for (bool fp8 : {false, true}) {
    c.fp8 = fp8;
    const AttnSetup s(c, fp8 ? 601 : 600);
    check_decode_variants(s, {0, 1, 5}, fp8 ? "G 4 fp8" : "G 4 bf16");
  }
  Case w = c;
  w.fp8 = false;
  w.Hq = w.Hkv = 32;
  w.D = 64;
  for (auto& len : w.kv_lens) len = std::min(len, 300);
  const AttnSetup s(w, 602);
  Buffer out(size_t(s.T) * w.Hq * w.D * 2, Device::cuda());
  EXPECT_EQ(cuda::paged_attention_workspace_bytes(s.params(out.data())), 0u) << "expected one split";
  check_decode_variants(s, {0}, "G 1, Hkv 32: one split");
}

TEST(CudaAttention, PageSizesOffTheTmaPath) {
  KILN_REQUIRE_GPU();
  // Decode v3 copies pages of 16, 32 and 64 rows with TMA and any other page size with cp.async: pages of 8
  // and 24 rows (a 64-key tile then spans pages that straddle it), both layouts and cache dtypes.
  uint32_t seed = 900;
  for (int ps : {8, 24})
    for (bool fp8 : {false, true})
      for (bool hnd : {false, true}) {
        Case c{.q_lens = {1, 1, 1, 1},
               .kv_lens = {1, 70, 1000, 3001},
               .Hq = 8,
               .Hkv = 2,
               .D = 128,
               .page_size = ps,
               .hnd = hnd,
               .fp8 = fp8};
        const AttnSetup s(c, seed++);
        check_decode_variants(
            s, {0, 1, 5}, "page " + std::to_string(ps) + (fp8 ? " fp8" : " bf16") + (hnd ? " HND" : " NHD"));
      }
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
