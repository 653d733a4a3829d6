// The Qwen3-VL image path on the GPU against the CPU oracle: each vision op (layer_norm, gelu, linear_bias,
// add, scatter_rows, rope_2d, varlen_attention, pos_embed_interpolate, cast_to_bf16) on odd sizes; the whole
// vision tower (a small tower, one with a 2-frame image, and the Qwen3-VL-4B tower's shape on a 224x224
// image); a prefill with image rows through the decoder; and the engine serving images on the GPU with whole
// and image-splitting chunked prefills (tiny random-weight model, unit/vl_test_util.h). Bounds: ops as their
// headers state (bitwise for add, scatter_rows, rope_2d, pos_embed_interpolate and cast_to_bf16); the tower
// within 2^-6 relative Frobenius error per output (bf16 roundings at other points: GEMM tactics, online
// softmax, a second rounding of the bias); the decoder's log-softmax row within common/model_steps.h's
// kModelMaxRowDrift.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "../unit/engine_test_util.h"
#include "../unit/vl_test_util.h"
#include "common/model_steps.h"
#include "kiln/cuda_check.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "model/qwen3_vl_prompt.h"
#include "model/qwen3_vl_vision.h"
#include "ops/activation.h"
#include "ops/layer_norm.h"
#include "ops/linear.h"
#include "ops/rows.h"
#include "ops/vision_attention.h"
#include "ops/vision_pos_embed.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"
#include "vision_test_util.h"

