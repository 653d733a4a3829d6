// The runner-level pieces of EAGLE tree drafting, on the CPU backend:
//   - ModelRunner::move_kv: every slot read before any is written (chains, swaps, fan-out), other slots and
//   the
//     fp8 scales as they should be, byte for byte; a decode step over the moved slots gives the logits of a
//     step whose rows were written there in the first place, bit for bit (bf16 and fp8 caches, NHD and HND;
//     the EAGLE-3 draft's cache moves with the target's); bad moves are errors naming the index that change
//     nothing; FakeRunner moves its (token, position) slots; the tensor-parallel runner moves every rank's
//     shard (in process and by broadcast command) and survives a bad move; the default refuses by name.
//   - EAGLE-3 top-k: Out::topk_* against a brute-force ranking of the draft's own logits, entry 0 the top-1,
//     log-probabilities bitwise the header's f32 order and within f32 rounding of fp64; ties and NaN;
//     set_topk's bounds; the runner's set_draft_topk.
//   - EAGLE-3 token trees: a draft pass over a tree's frontier gives each row, bit for bit, what a chain pass
//     over its path gives (needs the CPU attention's tree masks).
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
#include "runtime/fake_runner.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_command.h"
#include "runtime/tp_runner.h"
#include "tiny_model_config.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 301, kHidden = 96, kDraftVocab = 40;

fs::path scratch() {
  return test_support::process_scratch_dir("runner_tree_ops");
}

// head_dim 64: an fp8 cache works too.
ModelConfig tiny_config() {  // test_model's shape, 3 layers, this file's vocabulary and width
  ModelConfig c = test::tiny_cpu_config(true);
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.num_layers = 3;
  return c;
}

std::unique_ptr<Qwen3Model> tiny_model() {
  LoadOptions o;
  o.seed = 7;
  return Qwen3Model::create(tiny_config(), nullptr, o);
}

// A random draft for the tiny target, written once per process (draft_vocab 40 here; d2t: id -> 2 id + 1).
std::string draft_dir(int64_t draft_vocab = kDraftVocab) {
  const fs::path d = scratch() / ("draft_" + std::to_string(draft_vocab));
  if (!fs::exists(d / "model.safetensors")) {
    test::write_eagle3_draft(d, test::small_draft_shape(kHidden, kVocab, draft_vocab, "[0, 1, 2]", true));
  }
  return d.string();
}

std::unique_ptr<Qwen3Runner> make_runner(DType kv, ops::KvLayout layout, bool draft, int32_t pages = 64,
                                         int32_t page_size = 1) {
  auto model = tiny_model();
  std::unique_ptr<Eagle3Model> d = draft ? Eagle3Model::load(draft_dir(), *model) : nullptr;
  auto r = std::make_unique<Qwen3Runner>(std::move(model), layout, kv);
  if (d) r->set_draft(std::move(d));
  r->allocate_kv(pages, page_size);
  return r;
}

using test::seq_step;

// Positions 0 .. n - 1 in place: position p at slot 1 + p (slot 0 is the pool's null page, which FakeRunner
// refuses to read).
std::vector<int64_t> plain_ctx(int64_t n) {
  return test::consecutive_slots(n, 1);
}

