// Decode v3 issues the first K/V tiles of each row before its PDL wait (attention_decode_sm90_tma.cu:
// issue_before_wait), so launched early they overlap the predecessor. Only K/V rows written by earlier
// steps may be read there: this step's rows are the predecessor's (attn_prep) to write. Here the
// predecessor is a slow writer: it lets the decode launch at once, then spins before it restores this
// step's rows (poisoned with NaN until then) from a clean copy. The decode must equal, bit for bit, the same
// decode launched after a synchronize on the clean cache; a tile of this step's rows loaded before the wait
// would carry the NaNs into the output.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_setup.h"
#include "ops/cuda/common.cuh"

namespace {

using namespace kiln;
using namespace kiln::attn_test;

// A byte range of one of the restored buffers (K, V, K scales, V scales).
struct Span {
  int buf = 0;
  int64_t off = 0;
  int len = 0;
};
struct Restore {
  uint8_t* dst[4] = {};
  const uint8_t* src[4] = {};
};

// One block: lets its dependents launch, waits for its own predecessor, spins for delay_ns, then copies the
// spans from src to dst.
__global__ void delayed_restore_kernel(Restore r, const Span* spans, int n, long long delay_ns) {
  cuda::pdl_launch_dependents();
  cuda::pdl_wait();
  if (threadIdx.x == 0) {
    long long t0 = 0, t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < delay_ns);
  }
  __syncthreads();
  for (int i = 0; i < n; ++i)
    for (int j = int(threadIdx.x); j < spans[i].len; j += int(blockDim.x))
      r.dst[spans[i].buf][spans[i].off + j] = r.src[spans[i].buf][spans[i].off + j];
}

Buffer device_copy(const Buffer& b) {
  Buffer c(b.bytes(), Device::cuda());
  KILN_CUDA_CHECK(cudaMemcpy(c.data(), b.data(), b.bytes(), cudaMemcpyDeviceToDevice));
  return c;
}

// The last q_len rows of every sequence (the rows a step writes), every KV head: K, V and (fp8) their
// scale pairs, as spans of the cache buffers.
std::vector<Span> step_rows(const AttnSetup& s) {
  std::vector<Span> spans;
  const int esz = s.c.fp8 ? 1 : 2;
  for (int b = 0; b < s.B; ++b)
    for (int t = s.kv_lens[size_t(b)] - s.c.q_lens[size_t(b)]; t < s.kv_lens[size_t(b)]; ++t)
      for (int h = 0; h < s.c.Hkv; ++h) {
        const int page = s.page_table[size_t(b) * s.pages_stride + t / s.c.page_size];
        const int64_t o = s.off(page, t % s.c.page_size, h);
        for (int buf = 0; buf < 2; ++buf) spans.push_back({buf, o * esz, s.c.D * esz});
        if (s.c.fp8)
          for (int buf = 2; buf < 4; ++buf) spans.push_back({buf, o / 64, s.c.D / 64});
      }
  return spans;
}

