// The MoE expert-kernel tuner (ops/cuda/moe_tune.h) and its startup use (model/cuda_tune.h
// cuda_moe_autotune): on a small block-FP8 and a small bf16 shape, each with a cache file of this process
// alone, the threshold is a ladder T (or the ladder's end), is applied through the setter, and a second call
// reads it from the cache without timing; moe_mlp (by_rows) then runs the grouped GEMM from that T and the
// gather GEMV below it (bitwise the named kernels); a malformed cache is re-tuned and rewritten; the
// environment's thresholds and KILN_MOE_TUNE=0 win over the tuner; 30B-A3B's shapes tune on the ladder (their
// times printed).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/scoped_env.h"
#include "common/test_support.h"
#include "model/cuda_tune.h"
#include "moe_fp8_layer.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_ops.h"
#include "ops/cuda/moe_tune.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace kc = ::kiln::cuda;
using ops::cuda::MoeExperts;

using test_support::ScopedEnv;

// A cache path of this process alone (ctest runs the TESTs in parallel), absent at first.
std::string cache_path(const std::string& name) {
  const auto p = test_support::process_scratch_dir("cuda_moe_tune") / (name + ".moe");
  std::filesystem::remove(p);
  return p.string();
}

// The thresholds a test changes, put back after it.
struct ThresholdsScope {
  int64_t fp8_before = ops::cuda::moe_fp8_w8a8_min_tokens();
  int64_t gemv_before = ops::cuda::moe_gemv_max_tokens();
  ~ThresholdsScope() {
    ops::cuda::moe_set_fp8_w8a8_min_tokens(fp8_before);
    ops::cuda::moe_set_gemv_max_tokens(gemv_before);
  }
};

// The small shape both dtypes are tuned at: 128-multiples for the FP8 blocks.
constexpr int64_t kE = 16, kK = 4, kH = 256, kI = 128;

ops::MoeTuneShape small_shape(bool fp8) {
  return {.E = kE, .local = kE, .k = kK, .H = kH, .I = kI, .fp8 = fp8};
}

bool on_ladder_or_end(int64_t t, int64_t below) {
  if (t == below) return true;
  for (const int64_t l : ops::kMoeTuneLadder)
    if (l == t && l < below) return true;
  return false;
}

void print_times(const char* what, const MoeAutotuneResult& r) {
  const ops::MoeTuneTimes& t = r.entry.times;
  for (size_t i = 0; i < t.tokens.size(); ++i)
    std::printf("%s T %3lld: gather GEMV %8.1f us, grouped GEMM %8.1f us\n", what, (long long)t.tokens[i],
                t.gemv_us[i], t.grouped_us[i]);
  std::printf("%s: grouped GEMM from T = %lld (below %lld), %.3f s\n", what, (long long)r.entry.grouped_from,
              (long long)r.key.below, r.seconds);
}

// Tunes s into a fresh cache: tuned, on the ladder, the file holding it; then a second call reads it (no
// times: nothing re-timed) with the same threshold.
MoeAutotuneResult tune_then_read_back(const ops::MoeTuneShape& s, const std::string& path) {
  const MoeAutotuneResult first = cuda_moe_autotune(s, path);
  EXPECT_EQ(first.source, MoeTuneSource::tuned);
  EXPECT_TRUE(on_ladder_or_end(first.entry.grouped_from, first.key.below)) << first.entry.grouped_from;
  EXPECT_FALSE(first.entry.times.tokens.empty());
  print_times(s.fp8 ? "fp8 small" : "bf16 small", first);
  const ops::MoeTuneCache file = ops::load_moe_tune_cache(path);
  EXPECT_EQ(file.size(), 1u);
  EXPECT_TRUE(file.count(first.key));
  const MoeAutotuneResult second = cuda_moe_autotune(s, path);
  EXPECT_EQ(second.source, MoeTuneSource::cache);
  EXPECT_EQ(second.entry.grouped_from, first.entry.grouped_from);
  EXPECT_TRUE(second.entry.times.tokens.empty()) << "read from the cache, not timed again";
  return first;
}