std::vector<int32_t> some_tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((seed * 37 + i * 101 + 5) % kVocab));
  return t;
}

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

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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
      const std::string msg = message_of([&] { r->move_kv(b.from, b.to); });
      EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
      EXPECT_EQ(snapshot(r->cache()), before) << b.says;
    }
  }
  auto fresh = std::make_unique<Qwen3Runner>(tiny_model(), ops::KvLayout::nhd, DType::bf16);
  EXPECT_NE(message_of([&] { fresh->move_kv({0}, {1}); }).find("allocate_kv was not called"),
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
  EXPECT_NE(message_of([&] { p.move_kv({0}, {1}); }).find("this model runner cannot move KV slots"),
            std::string::npos);
  EXPECT_NO_THROW(p.set_draft_topk(1));
  EXPECT_NE(message_of([&] { p.set_draft_topk(2); }).find("no EAGLE-3 top-k drafting"), std::string::npos);
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

// ---------------------------------------------------------------------------------------------------------
// EAGLE-3 top-k

// The ranking key of eagle3_topk and ops::argmax_rows: NaN as -inf.
float rank_key(float x) {
  return x == x ? x : -std::numeric_limits<float>::infinity();
}

// Out::topk_* of R rows against a brute force over Out::logits: a full sort by (logit desc, id asc), and the
// log-softmax in fp64 (within f32 rounding) and in the header's f32 order (bitwise). Counts tied pairs seen
// inside the top k + 1.
int check_topk(const Eagle3Model::Out& o, int k, int64_t Dv) {
  const int64_t R = int64_t(o.tokens.size());
  EXPECT_EQ(o.logits.size(), size_t(R * Dv));
  EXPECT_EQ(o.topk_tokens.size(), size_t(R * k));
  EXPECT_EQ(o.topk_logprobs.size(), size_t(R * k));
  int ties = 0;
  for (int64_t r = 0; r < R; ++r) {
    const float* x = o.logits.data() + r * Dv;
    std::vector<int32_t> ids(static_cast<size_t>(Dv));
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return rank_key(x[a]) > rank_key(x[b]) || (rank_key(x[a]) == rank_key(x[b]) && a < b);
    });
    for (int i = 0; i < k && i + 1 < Dv; ++i) ties += x[ids[size_t(i)]] == x[ids[size_t(i + 1)]] ? 1 : 0;
    double mx = -INFINITY;
    for (int64_t j = 0; j < Dv; ++j) mx = std::max(mx, double(x[j]));
    double sum = 0;
    for (int64_t j = 0; j < Dv; ++j) sum += std::exp(double(x[j]) - mx);
    const float m = x[ids[0]];
    float s = 0.0f;
    for (int64_t j = 0; j < Dv; ++j) s += std::exp(x[j] - m);
    EXPECT_EQ(o.topk_tokens[size_t(r * k)], o.tokens[size_t(r)])
        << "row " << r << ": entry 0 is not the top-1";
    for (int i = 0; i < k; ++i) {
      const int32_t id = ids[size_t(i)];
      EXPECT_EQ(o.topk_tokens[size_t(r * k + i)], 2 * id + 1) << "row " << r << " entry " << i;
      const float got = o.topk_logprobs[size_t(r * k + i)];
      const double lp = double(x[id]) - mx - std::log(sum);
      EXPECT_NEAR(got, lp, 1e-5 * std::max(1.0, std::fabs(lp))) << "row " << r << " entry " << i;
      const float f32 = (x[id] - m) - std::log(s);
      EXPECT_EQ(std::memcmp(&got, &f32, 4), 0)
          << "row " << r << " entry " << i << ": " << got << " vs " << f32;
      if (i > 0) {
        EXPECT_LE(got, o.topk_logprobs[size_t(r * k + i - 1)]);
      }
    }
  }
  return ties;
}

struct DraftFixture {
  std::unique_ptr<Qwen3Model> target = tiny_model();
  std::unique_ptr<Eagle3Model> draft;
  std::vector<bf16_t> feat;
  Tensor features;
  DraftFixture(int64_t T, int32_t pages = 16, int32_t page_size = 4) {
    draft = Eagle3Model::load(draft_dir(), *target);
    draft->allocate_kv(pages, page_size, ops::KvLayout::nhd);
    feat = test_support::random_bf16(size_t(T * 3 * kHidden), 21, -1.5f, 1.5f);
    features = Tensor(feat.data(), DType::bf16, {T, 3 * kHidden}, Device::cpu());
  }
};

// Two sequences of 7 and 5 rows, every row a logit row.
BatchDesc two_sequences() {
  BatchDesc b;
  b.page_size = 4;
  b.pages_stride = 2;
  b.cu_q = {0};
  for (int32_t s = 0; s < 2; ++s) {
    const int32_t n = s == 0 ? 7 : 5;
    for (int32_t p = 0; p < n; ++p) {
      b.tokens.push_back(int32_t((s * 53 + p * 29 + 3) % kVocab));
      b.positions.push_back(p);
      b.slot_mapping.push_back(int64_t(1 + 2 * s + p / 4) * 4 + p % 4);
      b.logit_rows.push_back(b.cu_q.back() + p);
    }
    b.cu_q.push_back(b.cu_q.back() + n);
    b.kv_lens.push_back(n);
    b.page_table.insert(b.page_table.end(), {1 + 2 * s, 2 + 2 * s});
  }
  return b;
}

