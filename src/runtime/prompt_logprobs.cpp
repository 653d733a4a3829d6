// The host reduction of a logits row (runtime/prompt_logprobs.h), the default ModelRunner::forward_logprobs,
// and the engine's part: which rows of a step are asked, and where their answers go.
#include "runtime/prompt_logprobs.h"

#include <algorithm>
#include <cmath>

#include "runtime/engine_impl.h"

namespace kiln {

void validate_prompt_queries(const Request& r, int64_t vocab, int64_t max_prompt_logprob_tokens) {
  const bool asks = r.prompt_logprobs_from >= 0 || !r.score_ids.empty();
  KILN_CHECK(!asks || !r.embedding, "prompt logprobs and scores need a generation request, not an embedding");
  KILN_CHECK(r.prompt_logprobs_from >= -1, "prompt_logprobs_from must be -1 (none) or >= 0, got ",
             r.prompt_logprobs_from);
  KILN_CHECK(r.prompt_top_logprobs >= 0 && r.prompt_top_logprobs <= kMaxPromptTopLogprobs,
             "prompt_top_logprobs must be in [0, ", kMaxPromptTopLogprobs, "], got ", r.prompt_top_logprobs);
  KILN_CHECK(r.prompt_top_logprobs == 0 || r.prompt_logprobs_from >= 0,
             "prompt_top_logprobs needs prompt_logprobs_from");
  if (r.prompt_logprobs_from >= 0) {
    const int64_t asked =
        std::max<int64_t>(0, int64_t(r.prompt.size()) - std::max<int64_t>(1, r.prompt_logprobs_from));
    KILN_CHECK(asked <= max_prompt_logprob_tokens, "prompt logprobs asked for ", asked,
               " prompt positions; the limit is max_prompt_logprob_tokens = ", max_prompt_logprob_tokens);
  }
  KILN_CHECK(r.score_ids.size() <= kMaxScoreIds, "at most ", kMaxScoreIds, " score ids, got ",
             r.score_ids.size());
  for (int32_t id : r.score_ids)
    KILN_CHECK(id >= 0 && id < vocab, "score id ", id, " is outside the vocabulary [0, ", vocab, ")");
}

RowLogprobs row_logprobs(std::span<const float> x, const std::vector<int32_t>& ids, int top_n) {
  const size_t V = x.size();
  KILN_CHECK(V > 0, "row_logprobs: empty row");
  KILN_CHECK(top_n >= 0 && size_t(top_n) <= V, "row_logprobs: top_n ", top_n, " out of range");
  float m = x[0];
  for (float v : x) m = std::max(m, v);
  double sum = 0.0;
  for (float v : x) sum += std::exp(double(v) - double(m));
  const float lse = float(double(m) + std::log(sum));
  RowLogprobs out;
  for (int32_t id : ids) {
    KILN_CHECK(id >= 0 && size_t(id) < V, "row_logprobs: id ", id, " outside [0, ", V, ")");
    const float xi = x[size_t(id)];
    int32_t rank = 1;
    for (float v : x) rank += v > xi ? 1 : 0;
    out.logprobs.push_back(xi - lse);
    out.ranks.push_back(rank);
  }
  if (top_n > 0) {
    std::vector<int32_t> idx(V);
    for (size_t i = 0; i < V; ++i) idx[i] = int32_t(i);
    std::partial_sort(idx.begin(), idx.begin() + top_n, idx.end(), [&](int32_t a, int32_t b) {
      return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b);
    });
    for (int i = 0; i < top_n; ++i) out.top.push_back({idx[size_t(i)], x[size_t(idx[size_t(i)])] - lse});
  }
  return out;
}

