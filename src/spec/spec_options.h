// SpecOptions: which drafter speculates and how far. Filled from SGLang's flags (--speculative-algorithm,
// --speculative-num-draft-tokens, --speculative-ngram-{min,max}-match-window-size) or vLLM's
// --speculative-config JSON ({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
// "prompt_lookup_max": b}); cli/spec_flags.h reads both.
//
// Counting: num_draft_tokens here is k, the tokens DRAFTED per sequence per step (vLLM's
// num_speculative_tokens); a verify step computes k + 1 positions per sequence (the last accepted token and
// the k drafts). SGLang's --speculative-num-draft-tokens counts those k + 1 positions (its chain EAGLE sets
// it to num_steps + 1), so the flag N gives k = N - 1.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::spec {

enum class SpecAlgorithm { none, ngram, eagle3 };

struct SpecOptions {
  SpecAlgorithm algorithm = SpecAlgorithm::none;
  int32_t num_draft_tokens = 4;  // k, in [1, kMaxDraftTokens]
  int32_t ngram_min = 1;         // match window [ngram_min, ngram_max] (SGLang's defaults)
  int32_t ngram_max = 12;
  // The automatic off switch (spec/off_switch.h): per batch size, verify only where it measures faster.
  bool off_switch = true;
  // A verify step whose uniform graph would compute at least ragged_verify_factor times the rows the drafts
  // need (bucket x (k + 1) against sequences + drafts) runs ragged instead, from ragged_verify_min_seqs
  // sequences: only the drafted sequences take their k + 1 rows, eagerly (ragged_verify_rows). n-gram at
  // C = 32 drafts for one or two sequences a step, and the uniform graph's 32 x 5 rows took 8.8 ms against
  // a 3.9 ms plain step (H200, 2026-12-07, `6f1ce2f`, docs/PERF.md SP5). 0: always the graph where it
  // exists. KILN_SPEC_RAGGED_VERIFY=F sets the factor in kiln serve.
  double ragged_verify_factor = 2.0;
  int32_t ragged_verify_min_seqs = 8;
  // The off switch's batch-size classes of at least this many sequences start off (OffSwitchOptions::
  // start_off_from_seqs; 0: all start on). KILN_SPEC_START_OFF_FROM=N sets it in kiln serve.
  int32_t start_off_from_seqs = 0;
  // n-gram: each step's rows index the tokens that step computes (a prompt chunk's, the decoded token) while
  // its forward runs on the device (Engine's index_during_forward), so a request's first draft finds its
  // prompt indexed instead of indexing it on the step's critical path (32 prompts of 1,024 tokens: ~11 ms of
  // host time at 336 ns a token, docs/PERF.md "Speculative decoding"). false: the index catches up only when
  // a draft is asked for. KILN_SPEC_INDEX_DURING_FORWARD=0 sets false in kiln serve (the A/B).
  bool index_during_forward = true;
  // n-gram with the off switch: shadow drafts decide its probes (OffSwitchOptions::shadow): every batch size
  // starts off and verifies only once drafts made beside plain steps, judged against the tokens those steps
  // decode, promise a gain. At C = 32 on random weights the learning phase's verify steps were what kept
  // n-gram 0.6 % below plain (H100, 2026-12-07, `36e733e`, docs/PERF.md SP10). KILN_SPEC_SHADOW=0 sets
  // false in kiln serve (the A/B).
  bool shadow_drafts = true;
  // EAGLE-3 (SGLang's --speculative-draft-model-path): the draft checkpoint (model/eagle3_model.h), loaded
  // beside the target by load_qwen3_runner; k is its --speculative-num-steps (chains, top-1).
  std::string draft_model_path;
  // EAGLE-3 tree drafting (SGLang's --speculative-eagle-topk K > 1, --speculative-num-steps S,
  // --speculative-num-draft-tokens N): S draft steps grow a tree, each expanding the K best frontier nodes by
  // their K best tokens and keeping the K best children by cumulative draft log-probability as the next
  // frontier; the verify step takes the k = N - 1 best nodes (num_draft_tokens) as a token tree
  // (runtime/engine_tree.cpp). K = 1: chains of k = S tokens (eagle_steps unused).
  int32_t eagle_topk = 1;
  int32_t eagle_steps = 0;
  bool tree() const { return algorithm == SpecAlgorithm::eagle3 && eagle_topk > 1; }
  bool enabled() const { return algorithm != SpecAlgorithm::none; }
};

inline constexpr int32_t kMaxDraftTokens = 64;
// Tree drafting: the K of --speculative-eagle-topk, and the nodes a tree may hold (its verify step's rows,
// the root's included, and the draft's expanded nodes each fit a token-tree window of 64: kiln/batch.h).
inline constexpr int32_t kMaxEagleTopk = 16;
inline constexpr int32_t kMaxTreeNodes = 63;

// Whether a verify step of `seqs` sequences carrying `drafted` draft tokens in all runs ragged rather than as
// the uniform verify graph of `bucket` sequences x `rows_per_seq` rows (SpecOptions::ragged_verify_factor).
bool ragged_verify_rows(const SpecOptions& o, int32_t seqs, int64_t drafted, int32_t bucket,
                        int32_t rows_per_seq);

// "ngram", "eagle3" (any case) or "none" / ""; anything else is an error naming what is accepted.
SpecAlgorithm parse_spec_algorithm(const std::string& name);
const char* spec_algorithm_name(SpecAlgorithm a);
// vLLM's --speculative-config: a JSON object; "method" (required), "num_speculative_tokens",
// "prompt_lookup_min", "prompt_lookup_max" update *o; other keys are errors (a silently ignored knob would
// mislead). Throws kiln::Error naming the bad field.
void apply_vllm_speculative_config(const std::string& json, SpecOptions* o);
// Throws kiln::Error naming the first bad field (EAGLE-3 without a draft path among them).
void validate_spec_options(const SpecOptions& o);

}  // namespace kiln::spec