TEST(Eagle3TopK, RanksTheDraftLogitsAndEntryZeroIsTheTopOne) {
  DraftFixture fx(12);
  const BatchDesc b = two_sequences();
  std::vector<int32_t> rows(12);
  std::iota(rows.begin(), rows.end(), 0);
  fx.draft->set_return_logits(true);
  Eagle3Model::Out top1;
  fx.draft->forward_features(b, fx.features, rows, &top1);
  EXPECT_EQ(fx.draft->topk(), 1);
  EXPECT_TRUE(top1.topk_tokens.empty() && top1.topk_logprobs.empty()) << "k = 1 fills no top-k";
  ASSERT_EQ(top1.logits.size(), size_t(12 * kDraftVocab));
  int ties = 0;
  for (int k : {2, 5, 16}) {
    SCOPED_TRACE("k " + std::to_string(k));
    fx.draft->set_topk(k);
    Eagle3Model::Out o;
    o.topk_tokens.assign(999, -7);  // poison: the pass must size and fill them
    o.topk_logprobs.assign(999, NAN);
    fx.draft->forward_features(b, fx.features, rows, &o);
    EXPECT_EQ(o.tokens, top1.tokens) << "top-k changed the top-1 tokens";
    EXPECT_TRUE(same_bits(o.hidden, top1.hidden));
    EXPECT_TRUE(same_bits(o.logits, top1.logits));
    ties += check_topk(o, k, kDraftVocab);
    // A chain row (forward_hidden) ranks too.
    Eagle3Model::Out h;
    const std::vector<float> last(o.hidden.begin() + 6 * 64, o.hidden.begin() + 7 * 64);
    fx.draft->forward_hidden(test::one_sequence_batch({o.tokens[6]}, 7, {0}, 4), last, &h);
    check_topk(h, k, kDraftVocab);
  }
  std::printf("  %d tied neighbours inside the top k (bf16-rounded logits)\n", ties);
  // Without return_logits the top k still comes (its logits stay inside).
  fx.draft->set_return_logits(false);
  Eagle3Model::Out o;
  fx.draft->forward_features(b, fx.features, rows, &o);
  EXPECT_TRUE(o.logits.empty());
  EXPECT_EQ(o.topk_tokens.size(), size_t(12 * 16));
}

// Planted ties, NaN and -inf through eagle3_topk directly; entry 0 against ops::argmax_rows on the same rows.
TEST(Eagle3TopK, TiesGoToTheLowerIdAndNanRanksAsMinusInf) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t Dv = 6;
  const std::vector<float> x = {
      1.0f, 3.0f, 3.0f,
      2.0f, 3.0f, 0.5f,  // three equal maxima: 1, 2, 4
      nan,  -1.f, nan,
      5.0f, -inf, -1.f,  // NaN as -inf: 3, 1, 5, then 0, 2 and 4 (-inf, NaN, -inf tie by id)
      -inf, nan,  -inf,
      nan,  -inf, -inf,  // nothing above -inf: ids ascending
  };
  const std::vector<int64_t> d2t = {10, 10, 10, 10, 10, 10};
  const int k = 6;
  std::vector<int32_t> tok(3 * k);
  std::vector<float> lp(3 * k);
  eagle3_topk(x.data(), 3, Dv, k, d2t.data(), tok.data(), lp.data());
  const std::vector<int32_t> want = {11, 12, 14, 13, 10, 15, 13, 11, 15, 10, 12, 14, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(tok, want);
  std::vector<int32_t> arg(3);
  ops::argmax_rows(Tensor(const_cast<float*>(x.data()), DType::f32, {3, Dv}, Device::cpu()),
                   Tensor(const_cast<int64_t*>(d2t.data()), DType::i64, {Dv}, Device::cpu()),
                   Tensor(arg.data(), DType::i32, {3}, Device::cpu()));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(tok[size_t(r * k)], arg[size_t(r)]) << "row " << r;
  // Row 0's equal logits get equal log-probabilities, which sum with the rest to 1.
  EXPECT_EQ(lp[0], lp[1]);
  EXPECT_EQ(lp[1], lp[2]);
  double total = 0;
  for (int i = 0; i < k; ++i) total += std::exp(double(lp[size_t(i)]));
  EXPECT_NEAR(total, 1.0, 1e-6);
  for (int i = 0; i < k; ++i) EXPECT_TRUE(std::isnan(lp[size_t(k + i)])) << "a row with NaN: NaN log-probs";
  EXPECT_THROW(eagle3_topk(x.data(), 1, Dv, 7, d2t.data(), tok.data(), lp.data()), Error);
}

