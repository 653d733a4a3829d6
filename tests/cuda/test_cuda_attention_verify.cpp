// Verify rows (speculative decoding) through the decode kernel: with decode_rows_per_seq = R every row i of
// a sequence with q_len rows runs as a one-row decode of context kv_len - q_len + 1 + i. Checked here: each
// such row's output is bitwise the plain decode step's (B one-row sequences, the same page table) at that
// length, for every decode kernel (v1, v2, v3), bf16 and fp8 caches, ragged q_len (rows past a sequence's
// q_len untouched), short contexts and a wide table (the split count comes from B and the table, not from
// R); every row is within the fp64 bound; the split count equals the plain step's. Outputs and workspace
// start as NaN, so a row nobody wrote or a split the combine reads but nobody wrote shows up.
#include <cstdio>
#include <initializer_list>

#include "attention_setup.h"

namespace kiln {
namespace {

using namespace attn_test;  // NOLINT: the test's vocabulary

// Runs p through the routed launcher into a NaN-poisoned output of T rows with a NaN-poisoned workspace.
std::vector<bf16_t> run_params(cuda::PagedAttnParams p, int T, int Hq, int D) {
  const size_t n = size_t(T) * Hq * D;
  Buffer out(n * 2, Device::cuda());
  copy_bytes(out.data(), Device::cuda(), std::vector<uint16_t>(n, 0x7fc0).data(), Device::cpu(), n * 2);
  p.out = out.data();
  const size_t ws_bytes = cuda::paged_attention_workspace_bytes(p) + 256;
  Buffer ws(ws_bytes, Device::cuda());
  copy_bytes(ws.data(), Device::cuda(), std::vector<uint8_t>(ws_bytes, 0xff).data(), Device::cpu(), ws_bytes);
  cuda::paged_attention(p, ws.data(), nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<bf16_t>(out, n);
}

// The plain decode step of row index i: sequence b's one row is its verify row i (q copied) at context
// kv_len - q_len + 1 + i; a sequence with q_len <= i decodes its last row instead (not compared).
std::vector<bf16_t> plain_decode(const AttnSetup& s, int i, int* splits) {
  const int B = s.B, Hq = s.c.Hq, D = s.c.D;
  std::vector<bf16_t> q(size_t(B) * Hq * D);
  std::vector<int32_t> cu(size_t(B) + 1, 0), kv(size_t(B), 0);
  for (int b = 0; b < B; ++b) {
    const int q_len = s.c.q_lens[size_t(b)], r = std::min(i, q_len - 1);
    cu[size_t(b) + 1] = b + 1;
    kv[size_t(b)] = s.kv_lens[size_t(b)] - q_len + 1 + r;
    std::copy_n(s.q.begin() + (ptrdiff_t(s.cu_q[size_t(b)]) + r) * Hq * D, Hq * D,
                q.begin() + ptrdiff_t(b) * Hq * D);
  }
  const Buffer dq = to_device(q), dcu = to_device(cu), dkv = to_device(kv);
  cuda::PagedAttnParams p = s.params(nullptr);
  p.q = dq.data();
  p.cu_q = static_cast<const int32_t*>(dcu.data());
  p.kv_lens = static_cast<const int32_t*>(dkv.data());
  p.T = B;
  p.prefill_pages = 0;
  *splits = cuda::paged_attention_decode_splits(p);
  return run_params(p, B, Hq, D);
}

void check_verify_rows(const Case& c, int R, uint32_t seed) {
  // Every R through the decode kernel (by default only up to kVerifyDecodeMaxRowsDefault).
  struct AllRows {
    const int before = cuda::verify_decode_max_rows();
    AllRows() { cuda::set_verify_decode_max_rows(cuda::kMaxDecodeRowsPerSeq); }
    ~AllRows() { cuda::set_verify_decode_max_rows(before); }
  } all_rows;
  const AttnSetup s(c, seed);
  cuda::PagedAttnParams p = s.params(nullptr);
  p.decode_rows_per_seq = R;
  p.max_q_len = *std::max_element(c.q_lens.begin(), c.q_lens.end());
  const int verify_splits = cuda::paged_attention_decode_splits(p);
  const auto got = run_params(p, s.T, c.Hq, c.D);
  const size_t row_elems = size_t(c.Hq) * c.D;
  for (size_t e = 0; e < got.size(); ++e)
    ASSERT_TRUE(std::isfinite(bf16_to_f32(got[e]))) << "verify row " << e / row_elems << " not written";
  EXPECT_LE(s.rel_err(got), 1.0 / 128) << s.first_mismatch(got);
  for (int i = 0; i < R; ++i) {
    int plain_splits = 0;
    const auto plain = plain_decode(s, i, &plain_splits);
    EXPECT_EQ(verify_splits, plain_splits) << "row " << i;
    for (int b = 0; b < s.B; ++b) {
      if (i >= c.q_lens[size_t(b)]) continue;
      const size_t vrow = size_t(s.cu_q[size_t(b)] + i);
      size_t diff = 0, first = row_elems;
      for (size_t e = 0; e < row_elems; ++e)
        if (got[vrow * row_elems + e].bits != plain[size_t(b) * row_elems + e].bits && diff++ == 0) first = e;
      EXPECT_EQ(diff, 0u) << "sequence " << b << " row " << i << " (q_len " << c.q_lens[size_t(b)]
                          << ", kv_len " << c.kv_lens[size_t(b)] << "): " << diff
                          << " elements differ; first " << first << ": verify "
                          << bf16_to_f32(got[vrow * row_elems + first]) << " plain "
                          << bf16_to_f32(plain[size_t(b) * row_elems + first]);
    }
  }
}

TEST(CudaAttentionVerify, RowsBitwiseThePlainDecodeStep) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 4700;
  for (bool fp8 : {false, true})
    for (Gen gen : kGens) {
      const UseKernels use(gen);
      // Batch 1 at the 4B group (Hq 32, Hkv 8), k + 1 = 4 and 8 positions; one context inside a tile, one
      // over many tiles and splits, one in a wide table.
      for (int R : {4, 8})
        for (int ctx : {R + 3, 1027}) {
          SCOPED_TRACE("fp8 " + std::to_string(fp8) + " R " + std::to_string(R) + " ctx " +
                       std::to_string(ctx));
          check_verify_rows(
              Case{
                  .q_lens = {R}, .kv_lens = {ctx}, .Hq = 32, .Hkv = 8, .D = 128, .page_size = 64, .fp8 = fp8},
              R, seed++);
        }
      SCOPED_TRACE("fp8 " + std::to_string(fp8) + " batch 4, ragged");
      // Batch 4, ragged (a row without drafts, a short one), pages of 16 off the TMA box of 64, a wide table.
      check_verify_rows(Case{.q_lens = {4, 1, 2, 4},
                             .kv_lens = {300, 517, 70, 4},
                             .Hq = 16,
                             .Hkv = 4,
                             .D = 128,
                             .page_size = 16,
                             .fp8 = fp8,
                             .table_tokens = 4096},
                        4, seed++);
      if (!fp8)  // D 64, group 2, HND (fp8 needs D 128 for v3)
        check_verify_rows(Case{.q_lens = {3, 3},
                               .kv_lens = {200, 65},
                               .Hq = 4,
                               .Hkv = 2,
                               .D = 64,
                               .page_size = 32,
                               .hnd = true},
                          3, seed++);
    }
}

TEST(CudaAttentionVerify, RowsPastTheBoundAreRefused) {
  KILN_REQUIRE_GPU();
  const AttnSetup s(Case{.q_lens = {4}, .kv_lens = {40}}, 1);
  cuda::PagedAttnParams p = s.params(nullptr);
  p.decode_rows_per_seq = 2;
  p.max_q_len = 4;
  EXPECT_THROW(run_params(p, s.T, s.c.Hq, s.c.D), Error);
  p.decode_rows_per_seq = cuda::kMaxDecodeRowsPerSeq + 1;
  p.max_q_len = 0;
  EXPECT_THROW(run_params(p, s.T, s.c.Hq, s.c.D), Error);
}

}  // namespace
}  // namespace kiln
