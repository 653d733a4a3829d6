#include "runtime/grammar_masks.h"

#include "kiln/error.h"

namespace kiln {

GrammarState::GrammarState(std::shared_ptr<const grammar::CompiledGrammar> g, int32_t after)
    : matcher(std::move(g)), after_token(after), active(after < 0) {
  mask.assign(matcher.mask_words(), 0u);
}

std::string GrammarState::advance(int32_t token) {
  if (!active) {
    active = token == after_token;
    return {};
  }
  if (matcher.is_terminated()) return "the grammar had already ended";
  try {
    if (!matcher.accept_token(token))
      return "the grammar refused token " + std::to_string(token) + " after " +
             std::to_string(matcher.num_accepted()) + " accepted";
  } catch (const std::exception& e) {
    return std::string("the grammar failed: ") + e.what();
  }
  return {};
}

GrammarMaskPool::GrammarMaskPool(int threads, std::function<void()> before_mask)
    : before_mask_(std::move(before_mask)) {
  KILN_CHECK(threads >= 1 && threads <= 64, "grammar mask threads must be in [1, 64], got ", threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

GrammarMaskPool::~GrammarMaskPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void GrammarMaskPool::start(std::vector<std::shared_ptr<GrammarState>> states) {
  auto b = std::make_shared<Batch>();
  b->done.assign(states.size(), 0);
  b->states = std::move(states);
  {
    std::lock_guard<std::mutex> lk(mu_);
    batch_ = std::move(b);
  }
  work_cv_.notify_all();
}

std::vector<bool> GrammarMaskPool::wait(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  std::shared_ptr<Batch> b = batch_;
  if (!b) return {};
  done_cv_.wait_until(lk, deadline, [&] { return b->finished == b->states.size(); });
  std::vector<bool> out(b->states.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = b->done[i] != 0;
  // Jobs not started yet are dropped: their requests end (the engine's rule for a late mask).
  b->next = b->states.size();
  batch_.reset();
  return out;
}

void GrammarMaskPool::work() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || (batch_ && batch_->next < batch_->states.size()); });
    if (stop_) return;
    std::shared_ptr<Batch> b = batch_;
    const size_t i = b->next++;
    std::shared_ptr<GrammarState> s = b->states[i];
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    if (before_mask_) before_mask_();
    try {
      s->error.clear();
      s->matcher.fill_next_token_bitmask(s->mask.data(), s->mask.size());
    } catch (const std::exception& e) {
      s->error = e.what();
    }
    s->mask_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lk.lock();
    b->done[i] = 1;
    if (++b->finished == b->states.size()) done_cv_.notify_all();
  }
}

}  // namespace kiln
