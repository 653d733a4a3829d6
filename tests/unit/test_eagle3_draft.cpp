// The EAGLE-3 draft on the CPU (model/eagle3.h): the loader reads the LlamaForCausalLMEagle3 layout and names
// what is wrong in a bad one; rows give the same outputs bit for bit however they are grouped into calls;
// chain drafting is the row-by-row top-1 walk through d2t; a truncated KV continues as if never extended.
// Against PyTorch: with KILN_EAGLE3_FIXTURE=DIR (scripts/make_eagle3_fixture.py DIR, run where torch is), the
// draft's fc, midlayer outputs and logits equal the float32 reference within 1e-4 relative, and the chain's
// tokens exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/test_support.h"
#include "eagle3_test_util.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"
#include "model/eagle3.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int64_t H = 32, HT = 24, I = 40, HEADS = 4, KV = 2, D = 8, V = 50, DV = 20;

std::string config_json(const std::string& arch = "LlamaForCausalLMEagle3") {
  return test::eagle3_config_json(test::Eagle3Shape{}, arch);
}

// A random draft in `dir` (bf16 weights, its own embeddings); `skip` leaves one tensor out; d2t_shift moves
// the last d2t entry (out of range when large).
void write_draft(const fs::path& dir, const std::string& skip = "", int64_t d2t_shift = 0,
                 const std::string& arch = "LlamaForCausalLMEagle3") {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < DV; ++i) ids.push_back(2 * i + 1);  // draft id i -> target id 2 i + 1
  ids.back() += d2t_shift;
  test::write_eagle3_draft(dir, test::Eagle3Shape{}, skip, ids, 5, arch);
}

fs::path scratch(const std::string& name) {
  return test_support::process_scratch_dir("eagle3") / name;
}

std::vector<float> random_features(int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> f(size_t(T * 3 * HT));
  for (float& x : f) x = nd(rng);
  return f;
}

TEST(Eagle3Draft, ConfigAndLoaderNameWhatIsWrong) {
  const Eagle3Config c = parse_eagle3_config(config_json(), "cfg");
  EXPECT_EQ(c.hidden, H);
  EXPECT_EQ(c.draft_vocab, DV);
  EXPECT_EQ(c.target_hidden, HT);
  EXPECT_EQ(eagle3_aux_layers(c, 8), (std::array<int32_t, 3>{1, 4, 6}));
  Eagle3Config d = c;
  d.aux_layers.clear();
  EXPECT_EQ(eagle3_aux_layers(d, 36), (std::array<int32_t, 3>{2, 18, 33})) << "SGLang's default";
  EXPECT_THROW(eagle3_aux_layers(c, 6), Error) << "layer 6 of 6";
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] {
              parse_eagle3_config(config_json("LlamaForCausalLM"), "cfg");
            }).find("LlamaForCausalLMEagle3"),
            std::string::npos);
  write_draft(scratch("no_o"), "midlayer.self_attn.o_proj.weight");
  EXPECT_NE(message([] { Eagle3Draft::load(scratch("no_o").string()); }).find("o_proj"), std::string::npos);
  write_draft(scratch("no_embed"), "embed_tokens.weight");
  EXPECT_NE(message([] { Eagle3Draft::load(scratch("no_embed").string()); }).find("embeddings"),
            std::string::npos);
  EXPECT_NO_THROW(Eagle3Draft::load(scratch("no_embed").string(), std::vector<float>(size_t(V * H), 0.5f)));
  write_draft(scratch("bad_d2t"), "", 1000);
  EXPECT_NE(message([] { Eagle3Draft::load(scratch("bad_d2t").string()); }).find("d2t"), std::string::npos);
}

