// Greedy outputs of a CUDA engine with speculative decoding against its plain greedy outputs
// (test_cuda_verify_graph, test_cuda_eagle3): the tokens of each request, the plain run's top two log-probs
// per token, and where two runs part, whether the plain step's top two were a near tie (by default the verify
// rows take their own M's GEMV tactics, and past 4 rows a sequence the prefill attention kernel, so their
// logits need not be the plain step's bits: docs/NUMERICS.md).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../unit/engine_test_util.h"
#include "runtime/engine.h"

namespace kiln::test {

struct Generated {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<TokenLogprob>>> top;  // per request, per token: the plain path's top 2
  std::vector<std::string> finish;  // per request: its finish reason, and the error after it if any
  EngineStats stats;
  int verify_graphs = 0;  // verify steps that replayed a graph in the run: the engine took the graph path
};

// Submits every prompt (greedy, n new tokens; with_top: the top two log-probs per token; logprobs: each
// request's sampled tokens' log-probs), waits for all.
inline Generated generate_greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int n,
                                 bool with_top, bool ignore_eos = false,
                                 std::vector<std::vector<float>>* logprobs = nullptr) {
  Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r = greedy(p, n);
    r.sampling.ignore_eos = ignore_eos;
    if (with_top) {
      r.sampling.return_logprob = true;
      r.sampling.top_logprobs = 2;
    }
    ids.push_back(engine.submit(r, sink.cb()));
  }
  sink.wait_finished(int(prompts.size()));
  Generated out;
  for (RequestId id : ids) {
    out.tokens.push_back(sink.tokens(id));
    const TokenEvent last = sink.last(id);
    out.finish.push_back(last.finish_reason + (last.error.empty() ? "" : ": " + last.error));
    out.top.emplace_back();
    if (logprobs) logprobs->emplace_back();
    for (const TokenEvent& e : sink.events[id]) {
      for (const auto& t : e.top_logprobs) out.top.back().push_back(t);
      if (logprobs) logprobs->back().insert(logprobs->back().end(), e.logprobs.begin(), e.logprobs.end());
    }
  }
  out.stats = engine.stats();
  return out;
}

// The requests whose tokens part from `want`'s; each parting must be at a token where want's top two
// log-probs are within 0.1 (docs/NUMERICS.md's exemption for greedy tokens that rounding decides).
inline int count_near_tie_partings(const Generated& got, const Generated& want, const std::string& label) {
  int parted = 0;
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    const auto& a = got.tokens[i];
    const auto& b = want.tokens[i];
    size_t j = 0;
    while (j < a.size() && j < b.size() && a[j] == b[j]) ++j;
    if (j == a.size() && j == b.size()) continue;
    EXPECT_LT(j, want.top[i].size()) << label << ": request " << i;
    if (j >= want.top[i].size() || want.top[i][j].size() != 2) return parted + 1;
    const float margin = want.top[i][j][0].logprob - want.top[i][j][1].logprob;
    EXPECT_LT(margin, 0.1f) << label << ": request " << i << " parts at token " << j
                            << " with a top-2 margin of " << margin;
    ++parted;
  }
  return parted;
}

}  // namespace kiln::test
