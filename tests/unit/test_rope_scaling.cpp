// Rotary scaling (YaRN, linear, dynamic): config.json -> RopeScaling in both spellings, the inverse
// frequencies against an independent re-derivation (bisection on the rotation count, long double), the
// table's cos/sin x attention_factor, and every rejection naming its field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <numbers>
#include <tuple>

#include "common/test_support.h"
#include "kiln/config.h"
#include "kiln/error.h"
#include "ops/rope_table.h"

using namespace kiln;
using json = nlohmann::json;

namespace {

using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

// Qwen3-4B with the YaRN block that Qwen's model card documents for 131,072-token contexts.
json qwen3_yarn_v4() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 2560, "intermediate_size": 9728,
    "max_position_embeddings": 40960, "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rope_theta": 1000000, "vocab_size": 151936,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})");
}

ModelConfig parse(const json& j) {
  return parse_model_config(j.dump(), "test/config.json");
}

// The pair index j (continuous) at which a rotary_dim-wide rotation of base theta turns `rotations` times
// over `context` positions: context * theta^(-2j/d) / (2 pi) = rotations, solved by bisection (the
// rotation count falls monotonically with j) -- not the closed form the code under test uses.
long double pair_at_rotations(long double rotations, int d, long double theta, long double context) {
  auto turns = [&](long double j) {
    return context * std::pow(theta, -2.0L * j / d) / (2.0L * std::numbers::pi_v<long double>);
  };
  long double lo = -100, hi = 1000;
  for (int i = 0; i < 200; ++i) {
    const long double mid = (lo + hi) / 2;
    (turns(mid) > rotations ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// YaRN's frequency of pair j: extrapolated (unchanged) below the ramp, interpolated (/ factor) above it.
long double yarn_freq(int j, int d, long double theta, long double factor, long double low,
                      long double high) {
  const long double base = std::pow(theta, -2.0L * j / d);
  long double ramp = (j - low) / (high - low);
  ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
  return base * (1 - ramp) + base / factor * ramp;
}

}  // namespace

TEST(RopeScaling, Qwen3YarnConfigBothSpellings) {
  for (int spelling = 0; spelling < 3; ++spelling) {
    SCOPED_TRACE("spelling " + std::to_string(spelling));
    json j = qwen3_yarn_v4();
    if (spelling == 1) {  // transformers 5.x: rope_parameters, theta inside
      j["rope_parameters"] = j["rope_scaling"];
      j["rope_parameters"]["rope_theta"] = 1000000.0;
      j.erase("rope_scaling");
      j.erase("rope_theta");
    } else if (spelling == 2) {  // older "type" key
      j["rope_scaling"].erase("rope_type");
      j["rope_scaling"]["type"] = "yarn";
    }
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.rope_type, "yarn");
    EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::yarn);
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);  // the explicit factor, not 40960 / 32768
    EXPECT_EQ(c.rope_scaling.original_max_position, 32768);
    EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0);
    EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 32.0);
    EXPECT_DOUBLE_EQ(c.rope_scaling.beta_slow, 1.0);
    EXPECT_TRUE(c.rope_scaling.truncate);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.max_context(), 131072);
  }
}

TEST(RopeScaling, YarnOptionalFields) {
  json j = qwen3_yarn_v4();
  j["rope_scaling"]["attention_factor"] = 1.5;
  j["rope_scaling"]["beta_fast"] = 16;
  j["rope_scaling"]["beta_slow"] = 2.0;
  j["rope_scaling"]["truncate"] = false;
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_slow, 2.0);
  EXPECT_FALSE(c.rope_scaling.truncate);
  // DeepSeek-style mscale / mscale_all_dim: the ratio of the two get_mscale values.
  j = qwen3_yarn_v4();
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_factor,
                   (0.1 * 0.707 * std::log(4.0) + 1.0) / (0.1 * 1.0 * std::log(4.0) + 1.0));
  // Only one of them: the plain formula.
  j["rope_scaling"].erase("mscale_all_dim");
  EXPECT_DOUBLE_EQ(parse(j).rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0);
  // No factor: transformers' implicit one, max_position_embeddings / original_max_position_embeddings.
  j = qwen3_yarn_v4();
  j["rope_scaling"].erase("factor");
  j["max_position_embeddings"] = 131072;
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  // No original_max_position_embeddings: max_position_embeddings is the pre-YaRN length.
  j = qwen3_yarn_v4();
  j["rope_scaling"].erase("original_max_position_embeddings");
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.original_max_position, 40960);
  EXPECT_EQ(c.max_context(), 4 * 40960);
}

TEST(RopeScaling, LinearAndDynamic) {
  json j = qwen3_yarn_v4();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::linear);
  EXPECT_EQ(c.max_context(), 81920);
  const auto f = ops::rope_inv_freq(8, 1e4, c.rope_scaling);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[size_t(i)], std::pow(1e4, -2.0 * i / 8) / 2.0) << i;
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::dynamic);
  EXPECT_EQ(c.max_context(), 40960);  // equal to the default rotation up to there, and kiln stops there
  const auto g = ops::rope_inv_freq(8, 1e4, c.rope_scaling);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(g[size_t(i)], std::pow(1e4, -2.0 * i / 8)) << i;
}

