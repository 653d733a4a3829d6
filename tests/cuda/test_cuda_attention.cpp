// Paged attention on the GPU: decode and prefill kernels against an fp64 reference computed from the
// (dequantised) cache, across layouts (NHD, HND), page sizes (16, 32, 64), cache dtypes (bf16, fp8 with
// UE8M0 scales), GQA groups and variable lengths; decode vs prefill on the same rows within 1 bf16 ulp;
// NHD vs HND bitwise; the CPU oracle within 2^-8 relative Frobenius error. Every test that runs the decode
// kernel runs every variant (cuda::DecodeKernel v1, v2 and v3, see ops/cuda/attention.h); the workspace is
// poisoned with NaN first, so a combine that reads a split nobody wrote shows up as a non-finite output.
// Likewise the prefill kernels (cuda::PrefillKernel v1, v2, v3), which must also be bitwise equal; v4 (the
// Hopper wgmma kernel, the PrefillV4* cases below) is held to the fp64 bound and to the decode kernel
// within 1 ulp + 2^-9 max|v| (agreement_extra). Cache rows nobody wrote are NaN and page-table entries past a
// sequence's length are garbage ids (clamped onto NaN pages), so a read past a row's context also shows
// up; PDL launches must give the same bits. The shared setup is attention_setup.h.
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "attention_setup.h"
#include "ops/cpu/reference.h"