// by_rows at T runs `want`'s kernel: bitwise its output named.
void expect_by_rows_is(const ops::MoeWeights& w, int64_t T, MoeExperts want) {
  SCOPED_TRACE("T " + std::to_string(T));
  const Buffer x = test::to_device(test::random_bf16(size_t(T * kH), uint32_t(100 + T)));
  Buffer s1(256, Device::cuda()), s2(256, Device::cuda());
  const auto by_rows = test::run_moe_gpu(w, x, T, kH, MoeExperts::by_rows, s1);
  const auto named = test::run_moe_gpu(w, x, T, kH, want, s2);
  for (size_t i = 0; i < by_rows.size(); ++i) ASSERT_EQ(by_rows[i].bits, named[i].bits) << "element " << i;
}

TEST(CudaMoeTune, Fp8ThresholdIsTunedCachedAndFollowed) {
  KILN_REQUIRE_GPU();
  const ThresholdsScope keep;
  const ScopedEnv tune("KILN_MOE_TUNE", nullptr), var("KILN_MOE_FP8_W8A8_MIN_TOKENS", nullptr);
  const test::Fp8W8a8Scope on(true);
  if (ops::cuda::moe_tune_below(small_shape(true)) == 0)
    GTEST_SKIP() << "the W8A8 grouped GEMM does not run here (sm_90a, KILN_MOE_FP8_W8A8, KILN_MOE_EXPERTS, "
                    "dequant threshold): nothing to tune";
  const MoeAutotuneResult r = tune_then_read_back(small_shape(true), cache_path("fp8"));
  const int64_t from = r.entry.grouped_from;
  EXPECT_EQ(ops::cuda::moe_fp8_w8a8_min_tokens(), from);
  const test::Fp8Layer l = test::make_fp8_layer(kE, kK, kH, kI, 71);
  const ops::MoeWeights w8 = l.fp8(Device::cuda());
  EXPECT_TRUE(ops::cuda::moe_fp8_w8a8_runs(w8, from));
  expect_by_rows_is(w8, from, MoeExperts::grouped_gemm_fp8_w8a8);
  if (from > 1) {
    EXPECT_FALSE(ops::cuda::moe_fp8_w8a8_runs(w8, from - 1));
    EXPECT_FALSE(ops::cuda::moe_fp8_dequant_runs(w8, from - 1));
    expect_by_rows_is(w8, from - 1, MoeExperts::gather_gemv);
  }
}

TEST(CudaMoeTune, Bf16ThresholdIsTunedCachedAndFollowed) {
  KILN_REQUIRE_GPU();
  const ThresholdsScope keep;
  const ScopedEnv tune("KILN_MOE_TUNE", nullptr), var("KILN_MOE_GEMV_MAX_TOKENS", nullptr);
  if (ops::cuda::moe_tune_below(small_shape(false)) == 0)
    GTEST_SKIP() << "the wgmma grouped GEMM does not apply here (or KILN_MOE_EXPERTS names a kernel)";
  const MoeAutotuneResult r = tune_then_read_back(small_shape(false), cache_path("bf16"));
  const int64_t from = r.entry.grouped_from;
  EXPECT_EQ(ops::cuda::moe_gemv_max_tokens(), from - 1);
  const test::Fp8Layer l = test::make_fp8_layer(kE, kK, kH, kI, 73);  // owns the buffers w points into
  const ops::MoeWeights w = l.dequantized_device();
  expect_by_rows_is(w, from, MoeExperts::grouped_gemm_sm90);
  if (from > 1) expect_by_rows_is(w, from - 1, MoeExperts::gather_gemv);
}

// A cache of another format, or with a damaged line, is ignored (re-tuned) and rewritten whole.
TEST(CudaMoeTune, MalformedCacheIsRetunedAndRewritten) {
  KILN_REQUIRE_GPU();
  const ThresholdsScope keep;
  const ScopedEnv tune("KILN_MOE_TUNE", nullptr), var("KILN_MOE_GEMV_MAX_TOKENS", nullptr);
  const ops::MoeTuneShape s = small_shape(false);
  if (ops::cuda::moe_tune_below(s) == 0) GTEST_SKIP() << "the wgmma grouped GEMM does not apply here";
  const std::string path = cache_path("malformed");
  for (const std::string& text :
       {std::string("kiln moe thresholds v0\n"), std::string(ops::kMoeTuneCacheFormat) + "\ngpu=\n"}) {
    std::ofstream(path) << text;
    const MoeAutotuneResult r = cuda_moe_autotune(s, path);
    EXPECT_EQ(r.source, MoeTuneSource::tuned);
    EXPECT_EQ(ops::load_moe_tune_cache(path).size(), 1u) << "rewritten with the tuned line";
    EXPECT_EQ(cuda_moe_autotune(s, path).source, MoeTuneSource::cache);
  }
}

