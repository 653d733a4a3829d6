// attn_prep on the GPU: fused (decode and prefill variants) == unfused == CPU reference, bit for bit, over
// random cases spanning the coverage matrix; every buffer poisoned before each run and compared in full
// (so untouched bytes are checked too); CUDA graph capture with replays on changing inputs.
// KILN_ATTN_PREP_CASES overrides the random case count (the compute-sanitizer runs use a small one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "attn_prep_case.h"

namespace {

using namespace kiln;
using namespace kiln::ops;
using test::Case;
using test::CaseCfg;
using test::DeviceCase;

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> v) {
  return *(v.begin() + rng() % v.size());
}

CaseCfg random_cfg(std::mt19937_64& rng, int i) {
  CaseCfg c;
  c.act = pick(rng, {DType::bf16, DType::f16});
  c.D = pick(rng, {64, 128, 256});
  const std::pair<int, int> heads = pick(rng, {std::pair{32, 8}, {16, 8}, {64, 8}, {4, 1}, {40, 8}});
  c.Hq = heads.first;
  c.Hkv = heads.second;
  // Full rotary, a partial one the fused kernel covers (multiple of 16), one only the unfused path covers.
  c.R = pick(rng, {c.D, c.D, c.D / 2, c.D / 4 + 2});
  c.mrope = pick(rng, {0, 0, 1, 2});
  if (c.mrope && (c.R / 2) % 16 != 0) c.R = c.D;  // keep the {s0, s1, s2} split meaningful
  c.pos64 = rng() % 2;
  c.pos_pad = pick<int64_t>(rng, {0, 0, 1, 5});
  c.q_contig = rng() % 2;
  c.q_head_pad = c.q_contig ? pick<int64_t>(rng, {0, 0, 8, 3}) : 0;
  c.row_pad = pick<int64_t>(rng, {0, 0, 64, 8, 3});
  c.layout = rng() % 2 ? KvLayout::nhd : KvLayout::hnd;
  c.page = pick(rng, {1, 16, 32, 64, 128});
  c.cache = pick(rng, {DType::bf16, DType::f16, DType::f8e4m3});
  c.cache_pad = pick<int64_t>(rng, {0, 0, 16, 5});
  // T: mostly small (the CPU oracle is scalar); every 300th case a large one.
  c.T = i % 300 == 299 ? pick(rng, {4096, 8192}) : pick(rng, {1, 2, 3, 8, 31, 128, 1, 8});
  c.special = rng() % 10 == 0 ? 0.01 : 0;
  return c;
}

bool fused_expected(const CaseCfg& c) {
  return (c.D == 64 || c.D == 128 || c.D == 256) && c.R % 16 == 0 && c.row_pad % 8 == 0 &&
         c.q_head_pad % 8 == 0 && c.cache_pad % 8 == 0;
}

int case_count() {
  const char* e = std::getenv("KILN_ATTN_PREP_CASES");
  return e ? std::atoi(e) : 2100;
}

void run_ref(Case& want) {
  auto hb = want.host_bases();
  attn_prep_reference(want.args(hb, Device::cpu()));
}

TEST(AttnPrepCuda, FusedEqualsUnfusedEqualsReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible: attn_prep GPU tests skipped";
  std::mt19937_64 rng(20261130);
  const int n = case_count();
  int fused_cases = 0, compared = 0;
  for (int i = 0; i < n; ++i) {
    const CaseCfg cfg = random_cfg(rng, i);
    if (cfg.D % 64 && cfg.cache == DType::f8e4m3) continue;  // (cannot happen: D is 64/128/256)
    Case input(cfg, rng);
    Case want = input;
    run_ref(want);
    DeviceCase dev(input);
    const AttnPrepArgs a = input.args(dev.base, Device::cuda());
    // The dispatcher's choice, then each implementation from the same poisoned state.
    const AttnPrepPath path = attn_prep(a);
    const bool fused = fused_expected(cfg);
    ASSERT_EQ(path == AttnPrepPath::cuda_unfused, !fused) << "case " << i << ": " << cfg.describe();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(dev.diff(want), "") << "dispatcher (" << attn_prep_path_name(path) << ") case " << i << ": "
                                  << cfg.describe();
    ++compared;
    // Every kernel on the same rows: unfused, and where the fused guards hold, the decode, prefill and
    // (where its head-count guard holds) streaming kernels, whatever T is.
    std::vector<int> variants = {0};
    if (fused) variants = {0, 1, 2};
    if (fused && cfg.Hq + 2 * cfg.Hkv <= 4 * (256 / (cfg.D / 8))) variants.push_back(3);
    for (int v : variants) {
      dev.upload(input);
      if (v == 0) attn_prep_unfused(a);
      if (v == 1) attn_prep_fused(a, AttnPrepKernel::decode);
      if (v == 2) attn_prep_fused(a, AttnPrepKernel::prefill);
      if (v == 3) attn_prep_fused(a, AttnPrepKernel::prefill_streaming);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      static const char* names[] = {"unfused", "fused decode", "fused prefill", "fused streaming"};
      ASSERT_EQ(dev.diff(want), "") << names[v] << " case " << i << ": " << cfg.describe();
      ++compared;
    }
    fused_cases += fused;
  }
  std::printf(
      "[ attn_prep ] %d random cases (%d through the fused kernels), %d GPU runs compared bit for bit\n", n,
      fused_cases, compared);
  if (n >= 2000) {
    EXPECT_GE(fused_cases, n / 3);
  }
}

