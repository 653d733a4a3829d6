// ModelRunner::move_kv on the CPU backend (EAGLE tree drafting keeps a tree's accepted path by moving its
// KV):
//   - every slot read before any is written (chains, swaps, fan-out), other slots and the fp8 scales as they
//     should be, byte for byte; a decode step over the moved slots gives the logits of a step whose rows were
//     written there in the first place, bit for bit (bf16 and fp8 caches, NHD and HND; the EAGLE-3 draft's
//     cache moves with the target's); bad moves are errors naming the index that change nothing;
//   - FakeRunner moves its (token, position) slots; the tensor-parallel runner moves every rank's shard (in
//     process and by broadcast command) and survives a bad move; the default refuses by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "eagle3_test_util.h"
#include "kiln/error.h"
#include "model/eagle3_model.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "ops/argmax.h"
#include "runner_tree_test_util.h"
#include "runtime/fake_runner.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_command.h"
#include "runtime/tp_runner.h"
#include "tiny_model_config.h"

namespace kiln {
namespace {

using namespace tree_ops;  // NOLINT: the shared fixtures (runner_tree_test_util.h)

// The bytes of one slot in one layer: every head's K row, V row, K scales, V scales.
std::vector<uint8_t> slot_bytes(const KvCache& c, int layer, int64_t slot) {
  const ops::KvCacheView v = c.layer(layer);
  std::vector<uint8_t> out;
  const int64_t page = slot / c.page_size(), off = slot % c.page_size();
  for (const Tensor* t : {&v.k, &v.v, &v.k_scale, &v.v_scale}) {
    if (t->data == nullptr) continue;
    const int64_t heads = c.layout() == ops::KvLayout::nhd ? t->shape[2] : t->shape[1];
    const int64_t es = dtype_size(t->dtype), row = t->shape[3] * es;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = c.layout() == ops::KvLayout::nhd
                             ? page * t->stride[0] + off * t->stride[1] + h * t->stride[2]
                             : page * t->stride[0] + h * t->stride[1] + off * t->stride[2];
      const auto* p = static_cast<const uint8_t*>(t->data) + at * es;
      out.insert(out.end(), p, p + row);
    }
  }
  return out;
}

// Every byte of the cache (each layer's K, V and scale buffers: contiguous views of the whole storage).
std::vector<uint8_t> snapshot(const KvCache& c) {
  std::vector<uint8_t> out;
  for (int l = 0; l < c.num_layers(); ++l) {
    const ops::KvCacheView v = c.layer(l);
    for (const Tensor* t : {&v.k, &v.v, &v.k_scale, &v.v_scale}) {
      if (t->data == nullptr) continue;
      const auto* p = static_cast<const uint8_t*>(t->data);
      out.insert(out.end(), p, p + t->nbytes());
    }
  }
  return out;
}

void fill_random(KvCache& c, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int l = 0; l < c.num_layers(); ++l) {
    const ops::KvCacheView v = c.layer(l);
    for (const Tensor* t : {&v.k, &v.v, &v.k_scale, &v.v_scale}) {
      if (t->data == nullptr) continue;
      auto* p = static_cast<uint8_t*>(t->data);
      for (int64_t i = 0; i < t->nbytes(); ++i) p[i] = uint8_t(rng());
    }
  }
}

// The moves the tests below run, by name: a tree's kept path written at (prefix positions 0 .. 4 in place,
// then slots `nodes` for positions 5 .. 8), moved to the slots of positions 5 .. 8 (6 .. 9). Before the move
// the slots hold another sequence's rows. `differs`: whether the step over the unmoved slots reads other keys
// (the swaps leave the same set of keys in slots 6 .. 9, and attention does not see their order).
struct PathCase {
  const char* name;
  std::vector<int64_t> nodes;
  bool differs;
};
const std::vector<PathCase>& path_cases() {
  static const std::vector<PathCase> cases = {
      {"disjoint", {13, 14, 15, 16}, true},  // destinations hold junk
      {"shift", {8, 9, 10, 11}, true},       // 8 and 9 are sources and destinations
      {"swaps", {9, 8, 7, 6}, false},        // 6 <-> 9 and 7 <-> 8
      {"overwrite", {10, 6, 11, 7}, true},   // 10 -> 6 before 6 -> 7 and 11 -> 8 before 7 -> 9, in order
  };
  return cases;
}