namespace kiln {
namespace {

using test::dev_t;
using test::rel_frob;

TEST(CudaVision, ElementwiseOpsMatchCpu) {
  KILN_REQUIRE_GPU();
  const int64_t T = 37, H = 200;
  auto x = test::random_bf16(size_t(T * H), 1, -3, 3), w = test::random_bf16(size_t(H), 2),
       b = test::random_bf16(size_t(H), 3);
  const Buffer dx = test::to_device(x), dw = test::to_device(w), db = test::to_device(b);
  const Buffer dout = test::to_device(std::vector<bf16_t>(x.size(), bf16_t{0x7fc1}));
  std::vector<bf16_t> want(x.size());
  // LayerNorm: at most 1 bf16 ulp apart (fp64 moments summed in another order).
  ops::layer_norm(Tensor(x.data(), DType::bf16, {T, H}), Tensor(w.data(), DType::bf16, {H}),
                  Tensor(b.data(), DType::bf16, {H}), 1e-6f, Tensor(want.data(), DType::bf16, {T, H}));
  ops::layer_norm(dev_t(dx, {T, H}), dev_t(dw, {H}), dev_t(db, {H}), 1e-6f, dev_t(dout, {T, H}));
  auto got = test::to_host<bf16_t>(dout, x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(test::bf16_ulps(got[i], want[i]), 1) << "layer_norm " << i;
  for (auto approx : {ops::GeluApprox::none, ops::GeluApprox::tanh}) {
    ops::gelu(Tensor(x.data(), DType::bf16, {T, H}), Tensor(want.data(), DType::bf16, {T, H}), approx);
    ops::gelu(dev_t(dx, {T, H}), dev_t(dout, {T, H}), approx);
    got = test::to_host<bf16_t>(dout, x.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(test::bf16_ulps(got[i], want[i]), 1) << "gelu " << i;
  }
  // add and scatter_rows: bitwise.
  auto y = test::random_bf16(x.size(), 4);
  const Buffer dy = test::to_device(y);
  ops::add(Tensor(x.data(), DType::bf16, {T, H}), Tensor(y.data(), DType::bf16, {T, H}),
           Tensor(want.data(), DType::bf16, {T, H}));
  ops::add(dev_t(dx, {T, H}), dev_t(dy, {T, H}), dev_t(dout, {T, H}));
  got = test::to_host<bf16_t>(dout, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "add " << i;
  std::vector<int32_t> rows = {0, 5, 36};
  auto src = test::random_bf16(size_t(3 * H), 5);
  const Buffer drows = test::to_device(rows), dsrc = test::to_device(src);
  for (bool acc : {false, true}) {
    std::vector<bf16_t> host = x;
    const Buffer dd = test::to_device(x);
    ops::scatter_rows(Tensor(host.data(), DType::bf16, {T, H}), Tensor(rows.data(), DType::i32, {3}),
                      Tensor(src.data(), DType::bf16, {3, H}), acc);
    ops::scatter_rows(dev_t(dd, {T, H}), dev_t(drows, {3}, DType::i32), dev_t(dsrc, {3, H}), acc);
    got = test::to_host<bf16_t>(dd, x.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i].bits, host[i].bits) << "scatter acc " << acc << " " << i;
  }
}

TEST(CudaVision, LinearBiasRopeAndAttentionMatchCpu) {
  KILN_REQUIRE_GPU();
  // linear_bias: relative Frobenius error between the two within 2^-7.
  const int64_t M = 45, K = 1536, N = 72;
  auto x = test::random_bf16(size_t(M * K), 6), w = test::random_bf16(size_t(N * K), 7, -0.05f, 0.05f),
       b = test::random_bf16(size_t(N), 8);
  std::vector<bf16_t> want(size_t(M * N));
  ops::linear_bias(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
                   Tensor(b.data(), DType::bf16, {N}), Tensor(want.data(), DType::bf16, {M, N}));
  const Buffer dx = test::to_device(x), dw = test::to_device(w), db = test::to_device(b);
  const Buffer dout = test::to_device(std::vector<bf16_t>(want.size(), bf16_t{0x7fc1}));
  ops::linear_bias(dev_t(dx, {M, K}), dev_t(dw, {N, K}), dev_t(db, {N}), dev_t(dout, {M, N}));
  EXPECT_LE(rel_frob(test::to_host<bf16_t>(dout, want.size()), want), std::ldexp(1.0, -7));

  // rope_2d (bitwise) and varlen attention (2^-7) on a QKV buffer of 3 segments, head_dim 64 and 72.
  for (int D : {64, 72}) {
    const int Hn = 3;
    const int64_t T = 150;
    std::vector<int32_t> cu = {0, 64, 65, 150};
    std::vector<int32_t> pos(size_t(2 * T));
    for (int64_t t = 0; t < T; ++t)
      pos[size_t(2 * t)] = int32_t(t % 11), pos[size_t(2 * t + 1)] = int32_t(t % 7);
    auto qkv = test::random_bf16(size_t(T * 3 * Hn * D), 9);
    const Buffer host_tab = ops::build_rope_2d_table(D, 10000.0, 16, Device::cpu());
    const Buffer dev_tab = ops::build_rope_2d_table(D, 10000.0, 16, Device::cuda());
    const Buffer dqkv = test::to_device(qkv), dpos = test::to_device(pos), dcu = test::to_device(cu);
    ops::rope_2d(Tensor(qkv.data(), DType::bf16, {T, 3 * Hn * D}), Tensor(pos.data(), DType::i32, {T, 2}),
                 ops::rope_2d_table_view(host_tab, D, 16), Hn);
    ops::rope_2d(dev_t(dqkv, {T, 3 * Hn * D}), dev_t(dpos, {T, 2}, DType::i32),
                 ops::rope_2d_table_view(dev_tab, D, 16), Hn);
    const auto roped = test::to_host<bf16_t>(dqkv, qkv.size());
    for (size_t i = 0; i < qkv.size(); ++i)
      ASSERT_EQ(roped[i].bits, qkv[i].bits) << "rope_2d D " << D << " " << i;
    auto part = [&](bf16_t* base, int k, Device d) {
      return Tensor::strided(base + k * Hn * D, DType::bf16, {T, Hn, D}, {3 * Hn * D, D, 1}, d);
    };
    std::vector<bf16_t> o(size_t(T * Hn * D));
    ops::varlen_attention(part(qkv.data(), 0, Device::cpu()), part(qkv.data(), 1, Device::cpu()),
                          part(qkv.data(), 2, Device::cpu()), Tensor(cu.data(), DType::i32, {4}),
                          Tensor(o.data(), DType::bf16, {T, Hn, D}), 0.125f);
    const Buffer dout2 = test::to_device(std::vector<bf16_t>(o.size(), bf16_t{0x7fc1}));
    auto* base = static_cast<bf16_t*>(dqkv.data());
    ops::varlen_attention(part(base, 0, Device::cuda()), part(base, 1, Device::cuda()),
                          part(base, 2, Device::cuda()), dev_t(dcu, {4}, DType::i32),
                          dev_t(dout2, {T, Hn, D}), 0.125f);
    EXPECT_LE(rel_frob(test::to_host<bf16_t>(dout2, o.size()), o), std::ldexp(1.0, -7))
        << "attention D " << D;
  }
}

// pos_embed_interpolate on the GPU bitwise the CPU reference: table sides 48 (the real tower's) and 4, widths
// 1024 and 72, grids 28x28, 64x64, 68x120 (a 1088 x 1920 image), 120x68 and 8x6 with 1 and 2 frames, merge 2
// (and 1 on one grid), into an out with a padded row stride poisoned with NaN: every element written, the
// padding untouched. Then cast_to_bf16 (the pixel rows) bitwise kiln's f32_to_bf16 on a padded f32 input
// holding ties, NaNs, infinities and subnormals.
TEST(CudaVision, PosEmbedInterpolateAndPixelCastMatchCpuBitwise) {
  KILN_REQUIRE_GPU();
  struct Grid {
    int64_t side, C, T, H, W, m;
  };
  const Grid grids[] = {{48, 1024, 1, 28, 28, 2}, {48, 1024, 2, 64, 64, 2}, {48, 1024, 1, 68, 120, 2},
                        {48, 72, 2, 68, 120, 2},  {48, 72, 1, 120, 68, 2},  {48, 72, 2, 8, 6, 2},
                        {48, 1024, 2, 8, 6, 2},   {4, 72, 2, 28, 28, 2},    {4, 1024, 1, 8, 6, 1},
                        {48, 72, 1, 7, 3, 1}};
  for (const Grid& g : grids) {
    SCOPED_TRACE("side " + std::to_string(g.side) + " C " + std::to_string(g.C) + " grid " +
                 std::to_string(g.T) + "x" + std::to_string(g.H) + "x" + std::to_string(g.W) + " m " +
                 std::to_string(g.m));
    const int64_t rows = g.T * g.H * g.W, ld = g.C + 8, P = g.side * g.side;
    auto table = test::random_bf16(size_t(P * g.C), uint32_t(g.side * 7 + g.C), -40, 40);
    std::vector<float> lin = ops::pos_embed_linspace(g.side, g.H, g.W);
    std::vector<bf16_t> want(size_t(rows * ld), bf16_t{0xffff});
    ops::pos_embed_interpolate(Tensor(table.data(), DType::bf16, {P, g.C}),
                               Tensor(lin.data(), DType::f32, {g.H + g.W}), g.T, g.H, g.W, g.m,
                               Tensor::strided(want.data(), DType::bf16, {rows, g.C}, {ld, 1}));
    const Buffer dtab = test::to_device(table), dlin = test::to_device(lin),
                 dout = test::to_device(std::vector<bf16_t>(want.size(), bf16_t{0xffff}));
    ops::pos_embed_interpolate(
        dev_t(dtab, {P, g.C}), dev_t(dlin, {g.H + g.W}, DType::f32), g.T, g.H, g.W, g.m,
        Tensor::strided(dout.data(), DType::bf16, {rows, g.C}, {ld, 1}, Device::cuda()));
    const auto got = test::to_host<bf16_t>(dout, want.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = size_t(r * ld + c);
        if (c >= g.C) {
          ASSERT_EQ(got[i].bits, 0xffff) << "padding written, row " << r;
          continue;
        }
        ASSERT_TRUE(std::isfinite(bf16_to_f32(want[i]))) << "CPU left row " << r << " channel " << c;
        ASSERT_EQ(got[i].bits, want[i].bits) << "row " << r << " channel " << c;
      }
  }

  // The pixel rows' cast: [M, K] = [37, 1536] from an f32 buffer with row stride 1540, out row stride 1544.
  const int64_t M = 37, K = 1536, ldi = K + 4, ldo = K + 8;
  std::vector<float> in(size_t(M * ldi));
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> d(-3, 3);
  for (float& x : in) x = d(rng);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::nanf(""), neg_nan = -std::nanf("0x5"), sub = std::ldexp(1.0f, -140);
  const std::vector<float> specials = {0.0f,    -0.0f,   inf, -inf, nan, neg_nan, sub, std::ldexp(1.0f, -127),
                                       3.4e38f, -3.4e38f};
  for (size_t k = 0; k < specials.size(); ++k) in[k] = specials[k];
  for (uint32_t k = 0; k < 64; ++k) {  // ties and their neighbours: low 16 bits 0x7fff, 0x8000, 0x8001
    const uint32_t u = 0x3f800000u + (k << 16) + 0x7fffu + (k % 3);
    std::memcpy(&in[size_t(ldi + k)], &u, 4);
  }
  const Buffer din = test::to_device(in),
               dpx = test::to_device(std::vector<bf16_t>(size_t(M * ldo), bf16_t{0x7fc1}));
  ops::cast_to_bf16(Tensor::strided(din.data(), DType::f32, {M, K}, {ldi, 1}, Device::cuda()),
                    Tensor::strided(dpx.data(), DType::bf16, {M, K}, {ldo, 1}, Device::cuda()));
  const auto px = test::to_host<bf16_t>(dpx, size_t(M * ldo));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < ldo; ++c) {
      const uint16_t want = c < K ? f32_to_bf16(in[size_t(r * ldi + c)]).bits : uint16_t(0x7fc1);
      ASSERT_EQ(px[size_t(r * ldo + c)].bits, want) << "cast row " << r << " column " << c;
    }
}

// The towers' position_embedding (encode's first step, through the op on each device) bitwise equal on a
// 2-frame image and a still one.
TEST(CudaVision, TowerPositionEmbeddingMatchesCpuBitwise) {
  KILN_REQUIRE_GPU();
  const ModelConfig cfg = test::tiny_vl_config();
  const Qwen3VLVision cpu(cfg, nullptr, 5, Device::cpu()), gpu(cfg, nullptr, 5, Device::cuda());
  for (int frames : {1, 2}) {
    vision::ImagePatches img = test::test_image(8, 12, 3);
    img.grid_t = frames;
    const auto a = cpu.position_embedding(img), b = gpu.position_embedding(img);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << "frames " << frames << " " << i;
  }
}

void expect_tower_matches(const ModelConfig& cfg, const std::vector<vision::ImagePatches>& imgs) {
  const Qwen3VLVision cpu(cfg, nullptr, 5, Device::cpu()), gpu(cfg, nullptr, 5, Device::cuda());
  std::vector<const vision::ImagePatches*> ptrs;
  for (const auto& i : imgs) ptrs.push_back(&i);
  const auto a = cpu.encode(ptrs), b = gpu.encode(ptrs);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(rel_frob(b[i].embeds, a[i].embeds), std::ldexp(1.0, -6)) << "image " << i << " embeds";
    ASSERT_EQ(a[i].deepstack.size(), b[i].deepstack.size());
    for (size_t k = 0; k < a[i].deepstack.size(); ++k)
      EXPECT_LE(rel_frob(b[i].deepstack[k], a[i].deepstack[k]), std::ldexp(1.0, -6))
          << "image " << i << " deep " << k;
  }
}

TEST(CudaVision, TowerMatchesCpu) {
  KILN_REQUIRE_GPU();
  expect_tower_matches(test::tiny_vl_config(), {test::test_image(8, 12, 1), test::test_image(4, 6, 2)});
}

// A 2-frame image between two still ones: the position embedding repeated per frame, one attention segment
// per frame, the pixel rows cast on the device at each image's offset.
TEST(CudaVision, TowerWithTwoFrameImageMatchesCpu) {
  KILN_REQUIRE_GPU();
  vision::ImagePatches two = test::test_image(6, 4, 7);
  two.grid_t = 2;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> d(-1, 1);
  two.values.resize(size_t(two.patches()) * size_t(two.patch_dim));
  for (float& v : two.values) v = d(rng);
  expect_tower_matches(test::tiny_vl_config(), {test::test_image(4, 6, 2), two, test::test_image(8, 12, 1)});
}

TEST(CudaVision, Qwen3Vl4bShapedTowerMatchesCpu) {
  KILN_REQUIRE_GPU();
  nlohmann::json j = test::tiny_vl_config_json();
  j["text_config"]["num_hidden_layers"] = 3;  // a decoder layer for each of the 3 deepstack features
  j["vision_config"] = {{"depth", 24},
                        {"hidden_size", 1024},
                        {"intermediate_size", 4096},
                        {"num_heads", 16},
                        {"patch_size", 16},
                        {"out_hidden_size", 64},
                        {"num_position_embeddings", 2304},
                        {"deepstack_visual_indexes", {5, 11, 17}},
                        {"hidden_act", "gelu_pytorch_tanh"}};
  const ModelConfig cfg = parse_model_config(j.dump(), "4B-shaped vision");
  vision::ImagePatches img;  // 224 x 224 pixels: 14 x 14 patches of 1536 values
  img.grid_t = 1, img.grid_h = 14, img.grid_w = 14, img.patch_dim = 1536;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(-1, 1);
  img.values.resize(size_t(196) * 1536);
  for (float& v : img.values) v = d(rng);
  expect_tower_matches(cfg, {img});
}

// One prefill of a prompt with two images through Qwen3Model with the step's image rows (each backend's own
// tower), M-RoPE positions from layout_vl_prompt: the GPU's log-softmax row within kModelMaxRowDrift of the
// CPU's, the greedy token equal unless the CPU's top-2 gap is a near tie (common/model_steps.h's rule).
TEST(CudaVision, ModelWithImageRowsMatchesCpu) {
  KILN_REQUIRE_GPU();
  const ModelConfig cfg = test::tiny_vl_config();
  const std::vector<vision::ImagePatches> imgs = {test::test_image(8, 12, 1), test::test_image(4, 6, 2)};
  const std::vector<int32_t> prompt = test::vl_prompt(imgs, 5, 1);
  const VlPromptLayout L = layout_vl_prompt(cfg, prompt, imgs);
  std::vector<float> rows[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    LoadOptions lo;
    lo.device = gpu ? Device::cuda() : Device::cpu();
    lo.seed = 7;
    auto m = Qwen3Model::create(cfg, nullptr, lo);
    const auto enc = m->vision()->encode({&imgs[0], &imgs[1]});
    const int32_t n = int32_t(prompt.size()), ps = 16, pages = (n + ps - 1) / ps;
    KvCache cache(cfg, pages + 1, ps, ops::KvLayout::nhd, DType::bf16, lo.device);
    BatchDesc b;
    b.page_size = ps;
    b.tokens = prompt;
    b.mrope = true;
    b.positions.resize(size_t(3 * n));
    for (int a = 0; a < 3; ++a)
      for (int32_t p = 0; p < n; ++p) b.positions[size_t(a * n + p)] = L.position(p, a);
    for (int32_t p = 0; p < n; ++p) b.slot_mapping.push_back(p);
    b.cu_q = {0, n};
    b.kv_lens = {n};
    b.pages_stride = pages;
    for (int32_t i = 0; i < pages; ++i) b.page_table.push_back(i);
    b.logit_rows = {n - 1};
    VisualInput vis;
    const int64_t H = cfg.hidden_size;
    vis.deepstack_layers = int32_t(cfg.vision.deepstack_visual_indexes.size());
    std::vector<std::vector<bf16_t>> deep(size_t(vis.deepstack_layers));
    for (size_t k = 0; k < imgs.size(); ++k) {
      for (int32_t r = 0; r < L.spans[k].count; ++r) vis.rows.push_back(L.spans[k].first_pad + r);
      vis.embeds.insert(vis.embeds.end(), enc[k].embeds.begin(), enc[k].embeds.end());
      for (int32_t l = 0; l < vis.deepstack_layers; ++l)
        deep[size_t(l)].insert(deep[size_t(l)].end(), enc[k].deepstack[size_t(l)].begin(),
                               enc[k].deepstack[size_t(l)].end());
    }
    for (const auto& d : deep) vis.deepstack.insert(vis.deepstack.end(), d.begin(), d.end());
    ASSERT_EQ(int64_t(vis.embeds.size()), int64_t(vis.rows.size()) * H);
    Buffer logits(size_t(cfg.vocab_size) * 4, lo.device);
    m->forward(b, cache, Tensor(logits.data(), DType::f32, {1, cfg.vocab_size}, lo.device), &vis);
    rows[gpu].resize(size_t(cfg.vocab_size));
    copy_bytes(rows[gpu].data(), Device::cpu(), logits.data(), lo.device, rows[gpu].size() * 4);
  }
  const auto a = test_support::log_softmax(rows[0].data(), cfg.vocab_size);
  const auto g = test_support::log_softmax(rows[1].data(), cfg.vocab_size);
  double worst = 0;
  for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - g[v]));
  std::printf("cuda vs cpu, prefill with 2 images: max |logprob drift| %.4f\n", worst);
  EXPECT_LE(worst, test::kModelMaxRowDrift);
  std::vector<float> sorted = rows[0];
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  if (sorted[0] - sorted[1] > 0.1f) {
    EXPECT_EQ(test::argmax(rows[1]), test::argmax(rows[0]));
  }
}

