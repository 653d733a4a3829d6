// The decode chain (ops/decode_chain.h) in the model: with every projection's tactic an FMA GEMV, batch-1
// decode steps with the chain switched on give the logits of the steps without it bit for bit and leave the
// same KV cache bytes, eagerly and replayed in a CUDA graph (with PDL) while the token, position, slot and
// page table change; shapes with head_dim 64 and 128, GQA 2, 3 and 4, odd widths (H 384, I 1000), each GEMV
// warp count, bf16 and fp8 caches, NHD and HND. The chain must actually run: its launch count is checked.
#include <string>
#include <vector>

#include "common/test_support.h"
#include "gemv_test_util.h"
#include "model/cuda_graph.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "ops/cuda/context.h"
#include "ops/cuda/decode_chain.h"
#include "ops/cuda/gemm.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

struct Case {
  std::string name;
  int64_t hidden, inter, layers, heads, kv_heads, head_dim;
  int warps_qkv, warps_o, warps_gate_up, warps_down;
  DType cache;
  ops::KvLayout layout;
};

ModelConfig config_of(const Case& k) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 1000;
  c.hidden_size = k.hidden;
  c.intermediate_size = k.inter;
  c.num_layers = k.layers;
  c.num_heads = k.heads;
  c.num_kv_heads = k.kv_heads;
  c.head_dim = k.head_dim;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  return c;
}

constexpr int kPages = 16, kPageSize = 16;

// One token at position pos; pages in reverse order (position p on page 15 - p / 16), so the page table
// changes at every page boundary.
BatchDesc step_batch(int32_t pos, int32_t token) {
  BatchDesc b;
  b.page_size = kPageSize;
  b.tokens = {token};
  b.positions = {pos};
  b.slot_mapping = {int64_t(kPages - 1 - pos / kPageSize) * kPageSize + pos % kPageSize};
  b.cu_q = {0, 1};
  b.kv_lens = {pos + 1};
  b.pages_stride = pos / kPageSize + 1;
  for (int32_t i = 0; i <= pos / kPageSize; ++i) b.page_table.push_back(kPages - 1 - i);
  b.logit_rows = {0};
  return b;
}

template <typename T>
std::vector<T> host(const Tensor& t, size_t n) {
  std::vector<T> v(n);
  copy_bytes(v.data(), Device::cpu(), t.data, t.device, n * sizeof(T));
  return v;
}

// Every K, V (and scale) byte of every layer.
std::vector<uint8_t> cache_bytes(const KvCache& kc) {
  std::vector<uint8_t> all;
  for (int l = 0; l < kc.num_layers(); ++l) {
    const ops::KvCacheView v = kc.layer(l);
    for (const Tensor* t : {&v.k, &v.v, &v.k_scale, &v.v_scale}) {
      if (!t->data) continue;
      const auto b = host<uint8_t>(*t, size_t(t->nbytes()));
      all.insert(all.end(), b.begin(), b.end());
    }
  }
  return all;
}

// The case's FMA GEMV tactics for every projection at M = 1 (QKV and gate_up with the residual-norm
// prologue), installed for the scope's life, and the chain switch restored afterwards.
class TacticsScope {
 public:
  explicit TacticsScope(const Case& k) {
    cuda::GemmEngine& eng = cuda::gemm_engine();
    const auto dir = test_support::process_scratch_dir("decode_chain_" + k.name);
    saved_ = (dir / "saved_tactics.txt").string();
    eng.save(saved_);
    const std::string path = (dir / "tactics.txt").string();
    const ModelConfig c = config_of(k);
    const int64_t H = c.hidden_size, qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    const int64_t q = c.num_heads * c.head_dim, I = c.intermediate_size;
    const auto bf16 = cuda::GemmOut::bf16;
    test::write_gemv_cache(eng, path,
                           {{{1, qkv, H, bf16}, {k.warps_qkv, false}, true},
                            {{1, H, q, bf16}, {k.warps_o, false}, false},
                            {{1, 2 * I, H, bf16}, {k.warps_gate_up, false}, true},
                            {{1, H, I, bf16}, {k.warps_down, false}, false},
                            {{1, c.vocab_size, H, cuda::GemmOut::f32}, {4, false}, false}});
    loaded_ = eng.load(path);
    chain_ = eng.decode_chain();
  }
  ~TacticsScope() {
    cuda::GemmEngine& eng = cuda::gemm_engine();
    eng.load(saved_);
    eng.set_decode_chain(chain_);
    cuda::set_pdl(false);
  }
  bool loaded() const { return loaded_; }