TEST(Eagle3Draft, RowsAreIndependentOfHowTheyAreGrouped) {
  write_draft(scratch("ok"));
  const auto d = Eagle3Draft::load(scratch("ok").string());
  const int64_t T = 9;
  const std::vector<float> hidden = d->project_features(random_features(T, 3));
  ASSERT_EQ(hidden.size(), size_t(T * H));
  std::vector<int32_t> tokens;
  for (int64_t t = 0; t < T; ++t) tokens.push_back(int32_t((t * 7 + 3) % V));
  Eagle3Kv all, split;
  std::vector<float> out_all, lg_all;
  d->forward(all, tokens, hidden, &out_all, &lg_all);
  EXPECT_EQ(all.len, T);
  // 4 rows, then 1, then 4.
  std::vector<float> out, lg, outs, lgs;
  for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 4}, {4, 5}, {5, 9}}) {
    d->forward(split, std::span(tokens).subspan(size_t(a), size_t(b - a)),
               std::span(hidden).subspan(size_t(a * H), size_t((b - a) * H)), &out, &lg);
    outs.insert(outs.end(), out.begin(), out.end());
    lgs.insert(lgs.end(), lg.begin(), lg.end());
  }
  EXPECT_EQ(outs, out_all);
  EXPECT_EQ(lgs, lg_all);
  EXPECT_EQ(split.k, all.k);
  // Chain: the first draft is the last row's argmax through d2t (2 id + 1), each next one a row further.
  Eagle3Kv c = all;
  const std::span<const float> last_out(out_all.data() + (T - 1) * H, size_t(H));
  const std::span<const float> last_lg(lg_all.data() + (T - 1) * DV, size_t(DV));
  const std::vector<int32_t> drafts = d->chain(c, last_out, last_lg, 3);
  ASSERT_EQ(drafts.size(), 3u);
  EXPECT_EQ(c.len, T + 2);
  int64_t best = 0;
  for (int64_t i = 1; i < DV; ++i)
    if (last_lg[size_t(i)] > last_lg[size_t(best)]) best = i;
  EXPECT_EQ(drafts[0], 2 * best + 1);
  for (int32_t t : drafts) EXPECT_EQ(t % 2, 1);
  // Truncated back, the same chain again.
  c.truncate(T);
  EXPECT_EQ(c.k, all.k);
  EXPECT_EQ(d->chain(c, last_out, last_lg, 3), drafts);
  EXPECT_THROW(d->target_token(int32_t(DV)), Error);
}

// scripts/make_eagle3_fixture.py's reference, when KILN_EAGLE3_FIXTURE names its folder.
TEST(Eagle3Draft, MatchesThePyTorchReference) {
  const char* dir = std::getenv("KILN_EAGLE3_FIXTURE");
  if (!dir || !*dir)
    GTEST_SKIP() << "KILN_EAGLE3_FIXTURE unset (scripts/make_eagle3_fixture.py DIR makes it)";
  const auto d = Eagle3Draft::load(dir);
  const Checkpoint ref = Checkpoint::open((fs::path(dir) / "reference.safetensors").string());
  auto floats = [&](const std::string& n) {
    const Tensor t = ref.get(n);
    const float* p = static_cast<const float*>(t.data);
    return std::vector<float>(p, p + t.numel());
  };
  auto ints = [&](const std::string& n) {
    const Tensor t = ref.get(n);
    const int32_t* p = static_cast<const int32_t*>(t.data);
    return std::vector<int32_t>(p, p + t.numel());
  };
  auto expect_close = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double scale = 0, worst = 0;
    for (float w : want) scale = std::max(scale, double(std::fabs(w)));
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    EXPECT_LE(worst, 1e-4 * scale + 1e-6) << what << ": max |diff| " << worst << " at scale " << scale;
  };
  const std::vector<int32_t> tokens = ints("tokens");
  const int64_t Hd = d->config().hidden, Dv = d->config().draft_vocab, T = int64_t(tokens.size());
  const std::vector<float> hidden = d->project_features(floats("features"));
  expect_close(hidden, floats("fc_out"), "fc");
  Eagle3Kv kv;
  std::vector<float> out, lg;
  d->forward(kv, tokens, hidden, &out, &lg);
  expect_close(out, floats("outputs"), "midlayer outputs");
  expect_close(lg, floats("logits"), "logits");
  const std::vector<int32_t> want = ints("chain");
  const std::vector<int32_t> got =
      d->chain(kv, std::span<const float>(out.data() + (T - 1) * Hd, size_t(Hd)),
               std::span<const float>(lg.data() + (T - 1) * Dv, size_t(Dv)), int32_t(want.size()));
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace kiln
