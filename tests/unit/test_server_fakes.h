// Test doubles for the server's two seams (server/backend.h): a byte-level tokenizer (token id = byte,
// 256 = EOS) and an engine thread that "generates" a fixed reply one byte per step. They let the HTTP
// layer be tested without a model: SSE framing, usage counts, stop strings spanning tokens, UTF-8 held
// back across tokens, disconnects, queue limits.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/error.h"
#include "server/backend.h"

namespace kiln::server::fake {

constexpr int32_t kEos = 256;
constexpr int64_t kVocab = 300;

class ByteStream : public TextStream {
 public:
  std::string push(int32_t id) override {
    if (id < 256) pending_ += char(id);
    // Release the longest prefix made of whole UTF-8 characters.
    size_t cut = pending_.size(), i = pending_.size();
    while (i > 0 && (uint8_t(pending_[i - 1]) & 0xc0) == 0x80) --i;
    if (i > 0) {
      const auto lead = uint8_t(pending_[i - 1]);
      const size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      if (pending_.size() - (i - 1) < need) cut = i - 1;
    }
    std::string out = pending_.substr(0, cut);
    pending_.erase(0, cut);
    return out;
  }
  std::string flush() override { return std::exchange(pending_, ""); }

 private:
  std::string pending_;
};

class ByteCodec : public TextCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids)
      if (id < 256) s += char(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override { return id < 256 ? std::string(1, char(id)) : ""; }
  std::unique_ptr<TextStream> stream() const override { return std::make_unique<ByteStream>(); }
  std::string render_chat(const nlohmann::json& req) const override {
    std::string s;
    for (const auto& m : req["messages"]) {
      KILN_CHECK(m["content"].is_string(), "content must be a string after normalisation");
      s += m["role"].get<std::string>() + ": " + m["content"].get<std::string>() + "\n";
    }
    s += "assistant:";
    auto kw = req.find("chat_template_kwargs");
    if (kw != req.end() && kw->is_object() && kw->value("enable_thinking", true) == false) s += " <no-think>";
    return s;
  }
  bool chat_template_thinks() const override { return thinks; }
  bool thinks = true;  // as Qwen3's template: the reasoning parser is on under --reasoning-parser auto
};