 private:
  std::string saved_;
  bool loaded_ = false, chain_ = false;
};

// NaN bits in every logit, so a step that writes nothing cannot match.
void poison(const Tensor& t) {
  const std::vector<uint32_t> nan(size_t(t.numel()), 0x7fc00001u);
  copy_bytes(t.data, t.device, nan.data(), Device::cpu(), nan.size() * 4);
}

void run_case(const Case& k) {
  SCOPED_TRACE(k.name);
  const TacticsScope scope(k);
  ASSERT_TRUE(scope.loaded());
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const ModelConfig c = config_of(k);
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 11;
  auto m = Qwen3Model::create(c, nullptr, o);
  const int64_t V = c.vocab_size;
  KvCache plain_cache(c, kPages, kPageSize, k.layout, k.cache, Device::cuda());
  KvCache chain_cache(c, kPages, kPageSize, k.layout, k.cache, Device::cuda());
  KvCache graph_cache(c, kPages, kPageSize, k.layout, k.cache, Device::cuda());
  Buffer pl(size_t(V) * 4, Device::cuda()), cl(size_t(V) * 4, Device::cuda());
  const Tensor plain_logits(pl.data(), DType::f32, {1, V}, Device::cuda());
  const Tensor chain_logits(cl.data(), DType::f32, {1, V}, Device::cuda());
  cuda::set_pdl(true);
  eng.set_decode_chain(true);
  CudaDecodeGraph g(*m, graph_cache, kPages);
  for (int32_t pos = 0; pos < 40; ++pos) {  // crosses the page boundaries at 16 and 32
    const BatchDesc b = step_batch(pos, (pos * 389 + 17) % int32_t(V));
    eng.set_decode_chain(false);
    const uint64_t before = cuda::decode_chain_launches();
    poison(chain_logits);
    m->forward(b, plain_cache, plain_logits);
    const auto want = host<float>(plain_logits, size_t(V));
    ASSERT_EQ(cuda::decode_chain_launches(), before) << "the chain ran while switched off";
    eng.set_decode_chain(true);
    m->forward(b, chain_cache, chain_logits);
    ASSERT_EQ(cuda::decode_chain_launches(), before + uint64_t(c.num_layers)) << "one chain a layer";
    ASSERT_EQ(host<float>(chain_logits, size_t(V)), want) << "eager, step " << pos;
    ASSERT_EQ(host<float>(g.step(b), size_t(V)), want) << "graph, step " << pos;
  }
  EXPECT_EQ(g.captures(), 1) << "inputs changing must not force a recapture";
  const auto plain_kv = cache_bytes(plain_cache);
  EXPECT_TRUE(plain_kv == cache_bytes(chain_cache)) << "the eager chain's KV cache differs";
  EXPECT_TRUE(plain_kv == cache_bytes(graph_cache)) << "the graph's KV cache differs";
}

TEST(CudaDecodeChain, QwenSmallLayerBf16HndEqualsUnfusedOps) {
  KILN_REQUIRE_GPU();
  run_case({"h1024_d128_gqa2", 1024, 3072, 3, 16, 8, 128, 2, 4, 8, 16, DType::bf16, ops::KvLayout::hnd});
}

TEST(CudaDecodeChain, Fp8NhdGqa4EqualsUnfusedOps) {
  KILN_REQUIRE_GPU();
  run_case({"h512_d128_gqa4_fp8", 512, 1536, 3, 8, 2, 128, 16, 8, 4, 2, DType::f8e4m3, ops::KvLayout::nhd});
}

TEST(CudaDecodeChain, OddWidthsHeadDim64EqualsUnfusedOps) {
  KILN_REQUIRE_GPU();
  run_case({"h384_i1000_d64_gqa3", 384, 1000, 2, 6, 2, 64, 4, 2, 16, 8, DType::bf16, ops::KvLayout::nhd});
}

// An unset call is refused before anything is launched.
TEST(CudaDecodeChain, GuardsRefuseWhatTheKernelDoesNotTake) {
  KILN_REQUIRE_GPU();
  cuda::DecodeChainParams p;
  EXPECT_FALSE(cuda::decode_chain_supported(p));
  EXPECT_THROW(cuda::decode_chain(p, nullptr, false), Error);
}

}  // namespace
}  // namespace kiln