TEST(RopeScaling, RejectionsNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["rope_scaling"]["rope_type"] = "longrope"; }, {"rope_scaling.rope_type", "longrope"}},
      {[](json& j) { j["rope_scaling"]["rope_type"] = "llama3"; }, {"rope_scaling.rope_type", "llama3"}},
      {[](json& j) { j["rope_scaling"]["factor"] = 0.5; }, {"rope_scaling.factor", ">= 1"}},
      {[](json& j) { j["rope_scaling"]["factor"] = "4"; }, {"rope_scaling.factor", "number"}},
      {[](json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}};
       },
       {"rope_scaling.factor", "missing"}},
      {[](json& j) {
         j["rope_scaling"].erase("factor");
         j["rope_scaling"].erase("original_max_position_embeddings");
       },
       {"rope_scaling.factor", "missing"}},
      {[](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 0; },
       {"rope_scaling.original_max_position_embeddings", "positive"}},
      {[](json& j) { j["rope_scaling"]["beta_fast"] = -3; }, {"rope_scaling.beta_fast", "positive"}},
      {[](json& j) { j["rope_scaling"]["truncate"] = 1; }, {"rope_scaling.truncate", "true or false"}},
      {[](json& j) { j["rope_scaling"]["attention_factor"] = -1.0; },
       {"rope_scaling.attention_factor", "positive"}},
      {[](json& j) {
         j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
       },
       {"rope_scaling", "yarn", "linear"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    json j = qwen3_yarn_v4();
    cases[i].edit(j);
    const std::string msg = error_of([&] { parse(j); });
    expect_contains(msg, {"test/config.json"});
    for (const auto& w : cases[i].want) expect_contains(msg, {w});
  }
  // A default rope_parameters beside a YaRN rope_scaling: the scaling wins (as a 4.x -> 5.x upgrade writes).
  json j = qwen3_yarn_v4();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  EXPECT_EQ(parse(j).rope_scaling.kind, RopeScalingKind::yarn);
}

// Qwen3's YaRN (d 128, theta 1e6, 32768 x 4): the ramp runs from pair 23 (floor of where the original context
// turns 32 times) to pair 40 (ceil of where it turns once); the inverse frequencies follow the ramp.
TEST(RopeScaling, YarnInverseFrequenciesMatchAnIndependentDerivation) {
  for (const bool truncate : {true, false}) {
    for (const auto& [d, theta, ctx, factor] :
         {std::tuple{128, 1e6, 32768, 4.0}, std::tuple{64, 1e4, 256, 2.0}, std::tuple{32, 1e6, 4096, 8.0}}) {
      SCOPED_TRACE("d " + std::to_string(d) + " theta " + std::to_string(theta) + " ctx " +
                   std::to_string(ctx) + (truncate ? " truncate" : " no truncate"));
      RopeScaling s;
      s.kind = RopeScalingKind::yarn;
      s.factor = factor;
      s.original_max_position = ctx;
      s.truncate = truncate;
      long double low = pair_at_rotations(32, d, theta, ctx), high = pair_at_rotations(1, d, theta, ctx);
      if (truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0L);
      high = std::min(high, static_cast<long double>(d - 1));
      if (d == 128 && truncate) {
        EXPECT_EQ(double(low), 23.0);
        EXPECT_EQ(double(high), 40.0);
      }
      const auto got = ops::rope_inv_freq(d, theta, s);
      ASSERT_EQ(got.size(), size_t(d / 2));
      for (int i = 0; i < d / 2; ++i) {
        const long double want = yarn_freq(i, d, theta, factor, low, high);
        EXPECT_NEAR(got[size_t(i)], double(want), 1e-14 * double(want)) << "pair " << i;
      }
      // High-frequency pairs are left alone, low-frequency ones divided by the factor.
      EXPECT_DOUBLE_EQ(got[0], 1.0);
      EXPECT_NEAR(got[size_t(d / 2 - 1)], std::pow(theta, -2.0 * (d / 2 - 1) / d) / factor, 1e-18);
    }
  }
}

TEST(RopeScaling, YarnTableScalesCosAndSinByTheAttentionFactor) {
  RopeScaling s;
  s.kind = RopeScalingKind::yarn;
  s.factor = 4.0;
  s.original_max_position = 32768;
  s.attention_factor = 0.1 * std::log(4.0) + 1.0;
  const int d = 128;
  const int64_t rows = 300;
  Buffer t = ops::build_rope_table(d, 1e6, s, rows, Device::cpu());
  const float* p = static_cast<const float*>(t.data());
  const long double low = 23, high = 40;
  for (int64_t pos : {0, 1, 7, 299}) {
    for (int j : {0, 10, 23, 30, 40, 63}) {
      const long double a = static_cast<long double>(pos) * yarn_freq(j, d, 1e6L, 4.0L, low, high);
      const long double m = 0.1L * std::log(4.0L) + 1.0L;
      EXPECT_EQ(p[pos * d + j], float(m * std::cos(a))) << "cos row " << pos << " pair " << j;
      EXPECT_EQ(p[pos * d + d / 2 + j], float(m * std::sin(a))) << "sin row " << pos << " pair " << j;
    }
  }
  // No scaling: the table is bit for bit the plain one (existing checkpoints unchanged).
  Buffer plain = ops::build_rope_table(d, 1e6, rows, Device::cpu());
  Buffer none = ops::build_rope_table(d, 1e6, RopeScaling{}, rows, Device::cpu());
  EXPECT_EQ(std::memcmp(plain.data(), none.data(), size_t(rows * d) * 4), 0);
  EXPECT_EQ(static_cast<const float*>(plain.data())[5 * d + 3],
            float(std::cos(5.0 * std::pow(1e6, -6.0 / d))));
}
