#include "spec/spec_options.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::spec {

SpecAlgorithm parse_spec_algorithm(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s.empty() || s == "none") return SpecAlgorithm::none;
  if (s == "ngram") return SpecAlgorithm::ngram;
  if (s == "eagle3") return SpecAlgorithm::eagle3;
  KILN_FAIL("unknown speculative algorithm '", name, "': expected ngram, EAGLE3 or none");
}

const char* spec_algorithm_name(SpecAlgorithm a) {
  return a == SpecAlgorithm::ngram ? "ngram" : a == SpecAlgorithm::eagle3 ? "eagle3" : "none";
}

void apply_vllm_speculative_config(const std::string& json, SpecOptions* o) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    KILN_FAIL("--speculative-config is not valid JSON: ", e.what());
  }
  KILN_CHECK(j.is_object(), "--speculative-config must be a JSON object");
  KILN_CHECK(j.contains("method") && j["method"].is_string(),
             "--speculative-config needs a \"method\" string");
  auto int_field = [&](const char* key, int32_t* out) {
    if (!j.contains(key)) return;
    KILN_CHECK(j[key].is_number_integer(), "--speculative-config \"", key, "\" must be an integer");
    const int64_t v = j[key].get<int64_t>();
    KILN_CHECK(v >= 0 && v <= 1 << 20, "--speculative-config \"", key, "\" is out of range: ", v);
    *out = int32_t(v);
  };
  for (const auto& [key, value] : j.items())
    KILN_CHECK(key == "method" || key == "num_speculative_tokens" || key == "prompt_lookup_min" ||
                   key == "prompt_lookup_max",
               "--speculative-config: unsupported key \"", key,
               "\" (accepted: method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)");
  o->algorithm = parse_spec_algorithm(j["method"].get<std::string>());
  KILN_CHECK(
      o->algorithm != SpecAlgorithm::eagle3,
      "--speculative-config: method eagle3 is given by SGLang's flags here (--speculative-algorithm EAGLE3 "
      "--speculative-draft-model-path DIR --speculative-num-steps N)");
  int_field("num_speculative_tokens", &o->num_draft_tokens);
  const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
  int_field("prompt_lookup_min", &o->ngram_min);
  int_field("prompt_lookup_max", &o->ngram_max);
  // vLLM: one bound given sets the other to it.
  if (has_min && !has_max) o->ngram_max = o->ngram_min;
  if (has_max && !has_min) o->ngram_min = o->ngram_max;
}

void validate_spec_options(const SpecOptions& o) {
  if (!o.enabled()) return;
  KILN_CHECK(o.num_draft_tokens >= 1 && o.num_draft_tokens <= kMaxDraftTokens,
             "the number of speculative draft tokens must be in [1, ", kMaxDraftTokens, "], got ",
             o.num_draft_tokens);
  KILN_CHECK(
      o.algorithm != SpecAlgorithm::eagle3 || !o.draft_model_path.empty(),
      "--speculative-algorithm EAGLE3 needs --speculative-draft-model-path (an EAGLE-3 draft checkpoint)");
  KILN_CHECK(o.eagle_topk >= 1 && o.eagle_topk <= kMaxEagleTopk, "--speculative-eagle-topk must be in [1, ",
             kMaxEagleTopk, "], got ", o.eagle_topk);
  KILN_CHECK(o.eagle_topk == 1 || o.algorithm == SpecAlgorithm::eagle3,
             "--speculative-eagle-topk above 1 is for --speculative-algorithm EAGLE3");
  if (o.tree()) {
    KILN_CHECK(o.eagle_steps >= 1, "tree drafting needs --speculative-num-steps >= 1, got ", o.eagle_steps);
    // The draft expands K nodes at each of its steps but the last: their entries share one window.
    KILN_CHECK(int64_t(o.eagle_topk) * (o.eagle_steps - 1) <= 64,
               "tree drafting expands --speculative-eagle-topk x "
               "(--speculative-num-steps - 1) = ",
               int64_t(o.eagle_topk) * (o.eagle_steps - 1),
               " nodes, more than the 64 a token-tree window holds");
    const int64_t grown = o.eagle_topk + int64_t(o.eagle_steps - 1) * o.eagle_topk * o.eagle_topk;
    KILN_CHECK(o.num_draft_tokens <= std::min<int64_t>(kMaxTreeNodes, grown),
               "tree drafting verifies --speculative-num-draft-tokens - 1 = ", o.num_draft_tokens,
               " nodes, more than the ", std::min<int64_t>(kMaxTreeNodes, grown),
               " it can hold (at most 63, and at most K + (S - 1) K^2 grown)");
  }
  KILN_CHECK(o.ngram_min >= 1 && o.ngram_min <= o.ngram_max && o.ngram_max <= 64, "the n-gram match window [",
             o.ngram_min, ", ", o.ngram_max, "] must satisfy 1 <= min <= max <= 64");
  KILN_CHECK(o.ragged_verify_factor >= 0.0 && o.ragged_verify_min_seqs >= 1,
             "the ragged verify rule needs a factor >= 0 and at least one sequence, got ",
             o.ragged_verify_factor, " and ", o.ragged_verify_min_seqs);
  KILN_CHECK(o.start_off_from_seqs >= 0, "the off switch's start_off_from_seqs must be >= 0 (0: none), got ",
             o.start_off_from_seqs);
}

bool ragged_verify_rows(const SpecOptions& o, int32_t seqs, int64_t drafted, int32_t bucket,
                        int32_t rows_per_seq) {
  return o.ragged_verify_factor > 0.0 && seqs >= o.ragged_verify_min_seqs &&
         double(bucket) * double(rows_per_seq) >= o.ragged_verify_factor * double(int64_t(seqs) + drafted);
}

}  // namespace kiln::spec