// Sets the spans' bytes of the setup's cache buffers to 0xff (NaN in bf16 and e4m3 alike; a scale byte 255
// is 2^128, the e4m3 NaN times it stays NaN).
void poison_spans(AttnSetup& s, const std::vector<Span>& spans) {
  uint8_t* bufs[4] = {static_cast<uint8_t*>(s.dk.data()), static_cast<uint8_t*>(s.dv.data()),
                      static_cast<uint8_t*>(s.dks.data()), static_cast<uint8_t*>(s.dvs.data())};
  for (const Span& sp : spans) KILN_CUDA_CHECK(cudaMemset(bufs[sp.buf] + sp.off, 0xff, size_t(sp.len)));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

size_t non_finite(const std::vector<bf16_t>& v) {
  size_t n = 0;
  for (const auto& x : v) n += !std::isfinite(bf16_to_f32(x));
  return n;
}

// Runs the case: the clean decode, then the poisoned cache restored by the slow writer right before a
// decode launched with PDL, for each split count.
void check_case(const Case& c, uint32_t seed, Kernel k, std::initializer_list<int> splits_list,
                const std::string& what) {
  SCOPED_TRACE(what);
  const UseKernels use(Gen::v3);
  AttnSetup s(c, seed);
  const std::vector<Span> spans = step_rows(s);
  Buffer* live[4] = {&s.dk, &s.dv, &s.dks, &s.dvs};
  Buffer clean[4];
  Restore r;
  for (int i = 0; i < (c.fp8 ? 4 : 2); ++i) {
    clean[i] = device_copy(*live[i]);
    r.dst[i] = static_cast<uint8_t*>(live[i]->data());
    r.src[i] = static_cast<const uint8_t*>(clean[i].data());
  }
  Buffer dspans = test::to_device(spans);
  for (int splits : splits_list) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    for (int i = 0; i < (c.fp8 ? 4 : 2); ++i)
      KILN_CUDA_CHECK(
          cudaMemcpy(live[i]->data(), clean[i].data(), clean[i].bytes(), cudaMemcpyDeviceToDevice));
    const std::vector<bf16_t> want = run(s, k, splits);
    ASSERT_EQ(non_finite(want), 0u);
    ASSERT_LE(s.rel_err(want), 1.0 / 128);

    // The poison reaches the output when read: the check below can fail.
    poison_spans(s, spans);
    ASSERT_GT(non_finite(run(s, k, splits)), 0u) << "the poisoned rows are not read";

    // The slow writer, then the same attention launched with PDL on its stream.
    const std::vector<bf16_t> got =
        run(s, k, splits, /*pdl=*/true, /*staged=*/true, /*min_q_len=*/0, [&](cudaStream_t st) {
          cuda::launch(cuda::LaunchCfg{.grid = dim3(1), .block = dim3(256), .stream = st},
                       delayed_restore_kernel, r, static_cast<const Span*>(dspans.data()), int(spans.size()),
                       50'000LL);
        });
    EXPECT_EQ(non_finite(got), 0u) << "a row of this step was read before the decode's wait";
    EXPECT_EQ(max_ulps(got, want), 0) << s.first_mismatch(got);
  }
}

TEST(CudaAttentionEarly, DecodeReadsThisStepsRowsAfterItsWait) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 1300;
  // One-token rows (the decode step): contexts ending mid-tile, on a tile edge, short and long; TMA pages
  // (16, 32, 64) and cp.async ones (24); both cache dtypes and layouts.
  for (int ps : {32, 16, 64, 24})
    for (bool fp8 : {false, true})
      for (bool hnd : {true, false}) {
        Case c{.q_lens = {1, 1, 1, 1},
               .kv_lens = {1, 129, 1000, 4097},
               .Hq = 8,
               .Hkv = 2,
               .D = 128,
               .page_size = ps,
               .hnd = hnd,
               .fp8 = fp8};
        check_case(c, seed++, Kernel::decode, {0, 1, 2, 9},
                   "page " + std::to_string(ps) + (fp8 ? " fp8" : " bf16") + (hnd ? " HND" : " NHD"));
      }
}

TEST(CudaAttentionEarly, MultiRowSequencesInADecodeShapedLaunch) {
  KILN_REQUIRE_GPU();
  // T == B with sequences of 0, 3, 1 and 0 rows: one decode launch walks every row, and the last 3 rows of
  // sequence 1 are this step's (written by the predecessor).
  uint32_t seed = 1400;
  for (bool fp8 : {false, true}) {
    Case c{.q_lens = {0, 3, 1, 0},
           .kv_lens = {5, 1027, 700, 64},
           .Hq = 8,
           .Hkv = 2,
           .D = 128,
           .page_size = 32,
           .hnd = true,
           .fp8 = fp8};
    check_case(c, seed++, Kernel::routed, {0, 5}, fp8 ? "fp8" : "bf16");
  }
}

TEST(CudaAttentionEarly, QwenHeadsDecodeBatches) {
  KILN_REQUIRE_GPU();
  // Qwen3-4B's heads (32 / 8) at B = 1, 8 and 16 with the shape rule's splits (the shapes whose decode
  // launches early in the model's graphs), then groups of 8 and of 1 at B = 1 and 8.
  uint32_t seed = 1500;
  struct Heads {
    int Hq, Hkv;
    std::vector<int> batches;
  };
  for (const Heads& hd : {Heads{32, 8, {1, 8, 16}}, Heads{16, 2, {1, 8}}, Heads{8, 8, {1, 8}}})
    for (int B : hd.batches)
      for (bool fp8 : {false, true}) {
        Case c{.q_lens = {},
               .kv_lens = {},
               .Hq = hd.Hq,
               .Hkv = hd.Hkv,
               .D = 128,
               .page_size = 32,
               .hnd = true,
               .fp8 = fp8};
        for (int b = 0; b < B; ++b) {
          c.q_lens.push_back(1);
          c.kv_lens.push_back(1 + (b * 977 + 1024) % 2049);
        }
        check_case(c, seed++, Kernel::decode, {0},
                   "heads " + std::to_string(hd.Hq) + "/" + std::to_string(hd.Hkv) + " B " +
                       std::to_string(B) + (fp8 ? " fp8" : " bf16"));
      }
}

}  // namespace
