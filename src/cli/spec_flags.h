// Speculative decoding flags of `kiln serve` (src/spec/README.md), SGLang's names and vLLM's JSON:
//   --speculative-algorithm ngram|EAGLE3|none
//   --speculative-draft-model-path DIR    EAGLE3: the draft checkpoint (LlamaForCausalLMEagle3)
//   --speculative-num-steps K             EAGLE3: chain length, K tokens drafted (SGLang's; with
//                                         --speculative-num-draft-tokens it must be K + 1)
//   --speculative-eagle-topk K            EAGLE3: 1 chains of num-steps tokens; K > 1 trees of num-steps
//   levels
//                                         whose num-draft-tokens - 1 best nodes are verified
//   --speculative-num-draft-tokens N      SGLang's count: positions verified per sequence, the last accepted
//                                         token included, so N - 1 tokens are drafted (N >= 2)
//   --speculative-ngram-min-match-window-size A / --speculative-ngram-max-match-window-size B
//   --speculative-config '{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": A,
//                          "prompt_lookup_max": B}'   (vLLM; k tokens drafted; not with the flags above)
#pragma once

#include <algorithm>
#include <climits>
#include <set>
#include <string>

#include "cli/flags.h"
#include "kiln/env.h"
#include "kiln/error.h"
#include "runtime/engine.h"

namespace kiln::cli {

inline const std::set<std::string> kSpecFlags = {"speculative-algorithm",
                                                 "speculative-num-draft-tokens",
                                                 "speculative-ngram-min-match-window-size",
                                                 "speculative-ngram-max-match-window-size",
                                                 "speculative-config",
                                                 "speculative-draft-model-path",
                                                 "speculative-num-steps",
                                                 "speculative-eagle-topk"};

inline void read_spec_flags(const Flags& f, EngineOptions& eo) {
  spec::SpecOptions& so = eo.speculative;
  if (f.has("speculative-config")) {
    for (const std::string& name : kSpecFlags)
      KILN_CHECK(name == "speculative-config" || !f.has(name), "--speculative-config and --", name,
                 " both set the speculative decoding options: give one form");
    spec::apply_vllm_speculative_config(f.str("speculative-config"), &so);
  } else {
    so.algorithm = spec::parse_spec_algorithm(f.str("speculative-algorithm", "none"));
    if (f.has("speculative-num-draft-tokens")) {
      const int64_t n = f.i64("speculative-num-draft-tokens", 0);
      KILN_CHECK(n >= 2 && n <= spec::kMaxDraftTokens + 1, "--speculative-num-draft-tokens must be in [2, ",
                 spec::kMaxDraftTokens + 1, "] (it counts the last accepted token too), got ", n);
      so.num_draft_tokens = int32_t(n - 1);
    }
    const int64_t topk = f.i64("speculative-eagle-topk", 1);
    KILN_CHECK(topk >= 1 && topk <= spec::kMaxEagleTopk, "--speculative-eagle-topk must be in [1, ",
               spec::kMaxEagleTopk, "], got ", topk);
    so.eagle_topk = int32_t(topk);
    if (f.has("speculative-num-steps")) {
      const int64_t k = f.i64("speculative-num-steps", 0);
      KILN_CHECK(k >= 1 && k <= spec::kMaxDraftTokens, "--speculative-num-steps must be in [1, ",
                 spec::kMaxDraftTokens, "], got ", k);
      if (topk > 1) {
        so.eagle_steps = int32_t(k);
        // Without N, SGLang's usual budget for a tree: S x K nodes, within the window.
        if (!f.has("speculative-num-draft-tokens"))
          so.num_draft_tokens = int32_t(std::min<int64_t>(spec::kMaxTreeNodes, k * topk));
      } else {
        KILN_CHECK(!f.has("speculative-num-draft-tokens") || so.num_draft_tokens == k,
                   "--speculative-num-draft-tokens must be --speculative-num-steps + 1 for chain drafting");
        so.num_draft_tokens = int32_t(k);
      }
    }
    KILN_CHECK(
        topk == 1 || f.has("speculative-num-steps"),
        "--speculative-eagle-topk above 1 (tree drafting) needs --speculative-num-steps, the tree's depth");
    so.draft_model_path = f.str("speculative-draft-model-path", "");
    KILN_CHECK(so.draft_model_path.empty() || so.algorithm == spec::SpecAlgorithm::eagle3,
               "--speculative-draft-model-path is for --speculative-algorithm EAGLE3");
    const int64_t lo = f.i64("speculative-ngram-min-match-window-size", so.ngram_min);
    const int64_t hi = f.i64("speculative-ngram-max-match-window-size", so.ngram_max);
    KILN_CHECK(lo >= 1 && hi >= lo && hi <= 64, "the n-gram match window [", lo, ", ", hi,
               "] must satisfy 1 <= min <= max <= 64");
    so.ngram_min = int32_t(lo);
    so.ngram_max = int32_t(hi);
  }
  // KILN_SPEC_RAGGED_VERIFY=F: the ragged verify rule's factor (SpecOptions::ragged_verify_factor; 0: off),
  // for the A/B of docs/PERF.md.
  so.ragged_verify_factor = env_number("KILN_SPEC_RAGGED_VERIFY", so.ragged_verify_factor);
  // KILN_SPEC_START_OFF_FROM=N: batch classes of N sequences and more start with speculation off
  // (SpecOptions::start_off_from_seqs; 0: none), for the A/B of docs/PERF.md SP9 (17 measured slower there).
  so.start_off_from_seqs = int32_t(std::min<int64_t>(
      env_count("KILN_SPEC_START_OFF_FROM", 0, so.start_off_from_seqs, " (0: every batch starts on)"),
      INT32_MAX));
  // KILN_SPEC_INDEX_DURING_FORWARD=0: the n-gram indexes catch up only when a draft is asked for
  // (SpecOptions::index_during_forward), for the A/B of docs/PERF.md.
  so.index_during_forward = env_switch("KILN_SPEC_INDEX_DURING_FORWARD", so.index_during_forward);
  // KILN_SPEC_SHADOW=0: n-gram learns from verify steps (every batch size starts on) instead of shadow drafts
  // (SpecOptions::shadow_drafts), for the A/B of docs/PERF.md.
  so.shadow_drafts = env_switch("KILN_SPEC_SHADOW", so.shadow_drafts);
  spec::validate_spec_options(so);
}

}  // namespace kiln::cli
