// SpecStats: speculative decoding's counters, cumulative since the engine started (EngineStats::spec), named
// after vLLM's Prometheus series so the server can export them as they are:
//   vllm:spec_decode_num_drafts                 drafts        verify rows that carried at least one draft
//   vllm:spec_decode_num_draft_tokens           draft_tokens  drafted tokens verified
//   vllm:spec_decode_num_accepted_tokens        accepted_tokens
//   vllm:spec_decode_num_accepted_tokens_per_pos accepted_per_pos[i]: drafts whose token i was accepted
// Derived: acceptance rate = accepted_tokens / draft_tokens; mean acceptance length (tokens per verify row,
// the target's own token included, SGLang's "accept length") = 1 + accepted_tokens / drafts.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::spec {

struct SpecStats {
  int64_t verify_steps = 0;  // engine steps that ran a verify pass
  // Of those, steps a verify graph could have run but that ran ragged: few sequences had drafts
  // (SpecOptions::ragged_verify_factor).
  int64_t ragged_verify_steps = 0;
  // Of those, steps that verified EAGLE-3 token trees (SpecOptions::tree; draft_tokens counts their nodes).
  int64_t tree_verify_steps = 0;
  int64_t tree_moved_tokens = 0;  // kept tree nodes whose KV moved to their path's position (move_kv)
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [k]
  int64_t switched_off = 0;               // times the off switch turned speculation off for a batch size
  // n-gram shadow drafts (OffSwitchOptions::shadow): drafts made where speculation was off, judged against
  // the tokens the plain steps then decoded, and the tokens a verify step would have kept of them.
  int64_t shadow_drafts = 0;
  int64_t shadow_accepted_tokens = 0;
  int64_t draft_passes = 0;          // EAGLE-3: draft model passes run (after steps and in chains)
  int64_t uniform_draft_passes = 0;  // EAGLE-3: of those after steps, the uniform ones (q rows a sequence)
  int64_t draft_failures = 0;  // EAGLE-3: passes that threw (their rows drafted nothing; outputs unchanged)
  // Where a speculative workload's time goes (host wall seconds; docs/PERF.md "Speculative decoding"):
  double draft_seconds = 0.0;  // making drafts: n-gram lookups, EAGLE-3 passes (their device waits included)
  double draft_chain_seconds = 0.0;  // EAGLE-3: the part of draft_seconds in chains (the rest: after steps)
  // n-gram: tokens indexed while a step's forward ran on the device (SpecOptions::index_during_forward), and
  // the host seconds it took (not in draft_seconds: off the step's critical path while the forward is
  // longer).
  int64_t indexed_during_forward = 0;
  double index_during_forward_seconds = 0.0;
  // Decode-only steps from their start to their end (the off switch's measure): those that verified drafts
  // (an EAGLE-3 step's draft passes included) and those that ran plain while speculation was configured.
  double verify_step_seconds = 0.0;
  int64_t timed_verify_steps = 0;
  double plain_step_seconds = 0.0;
  int64_t timed_plain_steps = 0;

  // One verify row: `drafted` tokens proposed, the first `accepted` of them kept.
  void observe_row(int32_t drafted, int32_t accepted) {
    if (drafted <= 0) return;
    ++drafts;
    draft_tokens += drafted;
    accepted_tokens += accepted;
    if (accepted_per_pos.size() < size_t(drafted)) accepted_per_pos.resize(size_t(drafted), 0);
    for (int32_t i = 0; i < accepted; ++i) ++accepted_per_pos[size_t(i)];
  }
  double acceptance_rate() const {
    return draft_tokens > 0 ? double(accepted_tokens) / double(draft_tokens) : 0.0;
  }
  double mean_acceptance_length() const {
    return drafts > 0 ? 1.0 + double(accepted_tokens) / double(drafts) : 0.0;
  }
};

// Per request (TokenEvent::spec): the same counts over its own verify rows.
struct SpecRequestStats {
  int32_t verify_rows =
      0;  // verify rows with a draft (vLLM's per-request num_drafts, SGLang's spec_verify_ct)
  int32_t draft_tokens = 0;
  int32_t accepted_tokens = 0;
  // Tokens per verify row, the target's own included (0 before the first verify row).
  double accept_length() const {
    return verify_rows > 0 ? 1.0 + double(accepted_tokens) / double(verify_rows) : 0.0;
  }
};

}  // namespace kiln::spec
