// Token-tree paged attention on CUDA (ops/attention.h tree_window / tree_mask; ops/cuda/attention.h): random
// trees (several sequences, windows wider than q_len as in a draft pass, arbitrary masks, causal decode and
// prefill rows beside them, GQA groups 1 / 4 / 6 / 8, bf16 and fp8 caches, NHD and HND, pages of 16 and 32
// rows, split and unsplit tree launches) against the CPU reference on the same inputs and against fp64, each
// within the contract's 2^-7; chain masks against the causal CUDA call; the causal rows of a tree call
// bitwise the same call without tree fields; the dispatcher's checks of the fields on CUDA; and the whole
// model: a CUDA Qwen3Model's tree verify step and draft passes (a prefill chunk and a plain decode beside the
// tree) against the CPU model on the same random weights. Outputs start as NaN, and cache rows and page-table
// entries no sequence owns are NaN / garbage, so a row left unwritten or a stray read shows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../unit/tree_test_util.h"
#include "common/model_steps.h"
#include "kiln/batch.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"
#include "ops/fp8.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"

namespace kiln {
namespace {

using ops::KvLayout;

constexpr uint16_t kPoisonBits = 0x7fc1;  // a bf16 NaN
const double kTolerance = std::ldexp(1.0, -7);

using Problem = test::TreeProblem;
using SeqSpec = test::TreeSeqSpec;

// The tree problem of the specs (test::tree_problem_fields), then K, V from the same generator and bf16
// queries from seed + 1.
Problem tree_problem(const std::vector<SeqSpec>& specs, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed,
                     bool chain = false) {
  std::mt19937 rng(seed);
  Problem p = test::tree_problem_fields(specs, Hq, Hkv, D, rng, chain);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int32_t kv : p.kv_lens) {
    std::vector<float> k(size_t(kv * p.Hkv * p.D)), v(k.size());
    for (auto& x : k) x = 2.0f * u(rng);  // keys spread the scores so the softmax is not flat
    for (auto& x : v) x = u(rng);
    p.k.push_back(std::move(k));
    p.v.push_back(std::move(v));
  }
  p.q = test::random_bf16(size_t(p.T() * p.Hq * p.D), seed + 1);
  return p;
}

// Every kind of sequence: a verify tree over a cached prefix, plain decode and prefill rows, draft passes
// whose window holds earlier entries already cached (W > q_len), the widest window, a window that is the
// whole context, arbitrary masks, an empty sequence, and trees over contexts long enough to be split.
std::vector<SeqSpec> mixed_specs() {
  return {{7, 19, 7},        {1, 30, 0}, {5, 40, 13}, {3, 9, 0},  {64, 70, 64}, {4, 4, 4},    {37, 90, 0},
          {6, 25, 20, true}, {0, 5, 0},  {2, 60, 55}, {1, 12, 9}, {9, 700, 30}, {16, 400, 16}};
}

// The problem's K/V in a paged cache of `dtype` (bf16, or fp8 e4m3 with a UE8M0 scale per 64 elements): pages
// shuffled over 1 .. num_pages - 2, pages 0 and num_pages - 1 never written (NaN), page-table entries past a
// sequence's length garbage (-1, 0, num_pages - 1, num_pages + 7). kf / vf: the values as stored.
struct HostCache {
  DType dtype = DType::bf16;
  KvLayout layout = KvLayout::nhd;
  int page_size = 16;
  int64_t num_pages = 0, pages_stride = 0;
  std::vector<uint8_t> k, v, ks, vs;  // raw elements; fp8 scales
  std::vector<int32_t> page_table;
  std::vector<std::vector<float>> kf, vf;
  int64_t elem_bytes() const { return dtype == DType::bf16 ? 2 : 1; }
};

HostCache build_cache(const Problem& p, DType dtype, KvLayout layout, int page_size, uint32_t seed) {
  HostCache c;
  c.dtype = dtype, c.layout = layout, c.page_size = page_size;
  int64_t used = 0;
  for (int32_t l : p.kv_lens) {
    const int64_t n = (l + page_size - 1) / page_size;
    used += n;
    c.pages_stride = std::max(c.pages_stride, n + 1);
  }
  c.num_pages = used + 2;
  std::vector<int32_t> perm(static_cast<size_t>(used));
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  const int32_t garbage[4] = {-1, 0, int32_t(c.num_pages - 1), int32_t(c.num_pages + 7)};
  c.page_table.assign(size_t(p.B() * c.pages_stride), 0);
  for (int64_t b = 0, next = 0; b < p.B(); ++b)
    for (int64_t i = 0; i < c.pages_stride; ++i)
      c.page_table[size_t(b * c.pages_stride + i)] =
          i * page_size < p.kv_lens[size_t(b)] ? perm[size_t(next++)] : garbage[(b + i) % 4];
  const int64_t elems = c.num_pages * page_size * p.Hkv * p.D;
  const bool fp8 = dtype == DType::f8e4m3;
  c.k.assign(size_t(elems * c.elem_bytes()), fp8 ? 0x7f : 0);  // e4m3 0x7f: NaN
  c.v = c.k;
  if (!fp8) {
    for (int64_t e = 0; e < elems; ++e) {
      std::memcpy(c.k.data() + 2 * e, &kPoisonBits, 2);
      std::memcpy(c.v.data() + 2 * e, &kPoisonBits, 2);
    }
  } else {
    c.ks.assign(size_t(elems / 64), 127);
    c.vs = c.ks;
  }
  for (int64_t b = 0; b < p.B(); ++b) {
    c.kf.emplace_back(p.k[size_t(b)].size());
    c.vf.emplace_back(p.v[size_t(b)].size());
    for (int64_t j = 0; j < p.kv_lens[size_t(b)]; ++j) {
      const int64_t page = c.page_table[size_t(b * c.pages_stride + j / page_size)], row = j % page_size;
      for (int64_t h = 0; h < p.Hkv; ++h) {
        const int64_t base = layout == KvLayout::nhd ? ((page * page_size + row) * p.Hkv + h) * p.D
                                                     : ((page * p.Hkv + h) * page_size + row) * p.D;
        const size_t src = size_t((j * p.Hkv + h) * p.D);
        for (int which = 0; which < 2; ++which) {
          const float* in = (which == 0 ? p.k : p.v)[size_t(b)].data() + src;
          float* stored = (which == 0 ? c.kf : c.vf)[size_t(b)].data() + src;
          std::vector<uint8_t>& bytes = which == 0 ? c.k : c.v;
          if (!fp8) {
            for (int64_t d = 0; d < p.D; ++d) {
              const bf16_t x = f32_to_bf16(in[d]);
              std::memcpy(bytes.data() + 2 * (base + d), &x.bits, 2);
              stored[d] = bf16_to_f32(x);
            }
            continue;
          }
          std::vector<uint8_t>& sc = which == 0 ? c.ks : c.vs;
          for (int64_t blk = 0; blk < p.D / 64; ++blk) {
            float amax = 0;
            for (int64_t d = blk * 64; d < blk * 64 + 64; ++d) amax = std::max(amax, std::fabs(in[d]));
            const int e = e4m3_block_exponent(amax);
            sc[size_t(base / 64 + blk)] = ue8m0_from_exponent(e);
            for (int64_t d = blk * 64; d < blk * 64 + 64; ++d) {
              bytes[size_t(base + d)] = f32_to_e4m3(in[d] * exp2_neg(e));
              stored[d] = e4m3_to_f32(bytes[size_t(base + d)]) * ue8m0_to_f32(sc[size_t(base / 64 + blk)]);
            }
          }
        }
      }
    }
  }
  return c;
}

// The attention's inputs on one device: host vectors (CPU) or device copies of them (CUDA).
struct Call {
  std::vector<int32_t> cu, windows;
  std::vector<int64_t> masks;
  std::vector<Buffer> bufs;  // CUDA: the device copies
  ops::PagedAttentionArgs a;
  Tensor out;
  Buffer out_buf;
  std::vector<bf16_t> out_host;
};

// A view of `bytes` host bytes on `dev`: the host vector itself, or a device copy kept in `call`.
void* place(Call& call, Device dev, const void* host, size_t bytes) {
  if (dev.is_cpu()) return const_cast<void*>(host);
  call.bufs.emplace_back(std::max<size_t>(bytes, 16), dev);
  if (bytes) copy_bytes(call.bufs.back().data(), dev, host, Device::cpu(), bytes);
  return call.bufs.back().data();
}

void prepare(const Problem& p, const HostCache& c, Device dev, bool tree, Call& call) {
  const int64_t T = p.T(), B = p.B(), Hkv = p.Hkv, D = p.D, ps = c.page_size, P = c.num_pages;
  call.cu.assign(size_t(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) call.cu[size_t(b + 1)] = call.cu[size_t(b)] + p.q_lens[size_t(b)];
  ops::PagedAttentionArgs& a = call.a;
  a.q = Tensor(place(call, dev, p.q.data(), p.q.size() * 2), DType::bf16, {T, p.Hq, D}, dev);
  const bool nhd = c.layout == KvLayout::nhd;
  const std::vector<int64_t> shape =
      nhd ? std::vector<int64_t>{P, ps, Hkv, D} : std::vector<int64_t>{P, Hkv, ps, D};
  const std::vector<int64_t> sc_shape =
      nhd ? std::vector<int64_t>{P, ps, Hkv, D / 64} : std::vector<int64_t>{P, Hkv, ps, D / 64};
  const auto tensor4 = [&](const std::vector<uint8_t>& v, DType dt, const std::vector<int64_t>& s) {
    return Tensor(place(call, dev, v.data(), v.size()), dt, {s[0], s[1], s[2], s[3]}, dev);
  };
  a.cache.layout = c.layout;
  a.cache.page_size = c.page_size;
  a.cache.k = tensor4(c.k, c.dtype, shape);
  a.cache.v = tensor4(c.v, c.dtype, shape);
  if (c.dtype == DType::f8e4m3) {
    a.cache.k_scale = tensor4(c.ks, DType::u8, sc_shape);
    a.cache.v_scale = tensor4(c.vs, DType::u8, sc_shape);
  }
  a.cu_q = Tensor(place(call, dev, call.cu.data(), call.cu.size() * 4), DType::i32, {B + 1}, dev);
  a.kv_lens = Tensor(place(call, dev, p.kv_lens.data(), p.kv_lens.size() * 4), DType::i32, {B}, dev);
  a.page_table = Tensor(place(call, dev, c.page_table.data(), c.page_table.size() * 4), DType::i32,
                        {B, c.pages_stride}, dev);
  a.scale = 1.0f / std::sqrt(float(D));
  if (tree) {
    call.windows = p.windows;
    call.masks.assign(p.masks.begin(), p.masks.end());
    a.tree_window =
        Tensor(place(call, dev, call.windows.data(), call.windows.size() * 4), DType::i32, {B}, dev);
    a.tree_mask = Tensor(place(call, dev, call.masks.data(), call.masks.size() * 8), DType::i64, {T}, dev);
  }
  call.out_host.assign(size_t(T * p.Hq * D), bf16_t{kPoisonBits});
  a.out = Tensor(place(call, dev, call.out_host.data(), call.out_host.size() * 2), DType::bf16, {T, p.Hq, D},
                 dev);
}

// The attention of p on `dev` (tree fields unless !tree), every output element checked written and finite.
std::vector<bf16_t> run(const Problem& p, const HostCache& c, Device dev, bool tree = true) {
  Call call;
  prepare(p, c, dev, tree, call);
  ops::paged_attention(call.a);
  std::vector<bf16_t> out = call.out_host;
  if (dev.is_cuda()) {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    copy_bytes(out.data(), Device::cpu(), call.a.out.data, dev, out.size() * 2);
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (!std::isfinite(bf16_to_f32(out[i]))) {
      ADD_FAILURE() << device_name(dev) << ": output element " << i << " (row " << int64_t(i) / (p.Hq * p.D)
                    << ") unwritten or not finite";
      break;
    }
  return out;
}

// The tree kernel's split count for p's shapes on this GPU (ops/cuda/attention.h).
int tree_splits(const Problem& p, const HostCache& c) {
  const int32_t some_window = 0;  // only whether the field is given matters
  cuda::PagedAttnParams q{};
  q.pages_stride = int32_t(c.pages_stride);
  q.page_size = c.page_size;
  q.B = int32_t(p.B());
  q.T = int32_t(p.T());
  q.Hq = int32_t(p.Hq);
  q.Hkv = int32_t(p.Hkv);
  q.D = int32_t(p.D);
  q.tree_window = &some_window;
  return cuda::paged_attention_tree_splits(q);
}

const char* dtype_label(DType dt) {
  return dt == DType::bf16 ? "bf16" : "fp8";
}

// CUDA against the CPU reference and fp64, both within the contract's bound; returns the CUDA output.
std::vector<bf16_t> check_against_cpu(const Problem& p, const HostCache& c, const std::string& label) {
  const auto cpu = run(p, c, Device::cpu()), gpu = run(p, c, Device::cuda());
  const double vs_cpu = test::rel_frob(gpu, cpu), vs_fp64 = test::fp64_attention_error(p, c.kf, c.vf, gpu),
               cpu_fp64 = test::fp64_attention_error(p, c.kf, c.vf, cpu);
  std::printf("%s: |cuda - cpu| / |cpu| %.2e, cuda vs fp64 %.2e (cpu %.2e), tree splits %d\n", label.c_str(),
              vs_cpu, vs_fp64, cpu_fp64, tree_splits(p, c));
  EXPECT_LE(vs_cpu, kTolerance) << label;
  EXPECT_LE(vs_fp64, kTolerance) << label;
  return gpu;
}

TEST(CudaTreeAttention, RandomTreesMatchTheCpuAndFp64) {
  KILN_REQUIRE_GPU();
  struct Heads {
    int64_t Hq, Hkv, D;
  };
  for (const Heads h : {Heads{8, 2, 64}, Heads{6, 1, 128}, Heads{4, 4, 64}, Heads{16, 2, 128}}) {
    const uint32_t seed = uint32_t(h.Hq * 131 + h.D);
    const Problem p = tree_problem(mixed_specs(), h.Hq, h.Hkv, h.D, seed);
    for (DType dt : {DType::bf16, DType::f8e4m3}) {
      for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
        for (int page : {16, 32}) {
          const HostCache c = build_cache(p, dt, layout, page, seed + uint32_t(page));
          // T * Hkv blocks are far from filling the GPU: the tree launch splits the context.
          EXPECT_GT(tree_splits(p, c), 1);
          check_against_cpu(p, c,
                            "Hq " + std::to_string(h.Hq) + " Hkv " + std::to_string(h.Hkv) + " D " +
                                std::to_string(h.D) + " " + dtype_label(dt) +
                                (layout == KvLayout::nhd ? " NHD" : " HND") + " page " +
                                std::to_string(page));
        }
      }
    }
  }
}

TEST(CudaTreeAttention, UnsplitBesideALongPrefillChunk) {
  KILN_REQUIRE_GPU();
  int dev = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // Enough prefill rows that T * Hkv blocks exceed 16 an SM: one split, the tree kernel writes out itself.
  const int32_t chunk = 8 * sms + 40;
  const std::vector<SeqSpec> specs = {
      {8, 300, 8}, {chunk, chunk + 20, 0}, {4, 50, 12}, {1, 77, 0}, {3, 3, 3}};
  const Problem p = tree_problem(specs, 8, 2, 128, 21);
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    const HostCache c = build_cache(p, dt, dt == DType::bf16 ? KvLayout::nhd : KvLayout::hnd,
                                    dt == DType::bf16 ? 16 : 32, 22);
    EXPECT_EQ(tree_splits(p, c), 1);
    check_against_cpu(
        p, c, std::string("beside a prefill chunk of ") + std::to_string(chunk) + ", " + dtype_label(dt));
  }
}

TEST(CudaTreeAttention, ChainMasksMatchTheCausalCall) {
  KILN_REQUIRE_GPU();
  const std::vector<SeqSpec> specs = {{5, 20, 5},   {3, 30, 17}, {1, 8, 1},     {4, 9, 0},
                                      {64, 64, 64}, {2, 11, 11}, {12, 500, 12}, {7, 300, 40}};
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    const Problem chain = tree_problem(specs, 8, 2, 128, 5, /*chain=*/true);
    for (int page : {16, 32}) {
      const HostCache c = build_cache(chain, dt, KvLayout::hnd, page, 6);
      const auto tree = run(chain, c, Device::cuda()), causal = run(chain, c, Device::cuda(), /*tree=*/false);
      int worst = 0;
      for (size_t i = 0; i < tree.size(); ++i) worst = std::max(worst, test::bf16_ulps(tree[i], causal[i]));
      const double rel = test::rel_frob(tree, causal);
      std::printf("chain masks vs causal (%s, page %d): rel %.2e, max %d bf16 ulps\n", dtype_label(dt), page,
                  rel, worst);
      EXPECT_LE(rel, kTolerance) << dtype_label(dt) << " page " << page;
      EXPECT_LE(test::fp64_attention_error(chain, c.kf, c.vf, tree), kTolerance);
    }
  }
}