void ModelRunner::forward_logprobs(const BatchDesc& batch, std::vector<float>* logits,
                                   std::vector<float>* hidden, const std::vector<LogprobQuery>& queries,
                                   std::vector<RowLogprobs>* out) {
  if (queries.empty()) {
    out->clear();
    return forward(batch, logits, hidden);
  }
  // One forward over the union of the sample rows and the query rows; then the sample rows' logits and
  // hidden states are put back in batch.logit_rows' order.
  BatchDesc b = batch;
  std::vector<int32_t> rows = batch.logit_rows;
  for (const LogprobQuery& q : queries) rows.push_back(q.row);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  b.logit_rows = rows;
  auto at = [&](int32_t row) {
    return size_t(std::lower_bound(rows.begin(), rows.end(), row) - rows.begin());
  };
  std::vector<float> all_logits, all_hidden;
  forward(b, &all_logits, hidden ? &all_hidden : nullptr);
  const size_t V = size_t(config().vocab_size), H = size_t(config().hidden_size);
  KILN_CHECK_EQ(all_logits.size(), rows.size() * V, "forward returned the wrong number of logits");
  out->clear();
  for (const LogprobQuery& q : queries) {
    const float* row = all_logits.data() + at(q.row) * V;
    out->push_back(row_logprobs(std::span<const float>(row, V), q.ids, q.top_n));
  }
  if (logits) {
    logits->resize(batch.logit_rows.size() * V);
    for (size_t k = 0; k < batch.logit_rows.size(); ++k)
      std::copy_n(all_logits.data() + at(batch.logit_rows[k]) * V, V, logits->data() + k * V);
  }
  if (hidden) {
    hidden->resize(batch.logit_rows.size() * H);
    for (size_t k = 0; k < batch.logit_rows.size(); ++k)
      std::copy_n(all_hidden.data() + at(batch.logit_rows[k]) * H, H, hidden->data() + k * H);
  }
}

Engine::Impl::StepQueries Engine::Impl::step_queries(const StepPlan& plan) const {
  StepQueries sq;
  const BatchDesc& batch = plan.batch;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    const Live& L = live.at(r.seq->id);
    // Once handed out (a request preempted after its first token recomputes its prompt) nothing is asked
    // again.
    const int32_t from = L.prompt_logprobs_sent ? -1 : L.req.prompt_logprobs_from, n = r.seq->prompt_len;
    if (from < 0 && L.req.score_ids.empty()) continue;
    for (int32_t t = batch.cu_q[i]; t < batch.cu_q[i + 1]; ++t) {
      const int32_t pos = r.begin + (t - batch.cu_q[i]);  // this row's logits predict position pos + 1
      if (from >= 0 && pos + 1 >= std::max(1, from) && pos + 1 < n) {
        sq.queries.push_back({t, {L.req.prompt[size_t(pos + 1)]}, L.req.prompt_top_logprobs});
        sq.targets.push_back({r.seq->id, pos + 1});
      }
      if (!L.req.score_ids.empty() && pos == n - 1) {
        sq.queries.push_back({t, L.req.score_ids, 0});
        sq.targets.push_back({r.seq->id, -1});
      }
    }
  }
  return sq;
}

void Engine::Impl::keep_answers(const StepQueries& sq, std::vector<RowLogprobs>& answers) {
  KILN_CHECK_EQ(answers.size(), sq.queries.size(), "the runner answered the wrong number of logprob queries");
  for (size_t k = 0; k < answers.size(); ++k) {
    auto it = live.find(sq.targets[k].id);
    if (it == live.end()) continue;
    Live& L = it->second;
    RowLogprobs& a = answers[k];
    const int32_t pos = sq.targets[k].position;
    if (pos < 0) {
      L.score_logprobs = std::move(a.logprobs);
      continue;
    }
    // Positions [first, prompt length); a preempted request recomputes them: the same values again.
    const int32_t first = std::max(1, L.req.prompt_logprobs_from);
    if (L.prompt_logprobs.empty()) L.prompt_logprobs.resize(size_t(L.prompt_tokens - first));
    PromptTokenLogprob& p = L.prompt_logprobs.at(size_t(pos - first));
    p.position = pos;
    p.id = sq.queries[k].ids[0];
    p.logprob = a.logprobs.at(0);
    p.rank = a.ranks.at(0);
    p.top = std::move(a.top);
  }
}

void Engine::Impl::attach_prompt_answers(Live& L, TokenEvent& ev) {
  if (!L.prompt_logprobs_sent && L.req.prompt_logprobs_from >= 0) {
    ev.prompt_logprobs = std::move(L.prompt_logprobs);
    L.prompt_logprobs_sent = true;
  }
  if (!L.req.score_ids.empty()) ev.score_logprobs = L.score_logprobs;
}

}  // namespace kiln
