// KV slot moves on CUDA (model/kv_cache.h KvCache::move_slots, ops/cuda/kv_move.h) against the CPU's on the
// same cache contents, byte for byte: bf16, f16 and fp8 caches (scales), NHD and HND, page sizes 1 and 16,
// head rows of 16-byte multiples (vector copies) and of 24 bytes (byte copies), chains, swaps, cycles,
// fan-out and a few hundred moves at once. Through the runner (target and EAGLE-3 draft on the GPU): a decode
// step over moved slots gives the bits of one whose rows were written there. (EAGLE-3 top-k and tree passes
// on CUDA: test_cuda_eagle3_topk.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../unit/eagle3_test_util.h"
#include "eagle3_cuda_util.h"
#include "model/eagle3_model.h"
#include "model/kv_cache.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Every byte of a cache, layer by layer (K, V, then the scales), copied to the host.
std::vector<uint8_t> cache_bytes(const KvCache& c) {
  std::vector<uint8_t> out;
  for (int l = 0; l < c.num_layers(); ++l) {
    const ops::KvCacheView v = c.layer(l);
    for (const Tensor* t : {&v.k, &v.v, &v.k_scale, &v.v_scale}) {
      if (t->data == nullptr) continue;
      const size_t at = out.size();
      out.resize(at + size_t(t->nbytes()));
      copy_bytes(out.data() + at, Device::cpu(), t->data, c.device(), size_t(t->nbytes()));
    }
  }
  return out;
}

// The same random bytes into both caches.
void fill_both(KvCache& cpu, KvCache& gpu, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int l = 0; l < cpu.num_layers(); ++l) {
    const ops::KvCacheView a = cpu.layer(l), b = gpu.layer(l);
    const Tensor* ta[] = {&a.k, &a.v, &a.k_scale, &a.v_scale};
    const Tensor* tb[] = {&b.k, &b.v, &b.k_scale, &b.v_scale};
    for (int i = 0; i < 4; ++i) {
      if (ta[i]->data == nullptr) continue;
      auto* p = static_cast<uint8_t*>(ta[i]->data);
      for (int64_t j = 0; j < ta[i]->nbytes(); ++j) p[j] = uint8_t(rng());
      copy_bytes(tb[i]->data, gpu.device(), p, Device::cpu(), size_t(ta[i]->nbytes()));
    }
  }
}

struct Moves {
  std::vector<int64_t> from, to;
};

// Chains, swaps, a cycle, fan-out and an identity, then `extra` random moves to distinct destinations.
Moves some_moves(int64_t slots, int extra, uint32_t seed) {
  Moves m;
  const auto add = [&](int64_t f, int64_t t) {
    m.from.push_back(f % slots);
    m.to.push_back(t % slots);
  };
  add(0, 2), add(1, 3), add(2, 4), add(3, 5);          // a chain: 2 and 3 are sources and destinations
  add(10, 13), add(13, 10), add(11, 12), add(12, 11);  // swaps
  add(20, 21), add(21, 22), add(22, 20);               // a cycle
  add(30, 31), add(30, 32), add(33, 33);               // fan-out, identity
  std::vector<int64_t> free_slots;
  for (int64_t s = 40; s < slots; ++s) free_slots.push_back(s);
  std::mt19937 rng(seed);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  for (int i = 0; i < extra && i < int(free_slots.size()); ++i)
    m.from.push_back(int64_t(rng() % uint64_t(slots))), m.to.push_back(free_slots[size_t(i)]);
  return m;
}

ModelConfig cache_config(int64_t head_dim, int64_t kv_heads, int64_t layers) {
  ModelConfig c;
  c.num_layers = layers;
  c.num_kv_heads = kv_heads;
  c.num_heads = kv_heads;
  c.head_dim = head_dim;
  c.hidden_size = kv_heads * head_dim;
  return c;
}

