#include "runtime/fake_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>

#include "kiln/error.h"
#include "model/kv_cache.h"
#include "runtime/kv_pool.h"

namespace kiln {

namespace {
uint64_t context_hash(const int32_t* context, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; ++i) h = (h ^ uint64_t(context[i] + 1)) * 1099511628211ull;
  return h ^ (h >> 29);
}
}  // namespace

FakeRunner::FakeRunner(int64_t vocab, int64_t hidden, int32_t eos, int64_t max_positions) {
  KILN_CHECK(vocab >= 2 && hidden >= 1);
  config_.architecture = "FakeForCausalLM";
  config_.vocab_size = vocab;
  config_.hidden_size = hidden;
  config_.intermediate_size = hidden;
  config_.num_layers = 1;
  config_.num_heads = 1;
  config_.num_kv_heads = 1;
  config_.head_dim = hidden;
  config_.max_position_embeddings = max_positions;
  if (eos >= 0) config_.eos_token_ids = {eos};
}

void FakeRunner::allocate_kv(int32_t num_pages, int32_t page_size) {
  page_size_ = page_size;
  slot_token_.assign(size_t(num_pages) * size_t(page_size), -1);
  slot_pos_.assign(slot_token_.size(), -1);
}

void FakeRunner::move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  KILN_CHECK(page_size_ > 0, "FakeRunner: allocate_kv was not called");
  KvCache::check_slot_moves(from, to, int64_t(slot_token_.size()));
  std::vector<int64_t> token(from.size()), pos(from.size());
  for (size_t i = 0; i < from.size(); ++i) {  // every source read before any destination is written
    token[i] = slot_token_[size_t(from[i])];
    pos[i] = slot_pos_[size_t(from[i])];
  }
  for (size_t i = 0; i < to.size(); ++i) {
    slot_token_[size_t(to[i])] = token[i];
    slot_pos_[size_t(to[i])] = pos[i];
  }
}

int32_t FakeRunner::graph_bucket(const BatchDesc& batch) const {
  if (graph_buckets.empty() || !is_graphable_decode(batch)) return 0;
  for (int32_t b : graph_buckets)
    if (b >= batch.num_seqs()) return b;
  return 0;
}

void FakeRunner::write_logits(const int32_t* context, int64_t n, float* row) const {
  const uint64_t h = context_hash(context, n);
  const int64_t V = config_.vocab_size;
  for (int64_t v = 0; v < V; ++v) row[v] = float((uint64_t(v) * 7919u + h) % 97u) / 97.0f;
  row[h % uint64_t(V)] = 2.0f;
}

int32_t FakeRunner::next_token(const int32_t* context, int64_t n) const {
  return int32_t(context_hash(context, n) % uint64_t(config_.vocab_size));
}

std::vector<int32_t> FakeRunner::reference(const std::vector<int32_t>& prompt, int steps,
                                           bool stop_at_eos) const {
  std::vector<int32_t> ctx = prompt, out;
  for (int i = 0; i < steps; ++i) {
    const int32_t t = next_token(ctx.data(), int64_t(ctx.size()));
    out.push_back(t);
    ctx.push_back(t);
    if (stop_at_eos && !config_.eos_token_ids.empty() && t == config_.eos_token_ids[0]) break;
  }
  return out;
}

void FakeRunner::hold_steps() {
  std::lock_guard<std::mutex> lk(gate_mu_);
  gate_held_ = true;
}

void FakeRunner::release_steps() {
  {
    std::lock_guard<std::mutex> lk(gate_mu_);
    gate_held_ = false;
  }
  gate_cv_.notify_all();
}

void FakeRunner::wait_until_held() {
  std::unique_lock<std::mutex> lk(gate_mu_);
  gate_cv_.wait(lk, [&] { return gate_held_ && gate_waiting_ > 0; });
}