// KILN_MOE_FP8_W8A8_MIN_TOKENS / KILN_MOE_GEMV_MAX_TOKENS set: the tuner times nothing, sets nothing, writes
// nothing; KILN_MOE_TUNE=0 likewise.
TEST(CudaMoeTune, EnvironmentWinsOverTheTuner) {
  KILN_REQUIRE_GPU();
  const ThresholdsScope keep;
  const std::string path = cache_path("env");
  {
    const ScopedEnv tune("KILN_MOE_TUNE", nullptr), var("KILN_MOE_FP8_W8A8_MIN_TOKENS", "5");
    ops::cuda::moe_set_fp8_w8a8_min_tokens(5);  // as the variable, read once, would have set it
    EXPECT_EQ(cuda_moe_autotune(small_shape(true), path).source, MoeTuneSource::env);
    EXPECT_EQ(ops::cuda::moe_fp8_w8a8_min_tokens(), 5);
  }
  {
    const ScopedEnv tune("KILN_MOE_TUNE", nullptr), var("KILN_MOE_GEMV_MAX_TOKENS", "3");
    ops::cuda::moe_set_gemv_max_tokens(3);
    EXPECT_EQ(cuda_moe_autotune(small_shape(false), path).source, MoeTuneSource::env);
    EXPECT_EQ(ops::cuda::moe_gemv_max_tokens(), 3);
  }
  {
    const ScopedEnv tune("KILN_MOE_TUNE", "0"), v1("KILN_MOE_FP8_W8A8_MIN_TOKENS", nullptr),
        v2("KILN_MOE_GEMV_MAX_TOKENS", nullptr);
    ops::cuda::moe_set_fp8_w8a8_min_tokens(7);
    ops::cuda::moe_set_gemv_max_tokens(9);
    EXPECT_EQ(cuda_moe_autotune(small_shape(true), path).source, MoeTuneSource::off);
    EXPECT_EQ(cuda_moe_autotune(small_shape(false), path).source, MoeTuneSource::off);
    EXPECT_EQ(ops::cuda::moe_fp8_w8a8_min_tokens(), 7);
    EXPECT_EQ(ops::cuda::moe_gemv_max_tokens(), 9);
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "nothing tuned, nothing written";
}

// KILN_TUNE_CACHE moves the MoE cache with the tactic cache.
TEST(CudaMoeTune, CachePathFollowsKilnTuneCache) {
  KILN_REQUIRE_GPU();
  const ScopedEnv env("KILN_TUNE_CACHE", "/tmp/kiln_private/tactics.txt");
  EXPECT_EQ(ops::moe_tune_cache_path(kc::default_tactic_cache_path()), "/tmp/kiln_private/tactics.txt.moe");
}

// 30B-A3B's experts (E 128, k 8, H 2048, I 768), block-FP8 and bf16: a threshold on the ladder; the times and
// the tuner's seconds printed for the record (a time is never asserted: tests do not depend on timing).
TEST(CudaMoeTune, ThirtyBA3bShapesTuneOnTheLadder) {
  KILN_REQUIRE_GPU();
  for (const bool fp8 : {true, false}) {
    const ops::MoeTuneShape s{.E = 128, .local = 128, .k = 8, .H = 2048, .I = 768, .fp8 = fp8};
    const ops::cuda::MoeThresholds t = ops::cuda::tune_moe_thresholds(s);
    if (!t.tuned) {
      std::printf("30B-A3B %s experts: nothing to tune here\n", fp8 ? "fp8" : "bf16");
      continue;
    }
    MoeAutotuneResult r;
    r.key.below = t.below;
    r.entry = {.grouped_from = t.grouped_from, .times = t.times};
    r.seconds = t.seconds;
    print_times(fp8 ? "30B-A3B fp8" : "30B-A3B bf16", r);
    EXPECT_TRUE(on_ladder_or_end(t.grouped_from, t.below));
  }
}

}  // namespace
}  // namespace kiln