std::vector<int64_t> path_ctx(const std::vector<int64_t>& nodes) {
  std::vector<int64_t> ctx = {1, 2, 3, 4, 5};
  ctx.insert(ctx.end(), nodes.begin(), nodes.end());
  return ctx;
}

const std::vector<int64_t> kPathSlots = {6, 7, 8, 9};

// ---------------------------------------------------------------------------------------------------------
// move_kv on Qwen3Runner

struct CacheCase {
  DType dtype;
  ops::KvLayout layout;
};
std::string case_name(const ::testing::TestParamInfo<CacheCase>& i) {
  return std::string(i.param.dtype == DType::bf16 ? "bf16" : "fp8") +
         (i.param.layout == ops::KvLayout::nhd ? "_nhd" : "_hnd");
}

class RunnerMoveKv : public ::testing::TestWithParam<CacheCase> {};

// Direct: every destination holds its source's bytes from before the call (scales included), every other slot
// its own; over page sizes 1 and 4 (moves within and across pages).
TEST_P(RunnerMoveKv, DestinationsGetTheirSourcesBytesOtherSlotsKeepTheirOwn) {
  for (int32_t ps : {1, 4}) {
    SCOPED_TRACE("page size " + std::to_string(ps));
    auto r = make_runner(GetParam().dtype, GetParam().layout, false, 64 / ps, ps);
    KvCache& c = r->cache();
    fill_random(c, 11);
    const std::vector<int64_t> from = {0, 1, 2, 3, 10, 11, 12, 20, 20, 30, 40, 63};
    const std::vector<int64_t> to = {2, 3, 4, 5, 11, 12, 10, 21, 22, 30, 63, 40};
    std::vector<std::vector<std::vector<uint8_t>>> before(size_t(c.num_layers()));
    for (int l = 0; l < c.num_layers(); ++l)
      for (int64_t s = 0; s < c.num_slots(); ++s) before[size_t(l)].push_back(slot_bytes(c, l, s));
    r->move_kv(from, to);
    for (int l = 0; l < c.num_layers(); ++l) {
      for (int64_t s = 0; s < c.num_slots(); ++s) {
        int64_t src = s;
        for (size_t i = 0; i < to.size(); ++i)
          if (to[i] == s) src = from[i];
        ASSERT_EQ(slot_bytes(c, l, s), before[size_t(l)][size_t(src)]) << "layer " << l << " slot " << s;
      }
    }
    // Empty moves change nothing.
    const std::vector<uint8_t> all = snapshot(c);
    r->move_kv({}, {});
    EXPECT_EQ(snapshot(c), all);
  }
}