void FakeRunner::forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) {
  {
    std::unique_lock<std::mutex> lk(gate_mu_);
    ++gate_waiting_;
    gate_cv_.notify_all();
    gate_cv_.wait(lk, [&] { return !gate_held_; });
    --gate_waiting_;
  }
  if (on_forward) on_forward();
  if (ms_per_prefill_token > 0.0) {
    int64_t prefill = 0;
    for (int b = 0; b < batch.num_seqs(); ++b)
      if (batch.q_len(b) > 1) prefill += batch.q_len(b);
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(ms_per_prefill_token * double(prefill)));
  }
  KILN_CHECK(page_size_ > 0 && batch.page_size == page_size_,
             "FakeRunner: KV not allocated for this page size");
  if (fail_at_step == steps) {
    ++steps;
    KILN_FAIL("FakeRunner: injected failure");
  }
  ++steps;
  if (!batch.logit_rows.empty()) ++logit_steps;
  step_tokens.push_back(batch.num_tokens());
  const int B = batch.num_seqs();
  bool has_decode = false, has_prefill = false;
  int real_seqs = 0;
  for (int t = 0; t < batch.num_tokens(); ++t) {
    const int64_t s = batch.slot_mapping[size_t(t)];
    if (s < 0) continue;
    KILN_CHECK(s < int64_t(slot_token_.size()), "FakeRunner: slot out of range");
    slot_token_[size_t(s)] = batch.tokens[size_t(t)];
    slot_pos_[size_t(s)] = batch.positions[size_t(t)];
  }
  const int64_t V = config_.vocab_size, H = config_.hidden_size;
  if (logits) logits->assign(batch.logit_rows.size() * size_t(V), 0.0f);
  if (hidden) hidden->assign(batch.logit_rows.size() * size_t(H), 0.0f);
  size_t next_logit = 0;
  std::vector<int32_t> ctx;
  for (int b = 0; b < B; ++b) {
    const int32_t q = batch.q_len(b);
    const bool padding =
        std::all_of(batch.slot_mapping.begin() + batch.cu_q[b],
                    batch.slot_mapping.begin() + batch.cu_q[b + 1], [](int64_t s) { return s < 0; });
    if (padding) {
      KILN_CHECK(next_logit >= batch.logit_rows.size() || batch.logit_rows[next_logit] >= batch.cu_q[b + 1],
                 "FakeRunner: a padding row asks for logits");
      continue;
    }
    ++real_seqs;
    (q == 1 ? has_decode : has_prefill) = true;
    ctx.clear();
    for (int32_t p = 0; p < batch.kv_lens[size_t(b)]; ++p) {
      const int64_t page = batch.page_table[size_t(b) * size_t(batch.pages_stride) + size_t(p / page_size_)];
      const size_t slot = size_t(page * page_size_ + p % page_size_);
      KILN_CHECK(page != KvPool::kNullPage && slot_pos_[slot] == p, "FakeRunner: sequence ", b, " position ",
                 p, " reads page ", page, " slot holding position ", slot_pos_[slot],
                 " (stale or wrong page)");
      ctx.push_back(int32_t(slot_token_[slot]));
    }
    for (int32_t r = batch.cu_q[b]; r < batch.cu_q[b + 1]; ++r) {
      KILN_CHECK_EQ(ctx[size_t(batch.positions[size_t(r)])], batch.tokens[size_t(r)],
                    "FakeRunner: token mismatch");
      if (next_logit >= batch.logit_rows.size() || batch.logit_rows[next_logit] != r) continue;
      const int64_t n = batch.positions[size_t(r)] + 1;
      const uint64_t h = context_hash(ctx.data(), n);
      if (logits) write_logits(ctx.data(), n, logits->data() + next_logit * size_t(V));
      if (hidden) {
        float* row = hidden->data() + next_logit * size_t(H);
        for (int64_t i = 0; i < H; ++i) row[i] = float((h >> (i % 16 * 4)) & 15u) + 1.0f;
      }
      ++next_logit;
    }
  }
  KILN_CHECK_EQ(next_logit, batch.logit_rows.size(), "FakeRunner: logit rows outside any sequence");
  if (has_decode && has_prefill) saw_mixed_step = true;
  max_seqs_seen = std::max<int64_t>(max_seqs_seen, real_seqs);
}

bool FakeRunner::forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                                 std::vector<SampledRow>* out, const std::function<void()>& before_sample) {
  if (!device_sampling) return false;
  KILN_CHECK_EQ(rows.size(), batch.logit_rows.size(), "one RowSampling per logit row");
  std::vector<float> logits;
  forward(batch, &logits, nullptr);
  ++sampled_steps;
  if (before_sample) before_sample();  // where a device sampler's forward would be running
  draw_rows_on_host(logits, config_.vocab_size, rows, top_n, out);
  return true;
}