// Slots past the cache are skipped on the GPU (the CPU reference raises): same bytes as slot -1.
TEST(AttnPrepCuda, OutOfRangeSlotAndPositionAreContained) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  std::mt19937_64 rng(7);
  CaseCfg cfg;
  cfg.T = 31;
  cfg.skip = 0;
  Case input(cfg, rng);
  Case want = input;
  const int64_t bad = want.num_pages * cfg.page + 3, skipped = -1;
  std::memcpy(input.slots.data() + 5 * 8, &bad, 8);
  std::memcpy(want.slots.data() + 5 * 8, &skipped, 8);
  run_ref(want);
  std::memcpy(want.slots.data() + 5 * 8, &bad, 8);  // the slots buffer itself is compared too
  for (bool fused : {true, false}) {
    DeviceCase dev(input);
    const AttnPrepArgs a = input.args(dev.base, Device::cuda());
    if (fused) {
      attn_prep_fused(a, AttnPrepKernel::decode);
    } else {
      attn_prep_unfused(a);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dev.diff(want), "") << (fused ? "fused" : "unfused");
  }
}

TEST(AttnPrepCuda, ZeroTokensLaunchNothing) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  std::mt19937_64 rng(3);
  CaseCfg cfg;
  cfg.T = 1;
  Case input(cfg, rng);
  DeviceCase dev(input);
  AttnPrepArgs a = input.args(dev.base, Device::cuda());
  a.qkv.shape[0] = a.q_out.shape[0] = a.positions.shape[0] = a.slot_mapping.shape[0] = 0;
  EXPECT_NO_THROW(attn_prep(a));
  EXPECT_NO_THROW(attn_prep_unfused(a));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dev.diff(input), "") << "T = 0 must write nothing";
}

// Capture once, replay with new inputs (copied into the captured buffers) and check every replay.
void graph_replays(CaseCfg cfg, bool unfused, bool pdl = false) {
  std::mt19937_64 rng(11 + cfg.T);
  Case input(cfg, rng);
  DeviceCase dev(input);
  const AttnPrepArgs base = input.args(dev.base, Device::cuda());
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  AttnPrepArgs a = base;
  a.stream = s;
  a.pdl = pdl;
  cudaGraph_t g;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  if (unfused) {
    attn_prep_unfused(a);
  } else {
    attn_prep(a);
  }
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t ge;
  ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
  for (int r = 0; r < 10; ++r) {
    input.randomize(rng);  // fresh qkv, weights, positions, slots; outputs poisoned
    Case want = input;
    run_ref(want);
    dev.upload(input);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(dev.diff(want), "") << "replay " << r << (unfused ? " unfused " : " ") << cfg.describe();
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

TEST(AttnPrepCuda, GraphReplaysWithChangingInputs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  CaseCfg decode;  // Qwen3-4B decode: 32/8, D128, page 32, BF16 cache, HND, in place
  decode.T = 8;
  decode.q_contig = false;
  graph_replays(decode, false);
  CaseCfg vl = decode;  // FP8 cache, NHD, M-RoPE interleaved, Q contiguous, prefill-sized
  vl.T = 200;
  vl.cache = DType::f8e4m3;
  vl.layout = KvLayout::nhd;
  vl.mrope = 2;
  vl.q_contig = true;
  graph_replays(vl, false);
  graph_replays(decode, true);  // the unfused path's stream-ordered scratch is capturable too
  graph_replays(decode, false, /*pdl=*/true);
  graph_replays(vl, false, /*pdl=*/true);
}

}  // namespace