// The engine on the GPU with images, whole and chunked prefills (chunks of 7 split both images): every
// request finishes with its tokens (values: ModelWithImageRowsMatchesCpu; GPU kernels at other chunkings
// round differently, so no bitwise claim here).
// Image requests (and a text one) batched on the GPU: decode steps replay CUDA graphs at plain positions
// carrying each image's offset and give the eager steps' tokens; eager plain steps are bitwise what three
// M-RoPE rows on every step (the placement before decode went plain) give; prefill chunks split inside
// the images.
TEST(CudaVision, EngineServesImagesOnTheGpuWithAndWithoutGraphs) {
  KILN_REQUIRE_GPU();
  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> logprobs;
    int graphs = 0;
  };
  auto run = [](int chunk, bool graphs, bool mrope_every_step) {
    LoadOptions lo;
    lo.device = Device::cuda();
    lo.load_format = LoadFormat::random;
    lo.seed = 7;
    EngineOptions opts = test::small_opts(4096, 16, chunk);
    opts.disable_cuda_graph = !graphs;
    auto model = Qwen3Model::create(test::tiny_vl_config(), nullptr, lo);
    std::unique_ptr<Qwen3Runner> runner =
        mrope_every_step
            ? std::make_unique<test::MropeEveryStepRunner>(std::move(model), ops::KvLayout::nhd, DType::bf16)
            : std::make_unique<Qwen3Runner>(std::move(model), ops::KvLayout::nhd, DType::bf16);
    Qwen3Runner* r = runner.get();
    Engine e(std::move(runner), opts);
    test::Sink sink;
    std::vector<RequestId> ids;
    for (const auto& imgs :
         {std::vector<vision::ImagePatches>{test::test_image(8, 12, 1)},
          std::vector<vision::ImagePatches>{test::test_image(4, 6, 2), test::test_image(6, 4, 3)},
          std::vector<vision::ImagePatches>{}}) {
      Request q = test::greedy(imgs.empty() ? test::prompt_of(20, 4) : test::vl_prompt(imgs, 5, 1), 12);
      q.images = imgs;
      q.sampling.return_logprob = true;
      ids.push_back(e.submit(q, sink.cb()));
    }
    sink.wait_finished(int(ids.size()));
    Run out;
    for (RequestId id : ids) {
      EXPECT_EQ(sink.last(id).finish_reason, "length") << sink.last(id).error;
      out.tokens.push_back(sink.tokens(id));
      out.logprobs.push_back(sink.last(id).logprobs);
    }
    out.graphs = r->num_graphs();
    return out;
  };
  for (int chunk : {4096, 7}) {
    const Run graphs = run(chunk, true, false), eager = run(chunk, false, false),
              mrope = run(chunk, false, true);
    EXPECT_GT(graphs.graphs, 0) << "a Qwen3-VL model captures decode graphs";
    EXPECT_EQ(eager.graphs, 0);
    for (size_t i = 0; i < graphs.tokens.size(); ++i) {
      EXPECT_EQ(graphs.tokens[i].size(), 12u);
      EXPECT_EQ(graphs.tokens[i], eager.tokens[i]) << "request " << i << ", chunk " << chunk;
      // A graph pads the batch to its bucket: its GEMMs may take another algorithm than the unpadded eager
      // step's (as for text models, tokens must agree; the logprobs agree to rounding).
      ASSERT_EQ(graphs.logprobs[i].size(), eager.logprobs[i].size());
      for (size_t k = 0; k < graphs.logprobs[i].size(); ++k)
        EXPECT_NEAR(graphs.logprobs[i][k], eager.logprobs[i][k], 2e-2) << "request " << i << ", token " << k;
      EXPECT_EQ(eager.tokens[i], mrope.tokens[i]) << "request " << i << ", chunk " << chunk;
      EXPECT_EQ(eager.logprobs[i], mrope.logprobs[i]) << "request " << i << ", chunk " << chunk;
    }
  }
}

}  // namespace
}  // namespace kiln