// One request per "step" advances by one token; step_ms paces it so tests can abort mid-stream.
class FakeEngine : public EngineApi {
 public:
  explicit FakeEngine(std::string reply = "Hello world! This is kiln.", int step_ms = 2)
      : reply_(std::move(reply)), step_ms_(step_ms), thread_([this] { loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  int max_active = 1000;  // beyond this submit() throws EngineBusyError
  bool embedding_model = false;
  int64_t max_context = 512;                      // the context limit the server checks requests against
  std::atomic<bool> fail_requests{false};         // finish every request with "error"
  std::string fail_message = "injected failure";  // that error's text (set before the requests)
  // Set before the first submit: a reply per request, as token ids of a real tokenizer (EOS appended by
  // the caller), instead of the fixed byte reply; vocab and eos to match that tokenizer.
  std::function<std::vector<int32_t>(const Request&)> script;
  int64_t vocab = kVocab;
  int32_t eos = kEos;

  RequestId submit(Request req, std::function<void(const TokenEvent&)> cb) override {
    for (int32_t id : req.prompt) KILN_CHECK(id >= 0 && id < vocab, "token id ", id, " out of range");
    KILN_CHECK(!req.prompt.empty(), "empty prompt");
    std::lock_guard<std::mutex> lock(mu_);
    if (int(live_.size()) >= max_active) {
      ++stats_.requests_rejected;
      throw EngineBusyError("queue full");
    }
    const RequestId id = next_id_++;
    std::vector<int32_t> ids;
    if (script) ids = script(req);
    live_[id] = Live{std::move(req), std::move(cb), 0, false, std::move(ids)};
    ++stats_.requests_submitted;
    stats_.prompt_tokens_total += int64_t(live_[id].req.prompt.size());
    cv_.notify_all();
    return id;
  }
  void abort(RequestId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(id);
    if (it != live_.end()) it->second.aborted = true;
  }
  void flush_cache() override { ++flushes; }
  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    s.running = int(live_.size());
    s.kv_pages_total = 64;
    s.kv_pages_used = int64_t(live_.size());
    s.kv_pages_free = 64 - s.kv_pages_used;
    s.page_size = 32;
    return s;
  }
  int64_t vocab_size() const override { return vocab; }
  int64_t max_context_len() const override { return max_context; }
  bool is_embedding_model() const override { return embedding_model; }
  int64_t hidden_size() const override { return 8; }
  std::vector<int32_t> eos_token_ids() const override { return {eos}; }

  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  std::atomic<int> flushes{0};

 private:
  struct Live {
    Request req;
    std::function<void(const TokenEvent&)> cb;
    int produced = 0;
    bool aborted = false;
    std::vector<int32_t> ids;  // the scripted reply, when script is set
  };

  void finish(TokenEvent& e, const char* reason) {
    e.finished = true;
    e.finish_reason = reason;
    const std::string r = reason;
    (r == "stop"     ? stats_.finished_stop
     : r == "length" ? stats_.finished_length
     : r == "abort"  ? stats_.finished_abort
                     : stats_.finished_error)++;
  }

  void step() {
    std::vector<std::pair<std::function<void(const TokenEvent&)>, TokenEvent>> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = live_.begin(); it != live_.end();) {
        Live& l = it->second;
        TokenEvent e;
        e.id = it->first;
        e.prompt_tokens = int(l.req.prompt.size());
        e.cached_tokens = int(l.req.prompt.size()) / 4;
        if (l.aborted) {
          finish(e, "abort");
        } else if (fail_requests) {
          e.error = fail_message;
          finish(e, "error");
        } else if (l.req.embedding) {
          std::vector<float> v(8);
          double ss = 0;
          for (int i = 0; i < 8; ++i) ss += double(v[i] = float(i + 1 + int(l.req.prompt.size()))) * v[i];
          for (auto& x : v) x = float(x / std::sqrt(ss));
          e.embedding = v;
          finish(e, "stop");
        } else if (l.produced >= l.req.sampling.max_new_tokens) {
          finish(e, "length");
        } else {
          const int k = l.produced;
          const int32_t tok = script                   ? (k < int(l.ids.size()) ? l.ids[size_t(k)] : eos)
                              : k < int(reply_.size()) ? int32_t(uint8_t(reply_[size_t(k)]))
                                                       : eos;
          e.ids.push_back(tok);
          if (l.req.sampling.return_logprob) {
            e.logprobs.push_back(-0.25f * float(k + 1));
            std::vector<TokenLogprob> top;
            for (int t = 0; t < l.req.sampling.top_logprobs; ++t)
              top.push_back({int32_t('a' + t), -1.0f - t});
            e.top_logprobs.push_back(top);
          }
          ++l.produced;
          ++stats_.generation_tokens_total;
          e.completion_tokens = l.produced;
          const auto& stops = l.req.sampling.stop_token_ids;
          if ((tok == eos && !l.req.sampling.ignore_eos) ||
              std::find(stops.begin(), stops.end(), tok) != stops.end()) {
            e.matched_stop = tok;
            finish(e, "stop");
          } else if (l.produced >= l.req.sampling.max_new_tokens) {
            finish(e, "length");
          }
        }
        if (l.req.return_hidden && e.finished) e.hidden = {1.0f, 2.0f};
        out.emplace_back(l.cb, e);
        it = e.finished ? live_.erase(it) : std::next(it);
      }
    }
    for (auto& [cb, e] : out) cb(e);
  }

  void loop() {
    pthread_setname_np(pthread_self(), "kiln-engine");  // as the real engine's, for per-thread CPU figures
    std::unique_lock<std::mutex> lock(mu_);
    while (!quit_) {
      if (live_.empty()) {
        cv_.wait(lock, [&] { return quit_ || !live_.empty(); });
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms_));
      step();
      lock.lock();
    }
  }

  std::string reply_;
  int step_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<RequestId, Live> live_;
  EngineStats stats_;
  RequestId next_id_ = 1;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace kiln::server::fake