TEST(Eagle3TopK, SetTopkBoundsAndTheRunnersPlumbing) {
  DraftFixture fx(1);
  for (int bad : {0, -1, 17})
    EXPECT_NE(message_of([&] { fx.draft->set_topk(bad); }).find("must be in [1, 16]"), std::string::npos)
        << bad;
  EXPECT_EQ(fx.draft->topk(), 1);
  EXPECT_NO_THROW(fx.draft->set_topk(16));
  EXPECT_NO_THROW(fx.draft->set_topk(1));
  auto small = Eagle3Model::load(draft_dir(8), *fx.target);
  EXPECT_NE(message_of([&] { small->set_topk(9); }).find("exceeds the draft vocabulary of 8"),
            std::string::npos);
  EXPECT_NO_THROW(small->set_topk(8));

  auto plain = make_runner(DType::bf16, ops::KvLayout::nhd, false);
  EXPECT_NO_THROW(plain->set_draft_topk(1));
  EXPECT_THROW(plain->set_draft_topk(2), Error);
  auto r = make_runner(DType::bf16, ops::KvLayout::nhd, true);
  EXPECT_THROW(r->set_draft_topk(17), Error);
  r->set_draft_topk(4);
  ModelRunner::DraftOut o;
  r->draft_from_hidden(seq_step({5, 9}, 0, plain_ctx(2)), std::vector<float>(2 * 64, 0.25f), &o);
  ASSERT_EQ(o.tokens.size(), 1u);
  ASSERT_EQ(o.topk_tokens.size(), 4u);
  ASSERT_EQ(o.topk_logprobs.size(), 4u);
  EXPECT_EQ(o.topk_tokens[0], o.tokens[0]);
  for (int i = 1; i < 4; ++i) EXPECT_LE(o.topk_logprobs[size_t(i)], o.topk_logprobs[size_t(i - 1)]);
  r->set_draft_topk(1);
  r->draft_from_hidden(seq_step({5, 9}, 0, plain_ctx(2)), std::vector<float>(2 * 64, 0.25f), &o);
  EXPECT_TRUE(o.topk_tokens.empty());
}

// ---------------------------------------------------------------------------------------------------------
// EAGLE-3 token trees (page size 4; position p in page 1 + p / 4)

// A pass of one sequence: rows at `positions` (rope) written at context positions kv_len - n .. kv_len - 1, a
// tree window of W (0: causal) with the rows' masks, every row a logit row.
BatchDesc tree_pass(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, int32_t kv_len,
                    int32_t W, const std::vector<uint64_t>& masks) {
  BatchDesc b;
  b.page_size = 4;
  const int32_t n = int32_t(tokens.size());
  for (int32_t j = 0; j < n; ++j) {
    const int32_t ctx = kv_len - n + j;
    b.tokens.push_back(tokens[size_t(j)]);
    b.positions.push_back(positions[size_t(j)]);
    b.slot_mapping.push_back(int64_t(1 + ctx / 4) * 4 + ctx % 4);
    b.logit_rows.push_back(j);
  }
  b.cu_q = {0, n};
  b.kv_lens = {kv_len};
  b.seq_ids = {1};
  b.pages_stride = (kv_len + 3) / 4;
  for (int32_t p = 0; p < b.pages_stride; ++p) b.page_table.push_back(1 + p);
  if (W > 0) {
    b.tree_window = {W};
    b.tree_mask = masks;
  }
  return b;
}

