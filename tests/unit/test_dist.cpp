// The tensor-parallel plumbing that runs without GPUs (src/dist): LocalGroup's collectives (values against a
// sum computed here, the same bits on every rank, any thread timing), abort, and the TCP rendezvous that
// carries NCCL's unique id between nodes (loopback only).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "dist/local_comm.h"
#include "dist/nccl_comm.h"
#include "dist/rendezvous.h"
#include "dist/shard_plan.h"
#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln::dist {
namespace {

template <class Fn>
void on_ranks(int n, Fn fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back(fn, r);
  for (auto& t : th) t.join();
}

TEST(LocalGroup, AllReduceSumsInRankOrderSameBitsEverywhere) {
  for (int n : {1, 2, 3, 4}) {
    LocalGroup g(n);
    constexpr size_t kCount = 1001;  // not a multiple of the rank count
    std::vector<std::vector<float>> f{size_t(n), std::vector<float>(kCount)};
    std::vector<std::vector<bf16_t>> h{size_t(n), std::vector<bf16_t>(kCount)};
    std::mt19937 rng{uint32_t(n)};
    std::uniform_real_distribution<float> u(-3, 3);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < kCount; ++i) f[size_t(r)][i] = u(rng), h[size_t(r)][i] = f32_to_bf16(u(rng));
    std::vector<float> want_f(kCount);
    std::vector<bf16_t> want_h(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      float a = 0, b = 0;
      for (int r = 0; r < n; ++r) a += f[size_t(r)][i], b += bf16_to_f32(h[size_t(r)][i]);
      want_f[i] = a, want_h[i] = f32_to_bf16(b);
    }
    on_ranks(n, [&](int r) {
      std::this_thread::sleep_for(std::chrono::microseconds(200 * r));  // arrive in a different order
      g.comm(r).all_reduce_sum(f[size_t(r)].data(), kCount, ReduceType::f32);
      g.comm(r).all_reduce_sum(h[size_t(r)].data(), kCount, ReduceType::bf16);
    });
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(f[size_t(r)][i], want_f[i]) << "n " << n << " rank " << r << " i " << i;
        ASSERT_EQ(h[size_t(r)][i].bits, want_h[i].bits) << "n " << n << " rank " << r << " i " << i;
      }
  }
}

TEST(LocalGroup, BroadcastAndManyCollectivesInLockstep) {
  LocalGroup g(4);
  std::vector<std::vector<int>> v(4, std::vector<int>(16));
  on_ranks(4, [&](int r) {
    for (int step = 0; step < 200; ++step) {
      for (int i = 0; i < 16; ++i) v[size_t(r)][size_t(i)] = r == step % 4 ? step * 100 + i : -1;
      g.comm(r).broadcast(v[size_t(r)].data(), 16 * sizeof(int), step % 4);
      for (int i = 0; i < 16; ++i)
        if (v[size_t(r)][size_t(i)] != step * 100 + i) throw std::runtime_error("broadcast mismatch");
      float x = float(r + step);
      g.comm(r).all_reduce_sum(&x, 1, ReduceType::f32);
      if (x != float(6 + 4 * step)) throw std::runtime_error("all-reduce mismatch");
    }
  });
  EXPECT_EQ(g.size(), 4);
  EXPECT_THROW(g.comm(4), Error);
  EXPECT_THROW(LocalGroup(0), Error);
}

