// Engine internals shared by engine.cpp (threads, submit, stats) and engine_loop.cpp (the step loop).
// Not a public header: only the runtime includes it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <unordered_map>

#include "runtime/engine.h"
#include "runtime/grammar_masks.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "spec/draft_tree.h"
#include "spec/ngram_index.h"
#include "spec/off_switch.h"

namespace kiln {

using Clock = std::chrono::steady_clock;

struct Incoming {
  RequestId id;
  Request req;
  std::function<void(const TokenEvent&)> on_event;
  Clock::time_point t_submit;
};

// EAGLE-3 (engine_eagle3.cpp): where a request's draft chain starts. After the draft pass over its last
// computed position `pos`, `next` is the draft's token for position pos + 2 and `hidden` [H] that pass's
// midlayer output (the chain's next input). pos == -1: no chain (the next verify step drafts nothing).
struct Eagle3Chain {
  int32_t pos = -1;
  int32_t next = -1;
  std::vector<float> hidden;
  // Tree drafting (SpecOptions::tree): that pass's K best draft tokens (next first) and their draft
  // log-probabilities, the tree's first level.
  std::vector<int32_t> topk;
  std::vector<float> topk_logp;
};

// n-gram shadow draft (engine_spec.cpp, spec/off_switch.h): `tokens` proposed when the sequence held `at`
// tokens, in a step of `seqs` sequences; judged as the plain steps decode positions at, at + 1, ...
// (at == -1: none pending).
struct ShadowDraft {
  int64_t at = -1;
  int32_t seqs = 0;
  std::vector<int32_t> tokens;
};

// Engine-thread state of one accepted request.
struct Live {
  Request req;
  std::function<void(const TokenEvent&)> on_event;
  uint64_t seed = 0;                 // the request's seed, or one derived from the engine seed and the id
  std::unique_ptr<Sampler> sampler;  // the request's own generator: draws do not depend on batching
  Clock::time_point t_submit, t_first, t_last;
  int prompt_tokens = 0;
  int completion = 0;
  int cached_tokens = -1;  // set at the first admission (a preempted request re-matches its own pages)
  std::unique_ptr<Sequence> held;    // not admitted yet: waits for its after_prefill_of request
  std::vector<RequestId> followers;  // requests held until this one has computed its prompt
  // Mean / CLS pooling (embedding models): the sum of the pooled prompt rows' hidden states so far.
  std::vector<double> pool_sum;
  int64_t pooled = 0;
  spec::SpecRequestStats spec;  // its verify rows (engine_spec.cpp)
  Eagle3Chain eagle;
  ShadowDraft shadow;
  // Request::prompt_logprobs_from / score_ids (prompt_logprobs.cpp): answers gathered over the prefill steps.
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  std::vector<float> score_logprobs;
  std::shared_ptr<GrammarState> grammar;  // structured output; shared with a mask worker during a step
};

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Engine::Impl {
  EngineOptions opts;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<Scheduler> sched;
  int64_t context_limit = 0;  // min(max_context_len, pool capacity)
  int64_t max_context = 0;
  bool device_sampling = true;  // try ModelRunner::forward_sampled first
  bool pool_all_rows = false;   // mean / CLS pooling: every prompt row's hidden state, not only the last
  // The time bound on prefill steps (EngineOptions::max_prefill_chunk_ms resolved; 0: off) and the prefill
  // tokens the next step may compute under it (from the last measured rate; kPrefillProbe at first).
  static constexpr int64_t kPrefillProbe = 128, kPrefillMin = 16;
  int64_t prefill_ms = 0;
  int64_t prefill_cap = kPrefillProbe;
  void observe_prefill(int64_t tokens, Clock::time_point t0);

  // Shared with other threads, under mu.
  mutable std::mutex mu;
  std::condition_variable cv, flush_cv;
  std::deque<Incoming> incoming;
  std::vector<RequestId> aborts;
  uint64_t flush_requested = 0, flush_done = 0;
  bool stopping = false, drain = true, thread_done = false;
  std::string fatal;  // the runner can run no more steps (RunnerFatalError): the engine stopped with this
  EngineStats snapshot;
  RequestId next_id = 1;
  std::thread thread;

  // Engine thread only.
  std::unordered_map<RequestId, Live> live;
  EngineStats counters;                         // the counter and histogram fields
  std::vector<float> logits_host, hidden_host;  // [logit rows, vocab] / [logit rows, hidden]

  // The overlap schedule (EngineOptions::overlap_schedule): the decode step launched and not yet collected,
  // and the requests that ended while their sequence is in it (its KV write still lands in their pages:
  // released once it is collected).
  struct InFlight {
    StepPlan plan;
    int top_n = 0;
    bool sampled = true;   // false: only its forward is queued (launch_forward; constrained rows)
    bool chained = false;  // launched by launch_continuation while its predecessor ran
  };
  // When step_in_flight last collected a step: a chained step's cost under the overlap schedule is the time
  // from its predecessor's collection to its own (the off switch's plain cost where speculation is off).
  Clock::time_point last_collect{};
  bool overlap = false;
  std::optional<InFlight> inflight;
  std::vector<RequestId> deferred_release;

  // Structured output: the mask workers, and the rows of the step being planned whose mask failed or came
  // too late (the request ends with this error when the step completes).
  std::unique_ptr<GrammarMaskPool> mask_pool;
  std::unordered_map<RequestId, std::string> grammar_failed;
  // Starts the masks of the plan's sample rows that draw under an active grammar; returns their row indices.
  std::vector<size_t> start_masks(const StepPlan& plan, const std::function<bool(size_t)>& wants_token);
  // Waits for them (at most grammar_mask_timeout_ms) and hands each done mask to its request's processor;
  // a late or failed one goes to grammar_failed.
  void finish_masks(const StepPlan& plan, const std::vector<size_t>& rows, Clock::time_point t_start);
  // After a step that did not complete: its masks leave the processors (failures stay in grammar_failed: the
  // request ends with one when a step completes it, or ends otherwise first).
  void clear_masks(const StepPlan& plan);
  // Speculative decoding: cuts `draft` before the first token the grammar refuses (and before an EOS), and
  // gives the mask of each position a verify step computes for it (positions 0 .. draft.size(), each after
  // the drafts before it), computed here on the engine thread; the matcher is left as it was. False (nothing
  // cut, no masks) when the matcher failed: the row then takes no verify step.
  bool draft_masks(GrammarState& g, std::vector<int32_t>& draft, std::vector<std::vector<uint32_t>>* masks);
  void validate(const Request& r) const;
  void loop();
  void step();
  // Overlap: whether `plan` (padded, validated) can go by ModelRunner::launch_sampled, with these rows'
  // parameters; `ahead`: as the continuation of a step in flight (each row one token further).
  // constrained: set when a row is under a grammar; such a plan may go only by launch_forward, its sampling
  // queued once its masks are known (sample_deferred).
  bool launchable(const StepPlan& plan, bool ahead, bool* constrained) const;
  // Rows of requests that have ended get default parameters (their draws are dropped).
  std::vector<ModelRunner::RowSampling> row_sampling(const StepPlan& plan, uint64_t ahead) const;
  // How a request's token number `token` (0 = its first generated token) is drawn on the device: its
  // sampling parameters, seed and processor. Plain steps and verify positions share it, so a verify position
  // draws exactly as the plain step drawing that token would.
  static ModelRunner::RowSampling draw_params(RequestId id, const Live& L, uint64_t token);
  // A step whose forward was launched ahead (constrained rows; its predecessor's tokens now seen): its masks
  // on the mask workers while its forward runs, then its sampling queued. On failure its rows end in error.
  void sample_deferred();
  void step_in_flight();  // launches the continuation of `inflight` when it can, then collects `inflight`
  std::optional<InFlight> launch_continuation(const InFlight& cur);
  bool in_flight(RequestId id) const;
  void release_deferred();
  // The tokens of a finished step: finalize, then each sample row's event (or its end).
  void complete_step(const StepPlan& plan, const std::vector<int32_t>& sampled, std::vector<Draw>& draws,
                     bool need_hidden);
  void accept(Incoming in);
  void admit(RequestId id, std::unique_ptr<Sequence> seq);
  void release_followers(Live& leader);  // admits the requests held for its prompt
  int num_held = 0;                      // Live entries with a held sequence
  void emit(RequestId id, Live& L, TokenEvent& ev);
  void finish(RequestId id, const std::string& reason, const std::string& error = {},
              TokenEvent* ev = nullptr);
  void publish(bool full);

  // Prompt logprobs and scores (prompt_logprobs.cpp): the step's queries and, per query, whose answer it is
  // (position -1: the request's score row); the answers kept in Live; handed out on the first event.
  struct QueryTarget {
    RequestId id = 0;
    int32_t position = -1;
  };
  struct StepQueries {
    std::vector<LogprobQuery> queries;
    std::vector<QueryTarget> targets;
  };
  StepQueries step_queries(const StepPlan& plan) const;
  void keep_answers(const StepQueries& sq, std::vector<RowLogprobs>& answers);
  void attach_prompt_answers(Live& L, TokenEvent& ev);

  // Speculative decoding (engine_spec.cpp): each request's n-gram index, and the verify step that replaces a
  // decode-only step whose rows have drafts (true: the step ran, events and all; false: nothing changed).
  std::unordered_map<RequestId, spec::NgramIndex> ngram;
  // t0: when the step began (the off switch's measure of a verify step runs from there).
  bool spec_step(StepPlan& plan, Clock::time_point t0);
  // n-gram (SpecOptions::index_during_forward): each verifiable row's index takes the tokens up to the end of
  // what the step computes (a prompt chunk, the decoded token). Called while the step's forward runs on the
  // device (forward_sampled's before_sample; a step launched ahead, while its predecessor is collected), so
  // a request's first draft finds its prompt indexed and a probe of the off switch finds its index current.
  void index_during_forward(const StepPlan& plan);
  // A row's index (made where missing, remade where it has more tokens than the sequence: a recompute).
  spec::NgramIndex& ngram_index(const Sequence& s);
  spec::SpecOffSwitch off_switch;
  // n-gram shadow drafts (SpecOptions::shadow_drafts): after a plain step's tokens are appended, each row's
  // pending shadow draft is judged against them, and at a batch size where speculation is off up to
  // kShadowRowsPerStep rows without one propose a new one (rotating over the rows), for the off switch's
  // observe_shadow.
  bool shadow = false;
  static constexpr int32_t kShadowRowsPerStep = 8;
  size_t shadow_row = 0;  // where the next step's proposals start
  void shadow_drafts(const StepPlan& plan);
  // A decode-only step of `seqs` sequences ended (plain or verify): its cost goes to the off switch.
  // forward_seconds (a plain step's, >= 0): the part of it the runner's forward took.
  void observe_decode_step(bool verify, int32_t seqs, Clock::time_point t0, double tokens_per_seq,
                           double forward_seconds = -1.0);
  static bool decode_only(const StepPlan& plan);
  // Tokens the request may still emit: within max_new_tokens and max_len (k drafts emit up to k + 1).
  static int64_t token_room(const Live& L, const Sequence& s);
  // Whether a decode step of `seqs` sequences may launch ahead (the overlap schedule): always without
  // speculation; with it, only where the off switch has turned it off for that batch size, so a plan with
  // drafts is never launched past. launch_continuation also stops a chain when a probe is due.
  bool spec_allows_overlap(int32_t seqs) const {
    if (eagle) return false;  // every step's features feed the draft pass after it
    return !opts.speculative.enabled() || (opts.speculative.off_switch && off_switch.is_off(seqs));
  }
  // EAGLE-3 (engine_eagle3.cpp). eagle: --speculative-algorithm EAGLE3 on a runner with a draft.
  bool eagle = false;
  // After a step's finalize (the kept drafts and the drawn tokens appended): the draft pass over every
  // position the step computed whose next token is known now, from the step's features (rows of
  // `step_batch`, the batch the runner ran; plan row i's positions start at its row cu_q[i]); it writes those
  // positions' draft KV and, for each sequence that decodes next, leaves its Eagle3Chain. A failed pass
  // clears the chains of the plan's requests (they draft nothing until their next pass); outputs are
  // unchanged.
  // extend_rows (null: row i's positions are its rows from cu_q[i] in order): per plan row, the step rows of
  // its computed positions in position order (a tree verify step's root and kept nodes).
  void eagle_extend(const StepPlan& plan, const BatchDesc& step_batch,
                    const std::vector<std::vector<int32_t>>* extend_rows = nullptr);
  // Set by step() for a plain decode-only step at a batch size where the off switch has turned speculation
  // off and no probe is due: eagle_extend then only clears the plan's chains (their requests draft nothing
  // until a pass runs again, and the skipped positions' draft KV stays unwritten: drafts read it as it is,
  // outputs stay exact). The probe after the off interval verifies chains over that KV.
  bool eagle_skip_pass = false;
  // The chains of the plan's decode rows: row i drafts count[i] tokens (its chain's `next`, then count[i] - 1
  // draft passes over one row each, at positions begin, begin + 1, ...; their pages are reserved). Throws
  // what a pass throws.
  std::vector<std::vector<int32_t>> eagle_chain(const StepPlan& plan, const std::vector<int32_t>& count);
  void eagle_chain_on_device(const StepPlan& plan, const std::vector<int32_t>& count, int32_t longest,
                             const std::vector<std::vector<float>>& hidden,
                             std::vector<std::vector<int32_t>>& drafts);
  static bool eagle_device_chain();
  // A draft pass threw: counted (SpecStats::draft_failures) and said on stderr; its rows draft nothing.
  void eagle_pass_failed(const char* why);
  // Whether every row that wants a token has no logit processing, grammar, min_p or logprobs, on a runner
  // that may sample on the device: the verify step then asks the runner for each position's token as the
  // plain step would draw it (verify_row_sampling) and keeps the drafts equal to those draws.
  bool verify_on_device(const StepPlan& plan, const std::vector<uint8_t>& wants) const;
  // The RowSampling of a verify position that draws row's request's token completion + ahead as the plain
  // step drawing it would (its seed, that step counter), without processing (verify_on_device).
  ModelRunner::RowSampling verify_draw(const StepRow& row, uint64_t ahead) const;
  // One RowSampling per logit row of a verify batch: row i's position j (logit row logit_base[i] + j) is
  // verify_draw(row i, j).
  std::vector<ModelRunner::RowSampling> verify_row_sampling(const StepPlan& plan,
                                                            const std::vector<uint8_t>& wants,
                                                            const std::vector<std::vector<int32_t>>& drafts,
                                                            const std::vector<int32_t>& logit_base,
                                                            size_t logit_rows) const;
  // masks: per position, the grammar's mask (empty: the row is not constrained).
  using PositionMasks = std::vector<std::vector<uint32_t>>;
  // The end of every verify step (chains and trees): each row's emitted tokens (kept drafts, then the
  // target's) join its sequence, up to a stop; finalize; give_back_pages (the reserved pages past each
  // sequence); the draft pass after the step (eagle_extend with extend_rows); the events; the step's cost to
  // the off switch where timed. drafted[i]: the drafts row i verified.
  void commit_verify(StepPlan& plan, std::vector<std::vector<int32_t>>& emitted,
                     const std::vector<int32_t>& drafted, std::vector<std::vector<Draw>>& draws,
                     const BatchDesc& batch, const std::vector<std::vector<int32_t>>* extend_rows,
                     const std::function<void()>& give_back_pages, bool timed, Clock::time_point t0);
  void truncate_at_stop(const Live& L, std::vector<int32_t>& emitted) const;  // cut after a stop token
  // Runs an EAGLE-3 draft (chains or trees), its seconds to the draft counters; false where it threw (counted
  // and said by eagle_pass_failed: the step then runs plain).
  bool eagle_draft(const std::function<void()>& draft);
  void fail_plan(const StepPlan& plan, const std::string& why);  // every request of the plan ends in error
  // EAGLE-3 tree drafting (engine_tree.cpp; SpecOptions::tree): the verify step of a decode plan whose rows
  // have chains; wants / asked as spec_step computed them (asked[i] > 0: row i drafts). Returns as spec_step.
  bool eagle_tree_step(StepPlan& plan, Clock::time_point t0, bool timed, const std::vector<uint8_t>& wants,
                       const std::vector<int32_t>& asked);
  // The trees of the rows with depth[i] > 0: depth[i] levels, at most budget[i] nodes (engine_tree.cpp).
  std::vector<spec::DraftTree> eagle_trees(const StepPlan& plan, const std::vector<int32_t>& depth,
                                           const std::vector<int32_t>& budget);
  std::vector<int32_t> verify_row(Live& L, const float* logits, std::span<const int32_t> draft,
                                  const PositionMasks& masks) const;
  // The logprobs (and top alternatives) of a verify row's emitted tokens, when the request asks for them.
  std::vector<Draw> emitted_logprobs(const Live& L, const float* logits, const std::vector<int32_t>& tokens,
                                     const PositionMasks& masks) const;
  void deliver_verified(RequestId id, const std::vector<int32_t>& tokens, std::vector<Draw>& draws);
};

}  // namespace kiln