namespace kiln {
namespace {

using namespace attn_test;  // NOLINT: the test's vocabulary

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
          for (Gen gen : kAllGens) {
            const UseKernels use(gen);
            const auto got = run(s, Kernel::routed);
            const double err = s.rel_err(got);
            EXPECT_LE(err, 1.0 / 128) << "fp8 " << fp8 << " hnd " << hnd << " page " << ps << " D " << D
                                      << ": " << s.first_mismatch(got);
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
        for (Gen gen : kAllGens) {
          const UseKernels use(gen);
          const auto pre = run(s, Kernel::prefill);
          EXPECT_LE(s.rel_err(pre), 1.0 / 128) << s.first_mismatch(pre);
          for (int splits : {0, 1, 3, 64, 128}) {
            const auto dec = run(s, Kernel::decode, splits);
            EXPECT_LE(s.rel_err(dec), 1.0 / 128) << "D " << D << " G " << G << " splits " << splits;
            double max_abs = 0;
            EXPECT_EQ(agreement_violations(dec, pre, &max_abs, agreement_extra(gen, s)), 0u)
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
    for (Gen gen : kAllGens) {
      const UseKernels use(gen);
      const auto pre = run(s, Kernel::prefill);
      for (int splits : {0, 1, 2, 7}) {
        const auto routed = run(s, Kernel::routed, splits);
        EXPECT_LE(s.rel_err(routed), 1.0 / 128) << "len " << len << " splits " << splits;
        double max_abs = 0;
        EXPECT_EQ(agreement_violations(routed, pre, &max_abs, agreement_extra(gen, s)), 0u)
            << "len " << len << " splits " << splits << " " << max_abs;
        const auto routed_pdl = run(s, Kernel::routed, splits, /*pdl=*/true);
        size_t diff = 0;
        for (size_t i = 0; i < routed.size(); ++i) diff += routed[i].bits != routed_pdl[i].bits;
        EXPECT_EQ(diff, 0u) << "PDL launch differs: len " << len << " splits " << splits;
      }
    }
  }
}

TEST(CudaAttention, PrefillOnlyStepWithoutTheDecodeLaunch) {
  KILN_REQUIRE_GPU();
  // No one-row sequence: with the host bound min_q_len = 2 the decode kernel is not launched, and every row
  // (the output poisoned with NaN first) still comes out, the same bits as with the bound unknown.
  for (bool fp8 : {false, true}) {
    Case c{.q_lens = {2, 77, 5, 130}, .kv_lens = {9, 300, 5, 130}, .Hq = 8, .Hkv = 2, .D = 128, .fp8 = fp8};
    const AttnSetup s(c, 31);
    for (Gen gen : kAllGens) {
      const UseKernels use(gen);
      const auto plain = run(s, Kernel::routed);
      const auto hinted = run(s, Kernel::routed, 0, /*pdl=*/false, /*staged=*/true, /*min_q_len=*/2);
      EXPECT_LE(s.rel_err(hinted), 1.0 / 128) << "fp8 " << fp8 << ": " << s.first_mismatch(hinted);
      size_t diff = 0;
      for (size_t i = 0; i < plain.size(); ++i) diff += plain[i].bits != hinted[i].bits;
      EXPECT_EQ(diff, 0u) << "fp8 " << fp8;
    }
  }
}

TEST(CudaAttention, NhdAndHndBitwiseEqual) {
  KILN_REQUIRE_GPU();
  Case c{.q_lens = {5, 1}, .kv_lens = {200, 333}, .Hq = 8, .Hkv = 2, .D = 128, .page_size = 16};
  const AttnSetup a(c, 9);
  c.hnd = true;
  const AttnSetup b(c, 9);
  for (Gen gen : kAllGens) {
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
  for (Gen gen : kAllGens) {
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
  for (Gen gen : kAllGens) {
    const UseKernels use(gen);
    const auto pre = run(s, Kernel::prefill);
    EXPECT_LE(s.rel_err(pre), 1.0 / 128) << s.first_mismatch(pre);
    for (int splits : splits_list) {
      const auto got = run(s, Kernel::routed, splits);
      size_t bad = 0;
      for (const auto& x : got) bad += !std::isfinite(bf16_to_f32(x));
      EXPECT_EQ(bad, 0u) << "splits " << splits << ": non-finite outputs";
      EXPECT_LE(s.rel_err(got), 1.0 / 128) << "splits " << splits;
      double max_abs = 0;
      EXPECT_EQ(agreement_violations(got, pre, &max_abs, agreement_extra(gen, s)), 0u)
          << "splits " << splits << " vs prefill, max |diff| " << max_abs;
      if (splits == 0) by_kernel.push_back(got);
    }
  }
  for (size_t g = 1; g < by_kernel.size(); ++g) {
    double max_abs = 0;
    EXPECT_EQ(agreement_violations(by_kernel[0], by_kernel[g], &max_abs, agreement_extra(Gen(g), s)), 0u)
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

// KILN_ATTN_TEST_DEBUG set: the v4 tests print what ran (TMA or gathered tiles, or v3 where v4 does not
// apply), the error, the first mismatching element and a few values, and the grid tests stop after their
// first case, so one GPU run says what is wrong.
bool attn_debug() {
  return std::getenv("KILN_ATTN_TEST_DEBUG") != nullptr;
}

std::string v4_path(const AttnSetup& s) {
  const auto p = s.params(nullptr);
  return !cuda::prefill_sm90_applies(p)           ? "v4 does not apply here (ran v3)"
         : cuda::prefill_sm90_uses_tma(p)         ? "v4 (TMA tiles)"
         : cuda::prefill_fp8_staging_bytes(p) > 0 ? "v4 (fp8 staged as bf16, TMA tiles)"
                                                  : "v4 (gathered tiles)";
}

size_t non_finite(const std::vector<bf16_t>& got) {
  size_t n = 0;
  for (const auto& x : got) n += !std::isfinite(bf16_to_f32(x));
  return n;
}

size_t bit_diffs(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i].bits != b[i].bits;
  return n;
}

// An fp8 cache: prefill v4 through the bf16 staging copy and without it give the same bits, alone and routed
// beside the decode kernel (the copy then follows the decode partials in the workspace), eager and with PDL.
void expect_fp8_staging_bitwise(const AttnSetup& s, const std::string& what) {
  if (!s.c.fp8) return;
  SCOPED_TRACE(what + ": fp8 staged vs unstaged");
  const UseKernels use(Gen::v4);
  for (Kernel k : {Kernel::prefill, Kernel::routed}) {
    const auto staged = run(s, k), unstaged = run(s, k, 0, false, /*staged=*/false);
    EXPECT_EQ(non_finite(staged), 0u) << s.first_mismatch(staged);
    EXPECT_EQ(bit_diffs(staged, unstaged), 0u) << (k == Kernel::prefill ? "prefill" : "routed");
    EXPECT_EQ(bit_diffs(staged, run(s, k, 0, /*pdl=*/true)), 0u) << "PDL, staged";
  }
}

// Prefill v4 against fp64 and against v3 (within v4's agreement tolerance), every output written, a PDL
// launch bitwise equal. Returns v4's relative error.
double check_v4(const AttnSetup& s, const std::string& what) {
  SCOPED_TRACE(what + ", " + v4_path(s));
  std::vector<bf16_t> v3, v4;
  {
    const UseKernels use(Gen::v3);
    v3 = run(s, Kernel::prefill);
  }
  const UseKernels use(Gen::v4);
  v4 = run(s, Kernel::prefill);
  const double err = s.rel_err(v4);
  EXPECT_LE(s.rel_err(v3), 1.0 / 128) << "v3: " << s.first_mismatch(v3);
  EXPECT_LE(err, 1.0 / 128) << s.first_mismatch(v4);
  EXPECT_EQ(non_finite(v4), 0u) << "rows not written or NaN read: " << s.first_mismatch(v4);
  double max_abs = 0;
  EXPECT_EQ(agreement_violations(v3, v4, &max_abs, agreement_extra(Gen::v4, s)), 0u)
      << "v3 vs v4, max |diff| " << max_abs << "; " << s.first_mismatch(v4);
  const auto pdl = run(s, Kernel::prefill, 0, /*pdl=*/true);
  size_t diff = 0;
  for (size_t i = 0; i < v4.size(); ++i) diff += v4[i].bits != pdl[i].bits;
  EXPECT_EQ(diff, 0u) << "PDL launch differs";
  expect_fp8_staging_bitwise(s, what);
  if (attn_debug()) {
    std::printf("[v4 debug] %s, %s: rel err v4 %.3g (v3 %.3g), max |v3 - v4| %.3g; %s\n", what.c_str(),
                v4_path(s).c_str(), err, s.rel_err(v3), max_abs, s.first_mismatch(v4).c_str());
    const size_t row = size_t(s.T - 1) * s.c.Hq * s.c.D;  // last row, head 0
    for (size_t i : {size_t(0), size_t(1), size_t(2), size_t(3), row, row + 1, row + 2, row + 3})
      std::printf("[v4 debug]   out[%zu] (row %zu, d %zu): v4 %.6f v3 %.6f ref %.6f\n", i,
                  i / (s.c.Hq * s.c.D), i % s.c.D, double(bf16_to_f32(v4[i])), double(bf16_to_f32(v3[i])),
                  s.ref[i]);
  }
  return err;
}

TEST(CudaAttention, PrefillV4Smoke) {
  KILN_REQUIRE_GPU();
  // 70 new tokens over a 230-token prefix, G 4, D 128, page 32: 280 packed rows (3 row tiles, the last
  // partial), 3 key tiles (two whole ones by TMA for bf16, the last one gathered and masked).
  uint32_t seed = 900;
  for (bool fp8 : {false, true})
    for (bool hnd : {true, false}) {
      Case c{.q_lens = {70},
             .kv_lens = {300},
             .Hq = 8,
             .Hkv = 2,
             .D = 128,
             .page_size = 32,
             .hnd = hnd,
             .fp8 = fp8};
      const AttnSetup s(c, seed++);
      check_v4(s, std::string(fp8 ? "fp8" : "bf16") + (hnd ? " HND" : " NHD"));
    }
}

// A small fp8 grid for compute-sanitizer (`bench/device.sh sanitize` runs memcheck, racecheck and
// synccheck on it): decode v3's 128-key fp8 tiles (scales by cp.async on the stage barrier) and prefill v4,
// staged and unstaged, over pages of 16, 32 and 64 rows (TMA) and 24 (cp.async; no staging), both layouts,
// head_dim 64 and 128, against fp64.
TEST(CudaAttention, Fp8SmallGridForSanitizers) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 1300;
  for (int ps : {16, 24, 32, 64})
    for (bool hnd : {false, true})
      for (int D : {64, 128}) {
        Case c{.q_lens = {1, 7, 1, 33},
               .kv_lens = {1, 40, 200, 300},
               .Hq = 8,
               .Hkv = 2,
               .D = D,
               .page_size = ps,
               .hnd = hnd,
               .fp8 = true};
        const AttnSetup s(c, seed++);
        const std::string what =
            "page " + std::to_string(ps) + (hnd ? " HND" : " NHD") + " D " + std::to_string(D);
        const UseKernels use(Gen::v4);
        const auto got = run(s, Kernel::routed);
        EXPECT_LE(s.rel_err(got), 1.0 / 128) << what << ": " << s.first_mismatch(got);
        EXPECT_EQ(non_finite(got), 0u) << what << ": " << s.first_mismatch(got);
        expect_fp8_staging_bitwise(s, what);
      }
}

TEST(CudaAttention, PrefillV4OddLengthsBatch19) {
  KILN_REQUIRE_GPU();
  // 19 sequences of 1, 7, 33, 1000 and 4097 new tokens (cycled) over cached prefixes of 0, 17 and 300
  // tokens, G 4, both layouts, both cache dtypes, D 128 and 64, pages 16 / 32 / 64 in turn; the fp64
  // reference covers every 8th row of a sequence and its last 3.
  const int lens[] = {1, 7, 33, 1000, 4097}, prefixes[] = {0, 17, 300}, pages[] = {16, 32, 64};
  uint32_t seed = 1000;
  int k = 0;
  for (int D : {128, 64})
    for (bool fp8 : {false, true})
      for (bool hnd : {true, false}) {
        Case c{
            .Hq = 8, .Hkv = 2, .D = D, .page_size = pages[k++ % 3], .hnd = hnd, .fp8 = fp8, .ref_stride = 8};
        for (int b = 0; b < 19; ++b) {
          c.q_lens.push_back(lens[b % 5]);
          c.kv_lens.push_back(lens[b % 5] + prefixes[b % 3]);
        }
        const AttnSetup s(c, seed++);
        check_v4(s, "D " + std::to_string(D) + (fp8 ? " fp8" : " bf16") + (hnd ? " HND" : " NHD") + " page " +
                        std::to_string(c.page_size));
        if (attn_debug()) return;
      }
}

TEST(CudaAttention, PrefillV4GroupSizes) {
  KILN_REQUIRE_GPU();
  // Every group size (packed rows start mid-token when G does not divide 128), a 300-row prompt over a
  // 50-token prefix beside short and one-row sequences, D 128 and 64.
  uint32_t seed = 1100;
  for (int G : {1, 2, 3, 4, 5, 6, 8})
    for (int D : {128, 64}) {
      Case c{.q_lens = {300, 1, 5, 129},
             .kv_lens = {350, 9, 5, 129},
             .Hq = 2 * G,
             .Hkv = 2,
             .D = D,
             .page_size = 16 << (G % 3),
             .hnd = G % 2 == 0};
      const AttnSetup s(c, seed++);
      check_v4(s, "G " + std::to_string(G) + " D " + std::to_string(D));
      if (attn_debug()) return;
    }
}

TEST(CudaAttention, PrefillV4ManyTilesPartialLast) {
  KILN_REQUIRE_GPU();
  // Short query tiles over long contexts whose last key tile reaches past kv_len: with a bf16 cache every
  // tile but the last comes by TMA (producer thread 0 alone) and the last is gathered by all 128 producer
  // threads, after the stage has been reused k = (n_tiles - 1) / stages >= 2 times (D 128: 2 stages, from
  // kv_len 513; D 64: 4 stages, from kv_len 1025). Those threads used to run ahead over the TMA tiles and
  // pass their own (aliased) parity wait on the stage's empty barrier early. Several launches, since the
  // fault was a race.
  uint32_t seed = 1200;
  for (int D : {128, 64})
    for (bool hnd : {true, false}) {
      Case c{.q_lens = {1, 1, 1, 3, 130},
             .kv_lens = {672, 1000, 1100, 2100, 4100},
             .Hq = 8,
             .Hkv = 2,
             .D = D,
             .page_size = hnd ? 32 : 16,
             .hnd = hnd};
      const AttnSetup s(c, seed++);
      for (int rep = 0; rep < 3; ++rep)
        check_v4(s, "D " + std::to_string(D) + (hnd ? " HND" : " NHD") + " launch " + std::to_string(rep));
      if (attn_debug()) return;
    }
}

TEST(CudaAttention, PrefillV4PersistentBlocksTakeManyItems) {
  KILN_REQUIRE_GPU();
  // v4's grid is one persistent block an SM: with 4 KV heads and a 2000-token prompt (G 3, 4, 5: 188 to 316
  // work items beside those of the short sequences) each block walks several items, so Q double-buffering
  // (by TMA at G 4; gathered at G 3 and 5, whose packed rows start mid-token), the stage phases running on
  // across items and the zigzag schedule are all exercised, with bf16 (TMA tiles) and fp8 (gathered tiles).
  uint32_t seed = 1400;
  for (int G : {3, 4, 5})
    for (bool fp8 : {false, true}) {
      Case c{.q_lens = {2000, 1, 37, 260},
             .kv_lens = {2100, 50, 37, 900},
             .Hq = 4 * G,
             .Hkv = 4,
             .D = G == 4 ? 64 : 128,
             .page_size = G == 5 ? 16 : 32,
             .hnd = G != 3,
             .fp8 = fp8,
             .ref_stride = 8};
      const AttnSetup s(c, seed++);
      check_v4(s, "G " + std::to_string(G) + (fp8 ? " fp8" : " bf16"));
      if (attn_debug()) return;
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