TEST(LocalGroup, AbortReleasesRanksWaitingForOneThatFailed) {
  LocalGroup g(3);
  std::atomic<int> threw{0};
  std::thread waiters[2];
  for (int r = 0; r < 2; ++r)
    waiters[r] = std::thread([&, r] {
      float x = 1;
      try {
        g.comm(r).all_reduce_sum(&x, 1, ReduceType::f32);
      } catch (const Error&) {
        ++threw;
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  g.abort();  // rank 2 failed before its collective
  for (auto& t : waiters) t.join();
  EXPECT_EQ(threw.load(), 2);
  float y = 0;
  EXPECT_THROW(g.comm(2).all_reduce_sum(&y, 1, ReduceType::f32), Error);
}

TEST(LocalGroup, AllGatherPlacesEveryRanksBlockInRankOrderAlsoInPlace) {
  for (int n : {1, 3, 4}) {
    LocalGroup g(n);
    constexpr size_t kBytes = 37;
    std::vector<std::vector<unsigned char>> out(size_t(n),
                                                std::vector<unsigned char>(kBytes * size_t(n), 0xee));
    on_ranks(n, [&](int r) {
      std::vector<unsigned char> mine(kBytes);
      for (size_t i = 0; i < kBytes; ++i) mine[i] = (unsigned char)(r * 50 + int(i));
      g.comm(r).all_gather(mine.data(), out[size_t(r)].data(), kBytes);
      // In place: the send block is the rank's own block of recv.
      std::vector<unsigned char> inplace(kBytes * size_t(n), 0xee);
      std::copy(mine.begin(), mine.end(), inplace.begin() + ptrdiff_t(kBytes) * r);
      g.comm(r).all_gather(inplace.data() + kBytes * size_t(r), inplace.data(), kBytes);
      if (inplace != out[size_t(r)]) throw std::runtime_error("in-place all-gather differs");
    });
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < kBytes; ++i)
          ASSERT_EQ(out[size_t(r)][size_t(q) * kBytes + i], (unsigned char)(q * 50 + int(i)))
              << "n " << n << " rank " << r << " block " << q;
  }
}

TEST(LocalGroup, InjectedFailureThrowsAtThatCollectiveAndAbortReleasesTheOthers) {
  LocalGroup g(3);
  g.fail_at(1, 4);  // rank 1's fifth collective
  std::vector<int> done(3, 0);
  std::vector<std::string> why(3);
  on_ranks(3, [&](int r) {
    try {
      for (int i = 0; i < 10; ++i) {
        float x = 1;
        g.comm(r).all_reduce_sum(&x, 1, ReduceType::f32);
        ++done[size_t(r)];
      }
    } catch (const Error& e) {
      why[size_t(r)] = e.what();
      g.comm(r).abort();  // what a failing rank's worker does
    }
  });
  EXPECT_EQ(done[1], 4);
  EXPECT_NE(why[1].find("injected failure: rank 1 all-reduce #4"), std::string::npos) << why[1];
  for (int r : {0, 2}) {
    EXPECT_EQ(done[size_t(r)], 4);
    EXPECT_NE(why[size_t(r)].find("aborted by another rank"), std::string::npos) << why[size_t(r)];
  }
  EXPECT_TRUE(g.aborted());
}

TEST(Rendezvous, NodeZeroHandsItsBlobToEveryPeer) {
  RendezvousServer server("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  std::string blob(128, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = char(i * 7);
  std::vector<std::string> got(3);
  std::vector<std::thread> peers;
  for (int i = 0; i < 3; ++i)
    peers.emplace_back([&, i] { got[size_t(i)] = rendezvous_fetch("127.0.0.1", server.port(), 10.0); });
  server.serve(blob, 3, 10.0);
  for (auto& t : peers) t.join();
  for (const auto& g : got) EXPECT_EQ(g, blob);
}

TEST(Rendezvous, ExchangeBlobWithNodeZeroStartingLast) {
  int port = 0;
  {
    RendezvousServer probe("127.0.0.1", 0);  // a free port for this test, released at once
    port = probe.port();
  }
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  std::string got;
  std::thread peer([&] { got = exchange_blob(addr, 2, 1, "", 10.0); });  // retries until node 0 listens
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(exchange_blob(addr, 2, 0, "nccl-id", 10.0), "nccl-id");
  peer.join();
  EXPECT_EQ(got, "nccl-id");
  EXPECT_EQ(exchange_blob("unused:1", 1, 0, "x", 1.0), "x");  // one node: nothing travels
}

TEST(Rendezvous, BadInputAndDeadlinesAreClearErrors) {
  std::string host;
  int port = 0;
  parse_dist_addr("[::1]:5000", &host, &port);
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 5000);
  EXPECT_THROW(parse_dist_addr("localhost", &host, &port), Error);
  EXPECT_THROW(parse_dist_addr("localhost:0", &host, &port), Error);
  EXPECT_THROW(parse_dist_addr("localhost:70000", &host, &port), Error);
  EXPECT_THROW(parse_dist_addr("localhost:12a", &host, &port), Error);
  EXPECT_THROW(exchange_blob("127.0.0.1:5000", 2, 2, "", 1.0), Error);
  int closed = 0;
  {
    RendezvousServer probe("127.0.0.1", 0);
    closed = probe.port();
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(rendezvous_fetch("127.0.0.1", closed, 0.3), Error);  // nobody listens
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  RendezvousServer lonely("127.0.0.1", 0);
  EXPECT_THROW(lonely.serve("x", 1, 0.2), Error);  // no peer comes
}

ModelConfig shape(int64_t hq, int64_t hkv, int64_t inter, int64_t vocab) {
  ModelConfig c;
  c.num_heads = hq, c.num_kv_heads = hkv, c.intermediate_size = inter, c.vocab_size = vocab, c.head_dim = 128;
  return c;
}

TEST(ShardPlan, PartitionsHeadsMlpAndVocabAndReplicatesKvHeadsPastTheirCount) {
  for (const ModelConfig& c :
       {shape(32, 8, 9728, 151936), shape(16, 8, 3072, 151936), shape(64, 8, 25600, 151936)})
    for (int tp : {1, 2, 4, 8, 16}) {
      if (c.num_heads % tp) continue;
      int64_t q = 0, inter = 0, vocab = 0;
      std::vector<int> kv_users(size_t(c.num_kv_heads), 0);
      for (int r = 0; r < tp; ++r) {
        const ShardPlan p = make_shard_plan(c, tp, r);
        EXPECT_EQ(p.q_heads.begin, q) << tp << " " << r;  // contiguous, in rank order
        q = p.q_heads.end;
        EXPECT_EQ(p.intermediate.begin, inter);
        inter = p.intermediate.end;
        EXPECT_EQ(p.vocab.begin, vocab);
        vocab = p.vocab.end;
        // Every query head of the rank uses a KV head the rank holds.
        const int64_t group = c.num_heads / c.num_kv_heads;
        EXPECT_GE(p.q_heads.begin / group, p.kv_heads.begin);
        EXPECT_LT((p.q_heads.end - 1) / group, p.kv_heads.end);
        for (int64_t h = p.kv_heads.begin; h < p.kv_heads.end; ++h) ++kv_users[size_t(h)];
        EXPECT_EQ(p.kv_replicas, tp > c.num_kv_heads ? tp / c.num_kv_heads : 1);
        EXPECT_EQ(p.q_rows(128), (Range{p.q_heads.begin * 128, p.q_heads.end * 128}));
      }
      EXPECT_EQ(q, c.num_heads);
      EXPECT_EQ(inter, c.intermediate_size);
      EXPECT_EQ(vocab, c.vocab_size);
      for (int u : kv_users) EXPECT_EQ(u, tp > c.num_kv_heads ? tp / c.num_kv_heads : 1) << "tp " << tp;
    }
  EXPECT_THROW(make_shard_plan(shape(32, 8, 9728, 100), 3, 0), Error);   // heads
  EXPECT_THROW(make_shard_plan(shape(48, 6, 9216, 100), 8, 0), Error);   // tp above kv heads, not a multiple
  EXPECT_THROW(make_shard_plan(shape(32, 8, 9730, 100), 4, 0), Error);   // intermediate
  EXPECT_THROW(make_shard_plan(shape(32, 8, 9728, 100), 2, 2), Error);   // rank
  const ShardPlan last = make_shard_plan(shape(32, 8, 9728, 10), 4, 3);  // ceil(10 / 4) = 3 rows each
  EXPECT_EQ(last.vocab, (Range{9, 10}));
}

// Qwen3-30B-A3B's sparse MLP: each expert's 768 intermediate rows split (TP), or 128 / tp whole experts (EP).
TEST(ShardPlan, MoeExpertsSplitByIntermediateOrPlacedWhole) {
  ModelConfig c = shape(32, 4, 6144, 151936);
  c.num_layers = 48;
  c.moe.num_experts = 128, c.moe.num_experts_per_tok = 8, c.moe.moe_intermediate_size = 768;
  c.moe.decoder_sparse_step = 1;
  for (int tp : {2, 4, 8}) {
    int64_t mi = 0, ex = 0;
    for (int r = 0; r < tp; ++r) {
      const ShardPlan t = make_shard_plan(c, tp, r), e = make_shard_plan(c, tp, r, /*expert_parallel=*/true);
      EXPECT_EQ(t.experts, (Range{0, 128}));
      EXPECT_EQ(t.moe_intermediate, (Range{mi, mi + 768 / tp}));
      mi = t.moe_intermediate.end;
      EXPECT_EQ(e.moe_intermediate, (Range{0, 768}));
      EXPECT_EQ(e.experts, (Range{ex, ex + 128 / tp}));
      ex = e.experts.end;
    }
    EXPECT_EQ(mi, 768);
    EXPECT_EQ(ex, 128);
  }
  c.moe.num_experts = 6;
  EXPECT_THROW(make_shard_plan(c, 4, 0, true), Error);  // 6 experts over 4 ranks
  c.moe.moe_intermediate_size = 770;
  EXPECT_THROW(make_shard_plan(c, 4, 0), Error);                              // 770 / 4
  EXPECT_THROW(make_shard_plan(shape(32, 8, 9728, 100), 2, 0, true), Error);  // EP without experts
}

TEST(ShardPlan, RowAndColumnSlicesOfAStridedTensor) {
  std::vector<uint16_t> w(5 * 8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(i);
  const Tensor t = Tensor::strided(w.data(), DType::bf16, {5, 6}, {8, 1});  // rows padded to 8
  std::vector<uint16_t> rows(2 * 6), cols(5 * 2);
  copy_rows(t, {1, 3}, rows.data());
  copy_cols(t, {2, 4}, cols.data());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 6; ++j) EXPECT_EQ(rows[size_t(i * 6 + j)], (1 + i) * 8 + j);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(cols[size_t(i * 2 + j)], i * 8 + 2 + j);
  EXPECT_THROW(copy_rows(t, {4, 6}, rows.data()), Error);
  EXPECT_THROW(copy_cols(t, {3, 2}, cols.data()), Error);
}

TEST(Nccl, FactoriesSayWhetherTheBuildHasNccl) {
  if (!nccl_available()) {
    EXPECT_THROW(nccl_unique_id(), Error);
    return;
  }
  EXPECT_EQ(nccl_unique_id().size(), 128u);  // ncclUniqueId: 128 bytes, no GPU needed
}

}  // namespace
}  // namespace kiln::dist