void draw_rows_on_host(std::vector<float>& logits, int64_t vocab,
                       const std::vector<ModelRunner::RowSampling>& rows, int top_n,
                       std::vector<ModelRunner::SampledRow>* out) {
  using RowSampling = ModelRunner::RowSampling;
  using SampledRow = ModelRunner::SampledRow;
  const size_t V = size_t(vocab);
  out->assign(rows.size(), SampledRow{});
  for (size_t r = 0; r < rows.size(); ++r) {
    float* x = logits.data() + r * V;
    const RowSampling& p = rows[r];
    if (p.proc) p.proc->apply(x, int64_t(V));  // as a device sampler must: bias, mask, penalties first
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    double lse = 0.0;
    for (size_t v = 0; v < V; ++v) lse += std::exp(double(x[v] - x[order[0]]));
    lse = std::log(lse) + double(x[order[0]]);
    SampledRow& o = (*out)[r];
    if (p.temperature <= 0.0f) {
      o.token = order[0];
    } else {
      const size_t keep = p.top_k > 0 ? std::min(V, size_t(p.top_k)) : V;
      std::vector<double> w(keep);
      for (size_t i = 0; i < keep; ++i)
        w[i] = std::exp(double(x[order[i]] - x[order[0]]) / double(p.temperature));
      std::mt19937_64 rng(p.seed * 0x9E3779B97F4A7C15ull + p.step);
      o.token = order[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
    }
    o.logprob = float(double(x[o.token]) - lse);
    for (int i = 0; i < top_n && size_t(i) < V; ++i)
      o.top.push_back({order[size_t(i)], float(double(x[order[size_t(i)]]) - lse)});
  }
}

const BatchDesc& FakeRunner::chain_input(const BatchDesc& batch, bool chained, BatchDesc& local) {
  KILN_CHECK(launched_.size() < 2, "FakeRunner: a third step launched before the first was collected");
  KILN_CHECK(is_graphable_decode(batch), "FakeRunner: launches take decode steps only");
  KILN_CHECK(launched_.empty() || launched_.back().sampled, "FakeRunner: a step launched before the one ",
             "launched last was sampled");
  if (!chained) return batch;
  // The tokens drawn by the step launched last, row for row, as a device copy would take them.
  KILN_CHECK(!launched_.empty(), "FakeRunner: a chained step with no step launched before it");
  const std::vector<SampledRow>& prev = launched_.back().rows;
  KILN_CHECK(prev.size() >= batch.logit_rows.size(), "FakeRunner: a chained step has more rows than ",
             prev.size());
  local = batch;
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) local.tokens[r] = prev[r].token;
  ++chained_steps;
  return local;
}

bool FakeRunner::launch_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                                bool chained) {
  if (!device_sampling || !launch_ahead) return false;
  BatchDesc local;
  const BatchDesc& run = chain_input(batch, chained, local);
  Launched l;
  KILN_CHECK(forward_sampled(run, rows, top_n, &l.rows), "FakeRunner: device sampling is off");
  --sampled_steps;  // counted as launched, not as forward_sampled
  ++launched_steps;
  launched_.push_back(std::move(l));
  return true;
}

bool FakeRunner::launch_forward(const BatchDesc& batch, int top_n, bool chained) {
  if (!device_sampling || !launch_ahead) return false;
  BatchDesc local;
  const BatchDesc& run = chain_input(batch, chained, local);
  Launched l;
  forward(run, &l.logits, nullptr);
  l.top_n = top_n;
  l.sampled = false;
  ++launched_steps;
  ++deferred_steps;
  launched_.push_back(std::move(l));
  return true;
}

void FakeRunner::sample_launched(const std::vector<RowSampling>& rows) {
  KILN_CHECK(!launched_.empty() && !launched_.back().sampled, "FakeRunner: no launched forward to sample");
  Launched& l = launched_.back();
  KILN_CHECK_EQ(rows.size() * size_t(config_.vocab_size), l.logits.size(), "one RowSampling per logit row");
  draw_rows_on_host(l.logits, config_.vocab_size, rows, l.top_n, &l.rows);
  l.logits.clear();
  l.sampled = true;
}

void FakeRunner::collect_sampled(std::vector<SampledRow>* out) {
  KILN_CHECK(!launched_.empty(), "FakeRunner: collect_sampled with no step launched");
  KILN_CHECK(launched_.front().sampled, "FakeRunner: collect_sampled before the step was sampled");
  *out = std::move(launched_.front().rows);
  launched_.pop_front();
}

}  // namespace kiln