// The decode step after a move reads what a step that wrote the path there in the first place reads: the
// logits are the same bits. The moved runner first fills slots 0 .. 15 with another sequence.
TEST_P(RunnerMoveKv, DecodeOverMovedSlotsEqualsRowsWrittenThere) {
  const std::vector<int32_t> prompt = some_tokens(9, 1), next = {17};
  std::vector<float> want, got, unmoved;
  {
    auto y = make_runner(GetParam().dtype, GetParam().layout, false);
    y->forward(seq_step(prompt, 0, plain_ctx(10)), nullptr, nullptr);
    y->forward(seq_step(next, 9, plain_ctx(10)), &want, nullptr);
  }
  for (const PathCase& pc : path_cases()) {
    SCOPED_TRACE(pc.name);
    for (bool move : {true, false}) {
      auto x = make_runner(GetParam().dtype, GetParam().layout, false);
      x->forward(seq_step(some_tokens(16, 9), 0, plain_ctx(16)), nullptr, nullptr);  // junk everywhere
      x->forward(seq_step(prompt, 0, path_ctx(pc.nodes)), nullptr, nullptr);
      if (move) x->move_kv(pc.nodes, kPathSlots);
      x->forward(seq_step(next, 9, plain_ctx(10)), move ? &got : &unmoved, nullptr);
    }
    EXPECT_TRUE(same_bits(got, want)) << "the moved path does not give the logits of the path written there";
    if (pc.differs) {
      EXPECT_FALSE(same_bits(unmoved, want)) << "poison: without the move the logits should differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Caches, RunnerMoveKv,
                         ::testing::Values(CacheCase{DType::bf16, ops::KvLayout::nhd},
                                           CacheCase{DType::bf16, ops::KvLayout::hnd},
                                           CacheCase{DType::f8e4m3, ops::KvLayout::nhd},
                                           CacheCase{DType::f8e4m3, ops::KvLayout::hnd}),
                         case_name);

// With an EAGLE-3 draft its one-layer cache moves too: the draft's decode pass after the move gives the
// outputs of one whose path was written in place (and the target's logits are those too).
TEST(RunnerMoveKvDraft, DraftCacheMovesWithTheTarget) {
  const std::vector<int32_t> prompt = some_tokens(9, 2), next = {23};
  const std::vector<int32_t> rows = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  struct Result {
    std::vector<float> logits;
    ModelRunner::DraftOut draft;
  };
  const auto run = [&](const std::vector<int64_t>* nodes, bool move) {
    auto r = make_runner(DType::bf16, ops::KvLayout::nhd, true);
    ModelRunner::DraftOut o;
    const BatchDesc junk = seq_step(some_tokens(16, 9), 0, plain_ctx(16));
    r->forward(junk, nullptr, nullptr);
    std::vector<int32_t> junk_rows(16);
    std::iota(junk_rows.begin(), junk_rows.end(), 0);
    r->draft_from_step(junk, junk_rows, &o);
    const BatchDesc b = seq_step(prompt, 0, nodes ? path_ctx(*nodes) : plain_ctx(10));
    BatchDesc all_rows = b;
    all_rows.logit_rows = rows;
    r->forward(all_rows, nullptr, nullptr);
    r->draft_from_step(all_rows, rows, &o);
    if (move) r->move_kv(*nodes, kPathSlots);
    Result res;
    const std::vector<float> h(o.hidden.end() - 64, o.hidden.end());  // position 8's output
    r->draft_from_hidden(seq_step(next, 9, plain_ctx(10)), h, &res.draft);
    r->forward(seq_step(next, 9, plain_ctx(10)), &res.logits, nullptr);
    return res;
  };
  const Result want = run(nullptr, false);
  for (const PathCase& pc : path_cases()) {
    SCOPED_TRACE(pc.name);
    const Result got = run(&pc.nodes, true), unmoved = run(&pc.nodes, false);
    EXPECT_TRUE(same_bits(got.draft.hidden, want.draft.hidden));
    EXPECT_EQ(got.draft.tokens, want.draft.tokens);
    EXPECT_TRUE(same_bits(got.logits, want.logits));
    if (pc.differs) {
      EXPECT_FALSE(same_bits(unmoved.draft.hidden, want.draft.hidden))
          << "poison: the draft read unmoved slots";
    }
  }
}

// Bad moves: errors naming what is wrong, checked before anything moves (the valid moves listed first do not
// happen either).
TEST(RunnerMoveKvErrors, BadMovesAreErrorsThatChangeNothing) {
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    auto r = make_runner(dt, ops::KvLayout::nhd, true, 16, 4);
    fill_random(r->cache(), 3);
    const std::vector<uint8_t> before = snapshot(r->cache());
    struct Bad {
      std::vector<int64_t> from, to;
      std::string says;
    };
    const std::vector<Bad> bad = {
        {{1, 2}, {3}, "from and to sizes"},
        {{0, 64}, {1, 2}, "from[1] = 64 outside the cache's slots [0, 64)"},
        {{0, 1, 2}, {3, 4, -1}, "to[2] = -1 outside"},
        {{0, 1, 2}, {5, 6, 5}, "to[0] and to[2] are both slot 5"},
    };
    for (const Bad& b : bad) {
      const std::string msg = error_of([&] { r->move_kv(b.from, b.to); });
      EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
      EXPECT_EQ(snapshot(r->cache()), before) << b.says;
    }
  }
  auto fresh = std::make_unique<Qwen3Runner>(tiny_model(), ops::KvLayout::nhd, DType::bf16);
  EXPECT_NE(error_of([&] { fresh->move_kv({0}, {1}); }).find("allocate_kv was not called"),
            std::string::npos);
}

// A runner that overrides nothing of the tree interface: the defaults refuse by name.
class PlainRunner : public ModelRunner {
 public:
  const ModelConfig& config() const override { return cfg_; }
  Device device() const override { return Device::cpu(); }
  int64_t kv_bytes_per_token() const override { return 1; }
  int64_t kv_memory_budget(double) const override { return 0; }
  void allocate_kv(int32_t, int32_t) override {}
  void forward(const BatchDesc&, std::vector<float>*, std::vector<float>*) override {}

 private:
  ModelConfig cfg_;
};

TEST(RunnerDefaults, MoveKvAndDraftTopkRefuseByName) {
  PlainRunner p;
  EXPECT_NE(error_of([&] { p.move_kv({0}, {1}); }).find("this model runner cannot move KV slots"),
            std::string::npos);
  EXPECT_NO_THROW(p.set_draft_topk(1));
  EXPECT_NE(error_of([&] { p.set_draft_topk(2); }).find("no EAGLE-3 top-k drafting"), std::string::npos);
  FakeRunner f;
  EXPECT_NO_THROW(f.set_draft_topk(1));
  EXPECT_THROW(f.set_draft_topk(4), Error);
}

// ---------------------------------------------------------------------------------------------------------
// FakeRunner: its slots hold (token, position) and every step reads its context back through the page
// table, throwing on a wrong one; move_kv moves those.

TEST(FakeRunnerMoveKv, MovedSlotsReadBackAndBadMovesChangeNothing) {
  const std::vector<int32_t> prompt = some_tokens(9, 3);
  for (const PathCase& pc : path_cases()) {
    SCOPED_TRACE(pc.name);
    std::vector<float> want, got;
    FakeRunner ref(kVocab);
    ref.allocate_kv(32, 1);
    ref.forward(seq_step(prompt, 0, plain_ctx(10)), nullptr, nullptr);
    ref.forward(seq_step({7}, 9, plain_ctx(10)), &want, nullptr);

    FakeRunner f(kVocab);
    f.allocate_kv(32, 1);
    f.forward(seq_step(some_tokens(16, 8), 0, plain_ctx(16)), nullptr, nullptr);
    f.forward(seq_step(prompt, 0, path_ctx(pc.nodes)), nullptr, nullptr);
    // Poison: before the move, slots 6 .. 9 hold other positions (the runner's own check throws) or the
    // junk's tokens (other logits).
    bool poisoned = false;
    try {
      std::vector<float> early;
      f.forward(seq_step({7}, 9, plain_ctx(10)), &early, nullptr);
      poisoned = early != want;
    } catch (const Error&) {
      poisoned = true;
    }
    EXPECT_TRUE(poisoned);
    // Bad moves first: nothing moves (the slots still read back as before).
    EXPECT_THROW(f.move_kv(pc.nodes, {6, 7, 8}), Error);
    EXPECT_THROW(f.move_kv(pc.nodes, {6, 7, 8, 32}), Error);
    EXPECT_THROW(f.move_kv(pc.nodes, {6, 7, 6, 9}), Error);
    EXPECT_NO_THROW(f.forward(seq_step(prompt, 0, path_ctx(pc.nodes)), nullptr, nullptr));
    f.move_kv(pc.nodes, kPathSlots);
    ASSERT_NO_THROW(f.forward(seq_step({7}, 9, plain_ctx(10)), &got, nullptr));
    EXPECT_EQ(got, want);
  }
  FakeRunner unallocated;
  EXPECT_THROW(unallocated.move_kv({0}, {1}), Error);
}

// ---------------------------------------------------------------------------------------------------------
// The tensor-parallel runner (CPU ranks): each rank moves its own shard.

EngineOptions fixture_opts(const std::string& name) {
  EngineOptions o;
  o.model_dir = (fs::path(KILN_SOURCE_DIR) / "tests" / "fixtures" / "hf" / name).string();
  o.device = "cpu";
  return o;
}

TEST(TpRunnerMoveKv, EveryRankMovesItsShardInProcessAndByBroadcast) {
  const std::string fx = "qwen3_gqa2_d128_untied";  // 2 KV heads: one a rank at TP = 2
  const std::vector<int32_t> prompt = some_tokens(9, 4), next = {33};
  const std::vector<int64_t>& nodes = path_cases()[3].nodes;  // the overwrites
  std::vector<float> want;
  {
    TpRunnerOptions to;
    to.tp = 2;
    TpRunner y(fixture_opts(fx), to);
    y.allocate_kv(32, 1);
    y.forward(seq_step(prompt, 0, plain_ctx(10)), nullptr, nullptr);
    y.forward(seq_step(next, 9, plain_ctx(10)), &want, nullptr);
  }
  for (bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "broadcast commands" : "in process");
    TpRunnerOptions to;
    to.tp = 2;
    to.broadcast_commands = broadcast;
    TpRunner x(fixture_opts(fx), to);
    x.allocate_kv(32, 1);
    x.forward(seq_step(some_tokens(16, 6), 0, plain_ctx(16)), nullptr, nullptr);
    x.forward(seq_step(prompt, 0, path_ctx(nodes)), nullptr, nullptr);
    std::vector<std::vector<uint8_t>> before;
    for (int i = 0; i < x.local_ranks(); ++i) before.push_back(snapshot(x.rank_runner(i).cache()));
    // A bad move: a plain error (not a fatal one), no rank changed, the group still runs.
    try {
      x.move_kv(nodes, {6, 7, 8, 32});
      ADD_FAILURE() << "a slot out of range was accepted";
    } catch (const RunnerFatalError& e) {
      ADD_FAILURE() << "a bad move killed the group: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("to[3] = 32"), std::string::npos) << e.what();
    }
    for (int i = 0; i < x.local_ranks(); ++i)
      EXPECT_EQ(snapshot(x.rank_runner(i).cache()), before[size_t(i)]);
    std::vector<std::vector<std::vector<uint8_t>>> src(size_t(x.local_ranks()));
    for (int i = 0; i < x.local_ranks(); ++i)
      for (int64_t s : nodes) src[size_t(i)].push_back(slot_bytes(x.rank_runner(i).cache(), 1, s));
    x.move_kv(nodes, kPathSlots);
    for (int i = 0; i < x.local_ranks(); ++i)
      for (size_t j = 0; j < nodes.size(); ++j)
        EXPECT_EQ(slot_bytes(x.rank_runner(i).cache(), 1, kPathSlots[j]), src[size_t(i)][j])
            << "rank " << i << " move " << j;
    std::vector<float> got;
    x.forward(seq_step(next, 9, plain_ctx(10)), &got, nullptr);
    EXPECT_TRUE(same_bits(got, want));
  }
}

TEST(TpCommandMoveKv, RoundTrip) {
  TpCommand c;
  c.op = TpCommand::Op::move_kv;
  c.move_from = {8, 7, 6, 5};
  c.move_to = {5, 6, 7, 8};
  const std::string p = tp_encode(c), h = tp_header(c, p.size());
  const TpCommand d = tp_decode(h.data(), p.data(), p.size());
  EXPECT_EQ(d.op, TpCommand::Op::move_kv);
  EXPECT_EQ(d.move_from, c.move_from);
  EXPECT_EQ(d.move_to, c.move_to);
  EXPECT_THROW(tp_decode(h.data(), p.data(), p.size() - 8), Error);
}

}  // namespace
}  // namespace kiln