TEST(CudaTreeAttention, CausalRowsOfATreeCallAreTheCausalCallsBits) {
  KILN_REQUIRE_GPU();
  const Problem p = tree_problem(mixed_specs(), 8, 2, 128, 31);
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    const HostCache c = build_cache(p, dt, KvLayout::nhd, 16, 32);
    const auto tree = run(p, c, Device::cuda()), causal = run(p, c, Device::cuda(), /*tree=*/false);
    const size_t row = size_t(p.Hq * p.D);
    for (int64_t b = 0; b < p.B(); ++b) {
      if (p.window(b) != 0) continue;
      for (size_t e = size_t(p.first_row(b)) * row; e < size_t(p.first_row(b) + p.q_lens[size_t(b)]) * row;
           ++e)
        ASSERT_EQ(tree[e].bits, causal[e].bits) << dtype_label(dt) << " sequence " << b << " element " << e;
    }
  }
}

TEST(CudaTreeAttention, DispatcherChecksTheFieldsOnCuda) {
  KILN_REQUIRE_GPU();
  const Problem p = tree_problem({{3, 10, 5}, {1, 4, 0}}, 8, 2, 64, 3);
  const HostCache c = build_cache(p, DType::bf16, KvLayout::nhd, 4, 3);
  const auto fails = [&](const std::function<void(Call&)>& edit, std::initializer_list<std::string> parts) {
    Call call;
    prepare(p, c, Device::cuda(), true, call);
    edit(call);
    test_support::expect_contains(test_support::error_of([&] { ops::paged_attention(call.a); }), parts);
  };
  fails([](Call& k) { k.a.tree_mask = Tensor(); }, {"tree_window and tree_mask"});
  fails([](Call& k) { k.a.tree_window = Tensor(k.a.tree_window.data, DType::i64, {1}, Device::cuda()); },
        {"tree_window"});
  fails([](Call& k) { k.a.tree_mask = Tensor(k.a.tree_mask.data, DType::i64, {3}, Device::cuda()); },
        {"tree_mask"});
  fails([](Call& k) { k.a.tree_mask = Tensor(k.masks.data(), DType::i64, {4}); }, {"tree_mask", "cpu"});
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------------------------------------
// The whole model: the CUDA tree steps against the CPU model's.

ModelConfig tiny_config() {
  return test::tiny_model_config();
}

// The steps of one run: a prefill of prompts a and b; a verify tree over a's root and n nodes beside b's
// plain decode and c's first prompt chunk; a draft pass of `more` nodes (window 1 + n + more > q_len) beside
// b's decode and c's second chunk; a draft pass of 3 nodes beside b's decode (at most 3 rows a sequence: the
// verify-decode routing of the causal rows). Every step's logits, in order.
std::vector<std::vector<float>> tree_run(Qwen3Model& m, DType dt, KvLayout layout, int32_t page_size,
                                         uint32_t seed, int32_t n, int32_t more) {
  const ModelConfig& cfg = m.config();
  std::mt19937 rng(seed);
  const auto tok = [&] { return int32_t(rng() % uint32_t(cfg.vocab_size)); };
  std::vector<int32_t> pa_tok(40), pb_tok(23), pc_tok(27);
  for (auto* v : {&pa_tok, &pb_tok, &pc_tok})
    for (auto& t : *v) t = tok();
  const int32_t pa = int32_t(pa_tok.size()), pb = int32_t(pb_tok.size()), root = tok();
  test::DraftTree tree;
  for (int32_t i = 0; i < n + more + 3; ++i) tree.add(int32_t(rng() % uint32_t(i + 1)) - 1, tok());
  KvCache cache(cfg, 64, page_size, layout, dt, m.device());
  int32_t next = 1;
  test::Pages a{page_size, {}}, b{page_size, {}}, c{page_size, {}};
  std::vector<std::vector<float>> all;
  const auto step = [&](std::vector<test::StepSeq> seqs) {
    for (auto& l : test::step_logits(m, cache, test::make_step(std::move(seqs), page_size, next)))
      all.push_back(std::move(l));
  };
  step({{&a, test::causal_rows(pa_tok, 0), pa}, {&b, test::causal_rows(pb_tok, 0), pb}});
  test::StepSeq verify{&a, {{root, pa, pa, 1}}, pa + 1 + n, 1 + n};
  for (int32_t i = 0; i < n; ++i) verify.rows.push_back(tree.row(i, pa));
  const std::vector<int32_t> c1(pc_tok.begin(), pc_tok.begin() + 20), c2(pc_tok.begin() + 20, pc_tok.end());
  step({verify, {&b, {{tok(), pb, pb}}, pb + 1}, {&c, test::causal_rows(c1, 0), 20, 0, true}});
  test::StepSeq draft{&a, {}, pa + 1 + n + more, 1 + n + more};
  for (int32_t i = n; i < n + more; ++i) draft.rows.push_back(tree.row(i, pa));
  step({draft, {&b, {{tok(), pb + 1, pb + 1}}, pb + 2}, {&c, test::causal_rows(c2, 20), 27, 0, true}});
  test::StepSeq draft2{&a, {}, pa + 1 + n + more + 3, 1 + n + more + 3};
  for (int32_t i = n + more; i < n + more + 3; ++i) draft2.rows.push_back(tree.row(i, pa));
  step({{&b, {{tok(), pb + 2, pb + 2}}, pb + 3}, draft2});
  return all;
}

TEST(CudaTreeModel, TreeStepsMatchTheCpuModelOnRandomWeights) {
  KILN_REQUIRE_GPU();
  using test_support::log_softmax;
  LoadOptions o;
  o.seed = 11;
  auto cpu = Qwen3Model::create(tiny_config(), nullptr, o);
  o.device = Device::cuda();
  auto gpu = Qwen3Model::create(tiny_config(), nullptr, o);
  const int64_t V = tiny_config().vocab_size;
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
      const uint32_t seed = dt == DType::bf16 ? 3u : 4u;
      const auto ref = tree_run(*cpu, dt, layout, 16, seed, 14, 5);
      const auto got = tree_run(*gpu, dt, layout, layout == KvLayout::nhd ? 32 : 16, seed, 14, 5);
      ASSERT_EQ(got.size(), ref.size());
      double worst = 0;
      int agree = 0, decided = 0;
      for (size_t r = 0; r < ref.size(); ++r) {
        const auto lr = log_softmax(ref[r].data(), V), lg = log_softmax(got[r].data(), V);
        for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(lr[size_t(v)] - lg[size_t(v)]));
        const int32_t want = test::argmax(ref[r]), g = test::argmax(got[r]);
        agree += g == want;
        std::vector<float> sorted = ref[r];
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > 0.1f) {  // a near tie may go either way
          ++decided;
          EXPECT_EQ(g, want) << dtype_label(dt) << " logit row " << r;
        }
      }
      std::printf(
          "tree steps, cuda vs cpu (%s, %s): max |logprob drift| %.4f, greedy agreement %d/%zu (%d "
          "decided)\n",
          dtype_label(dt), layout == KvLayout::nhd ? "NHD" : "HND", worst, agree, ref.size(), decided);
      EXPECT_LE(worst, test::kModelMaxRowDrift) << dtype_label(dt);
    }
  }
}

}  // namespace
}  // namespace kiln