TEST(CudaKvMove, EqualsTheCpuMoveByteForByte) {
  KILN_REQUIRE_GPU();
  struct Case {
    DType dtype;
    int64_t head_dim;
  };
  for (const Case cs : {Case{DType::bf16, 128}, Case{DType::bf16, 64}, Case{DType::f16, 64},
                        Case{DType::bf16, 12}, Case{DType::f8e4m3, 128}, Case{DType::f8e4m3, 64}}) {
    for (auto layout : {ops::KvLayout::nhd, ops::KvLayout::hnd}) {
      for (int ps : {1, 16}) {
        SCOPED_TRACE(std::string(dtype_name(cs.dtype)) + " D " + std::to_string(cs.head_dim) +
                     (layout == ops::KvLayout::nhd ? " NHD" : " HND") + " page " + std::to_string(ps));
        const ModelConfig cfg = cache_config(cs.head_dim, 3, 5);
        const int pages = 640 / ps;
        KvCache cpu(cfg, pages, ps, layout, cs.dtype, Device::cpu());
        KvCache gpu(cfg, pages, ps, layout, cs.dtype, Device::cuda());
        fill_both(cpu, gpu, 7);
        ASSERT_EQ(cache_bytes(cpu), cache_bytes(gpu));
        const std::vector<uint8_t> before = cache_bytes(cpu);
        for (int extra : {0, 300}) {
          const Moves m = some_moves(cpu.num_slots(), extra, uint32_t(extra + ps));
          cpu.move_slots(m.from, m.to);
          gpu.move_slots(m.from, m.to);
          ASSERT_EQ(cache_bytes(gpu), cache_bytes(cpu)) << extra << " extra moves";
        }
        EXPECT_NE(cache_bytes(cpu), before) << "poison: the moves changed nothing";
        // Errors change nothing on the device either.
        const std::vector<uint8_t> now = cache_bytes(gpu);
        EXPECT_THROW(gpu.move_slots({0, 1}, {2, 2}), Error);
        EXPECT_THROW(gpu.move_slots({0, cpu.num_slots()}, {2, 3}), Error);
        EXPECT_EQ(cache_bytes(gpu), now);
      }
    }
  }
}

// Through the runner on the GPU (target bf16 and fp8 caches, with a draft): the path written at swapped slots
// and moved reads as the path written in place; the target's logits and the draft's outputs are the same
// bits.
TEST(CudaKvMove, RunnerDecodeOverMovedSlotsEqualsRowsWrittenThere) {
  KILN_REQUIRE_GPU();
  const fs::path dir = test::eagle3_scratch() / "draft_move";
  test::write_eagle3_draft(dir, test::eagle3_draft_shape(32, true));
  test::ScopedEnv graphs("KILN_EAGLE3_DRAFT_GRAPHS", "0");
  std::vector<int32_t> prompt, rows, junk_rows(16);
  for (int i = 0; i < 9; ++i) prompt.push_back((i * 37 + 11) % 512), rows.push_back(i);
  std::iota(junk_rows.begin(), junk_rows.end(), 0);
  const std::vector<int64_t> nodes = {8, 7, 6, 5}, path = {5, 6, 7, 8};
  for (DType kv : {DType::bf16, DType::f8e4m3}) {
    SCOPED_TRACE(dtype_name(kv));
    struct Result {
      std::vector<float> logits;
      ModelRunner::DraftOut draft;
    };
    const auto run = [&](bool moved) {
      auto target = test::eagle3_target(Device::cuda());
      auto draft = Eagle3Model::load(dir.string(), *target);
      Qwen3Runner r(std::move(target), ops::KvLayout::hnd, kv);
      r.set_draft(std::move(draft));
      r.allocate_kv(64, 1);
      ModelRunner::DraftOut o;
      std::vector<int32_t> junk;
      for (int i = 0; i < 16; ++i) junk.push_back((i * 91 + 3) % 512);
      const BatchDesc j = test::seq_step(junk, 0, test::consecutive_slots(16, 0));
      r.forward(j, nullptr, nullptr);
      r.draft_from_step(j, junk_rows, &o);
      std::vector<int64_t> ctx = {0, 1, 2, 3, 4};
      if (moved) {
        ctx.insert(ctx.end(), nodes.begin(), nodes.end());
      } else {
        ctx.insert(ctx.end(), path.begin(), path.end());
      }
      BatchDesc b = test::seq_step(prompt, 0, ctx);
      b.logit_rows = rows;
      r.forward(b, nullptr, nullptr);
      r.draft_from_step(b, rows, &o);
      if (moved) r.move_kv(nodes, path);
      Result res;
      const int64_t H = 256;
      r.draft_from_hidden(test::seq_step({77}, 9, test::consecutive_slots(10, 0)),
                          std::vector<float>(o.hidden.end() - H, o.hidden.end()), &res.draft);
      r.forward(test::seq_step({77}, 9, test::consecutive_slots(10, 0)), &res.logits, nullptr);
      return res;
    };
    const Result want = run(false), got = run(true);
    EXPECT_TRUE(test::same_bits(got.logits, want.logits));
    EXPECT_TRUE(test::same_bits(got.draft.hidden, want.draft.hidden));
    EXPECT_EQ(got.draft.tokens, want.draft.tokens);
  }
}

}  // namespace
}  // namespace kiln