// A tree below the last history row (position 5): depth 1 nodes 0, 1; depth 2 nodes 2, 3 (children of 0) and
// 4 (of 1); depth 3 node 5 (of 3). Node i sits at window index i (context position 6 + i). Pass d drafts
// depth d's nodes from their parents' outputs. A chain pass over each node's path (its ancestors at positions
// 6 .., written in place) must give the node's row the same bits: outputs and top-1 token.
TEST(Eagle3Tree, FrontierRowsGetTheOutputsOfAChainOverTheirPath) {
  const int32_t n_hist = 6;
  DraftFixture tree(n_hist), chain(n_hist);
  const std::vector<int32_t> hist_tokens = some_tokens(n_hist, 5);
  std::vector<int32_t> rows(static_cast<size_t>(n_hist));
  std::iota(rows.begin(), rows.end(), 0);
  Eagle3Model::Out h1, h2;
  tree.draft->forward_features(tree_pass(hist_tokens, {0, 1, 2, 3, 4, 5}, n_hist, 0, {}), tree.features, rows,
                               &h1);
  chain.draft->forward_features(tree_pass(hist_tokens, {0, 1, 2, 3, 4, 5}, n_hist, 0, {}), chain.features,
                                rows, &h2);
  ASSERT_TRUE(same_bits(h1.hidden, h2.hidden));
  const int64_t H = 64;
  const std::vector<float> root(h1.hidden.end() - H, h1.hidden.end());

  const std::vector<int32_t> parent = {-1, -1, 0, 0, 1, 3}, depth = {1, 1, 2, 2, 2, 3};
  const std::vector<int32_t> token = {11, 42, 7, 99, 123, 250};
  std::vector<std::vector<float>> out(6);  // each node's midlayer output
  std::vector<int32_t> top1(6);
  const auto mask_of = [&](int32_t i) {
    uint64_t m = 0;
    for (int32_t a = i; a >= 0; a = parent[size_t(a)]) m |= uint64_t(1) << a;
    return m;
  };
  // Tree passes: depth d's nodes are the window's last rows; the window holds every node so far.
  for (int32_t d = 1, first = 0; d <= 3; ++d) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 6; ++i)
      if (depth[size_t(i)] == d) ids.push_back(i);
    ASSERT_EQ(ids.front(), first);
    const int32_t W = ids.back() + 1;
    std::vector<int32_t> toks, pos;
    std::vector<uint64_t> masks;
    std::vector<float> hidden;
    for (int32_t i : ids) {
      toks.push_back(token[size_t(i)]);
      pos.push_back(n_hist + d - 1);
      masks.push_back(mask_of(i));
      const std::vector<float>& in = parent[size_t(i)] < 0 ? root : out[size_t(parent[size_t(i)])];
      hidden.insert(hidden.end(), in.begin(), in.end());
    }
    Eagle3Model::Out o;
    tree.draft->forward_hidden(tree_pass(toks, pos, n_hist + W, W, masks), hidden, &o);
    for (size_t j = 0; j < ids.size(); ++j) {
      out[size_t(ids[j])].assign(o.hidden.begin() + int64_t(j) * H, o.hidden.begin() + int64_t(j + 1) * H);
      top1[size_t(ids[j])] = o.tokens[j];
    }
    first = W;
  }
  // Chain passes over each frontier node's path.
  for (int32_t leaf = 0; leaf < 6; ++leaf) {
    SCOPED_TRACE("node " + std::to_string(leaf));
    std::vector<int32_t> path;
    for (int32_t a = leaf; a >= 0; a = parent[size_t(a)]) path.insert(path.begin(), a);
    std::vector<int32_t> toks, pos;
    std::vector<float> hidden;
    for (size_t j = 0; j < path.size(); ++j) {
      toks.push_back(token[size_t(path[j])]);
      pos.push_back(n_hist + int32_t(j));
      const std::vector<float>& in = j == 0 ? root : out[size_t(path[j - 1])];
      hidden.insert(hidden.end(), in.begin(), in.end());
    }
    Eagle3Model::Out o;
    chain.draft->forward_hidden(tree_pass(toks, pos, n_hist + int32_t(path.size()), 0, {}), hidden, &o);
    for (size_t j = 0; j < path.size(); ++j) {
      const std::vector<float> row(o.hidden.begin() + int64_t(j) * H, o.hidden.begin() + int64_t(j + 1) * H);
      EXPECT_TRUE(same_bits(row, out[size_t(path[j])])) << "path row " << j << " (node " << path[j] << ")";
      EXPECT_EQ(o.tokens[j], top1[size_t(path[j])]) << "path row " << j;
    }
  }
}

// A chain of passes takes no tree.
TEST(Eagle3Tree, ChainPassesRefuseATree) {
  DraftFixture fx(1);
  BatchDesc b = tree_pass({3}, {0}, 1, 1, {1});
  std::vector<std::vector<int32_t>> tokens;
  EXPECT_NE(message_of([&] {
              fx.draft->forward_chain({b}, std::vector<float>(64, 0.0f), &tokens);
            }).find("take no token tree"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
