// The drain's last act (ApiServer::end_all) against an engine stuck in a step that never ends: every open
// response still ends at once and completely -- a stream with a final chunk whose finish_reason is "abort",
// `data: [DONE]` and the chunked terminator, a whole reply with its body -- and each request is counted as
// aborted, without any event from the engine. The bytes are read from a raw socket so that a missing
// terminator or an early close cannot hide behind a client library.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <thread>

#include "server/server.h"
#include "test_server_fakes.h"

namespace kiln::server {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// Accepts requests and never runs them (a step that lasts minutes): no event, aborts only recorded.
class StuckEngine : public EngineApi {
 public:
  RequestId submit(Request, std::function<void(const TokenEvent&)> cb) override {
    std::lock_guard<std::mutex> lock(mu);
    callbacks.push_back(std::move(cb));  // kept alive, never called
    return RequestId(callbacks.size());
  }
  void abort(RequestId) override { ++aborts; }
  void flush_cache() override {}
  EngineStats stats() const override { return {}; }
  int64_t vocab_size() const override { return fake::kVocab; }
  int64_t max_context_len() const override { return 512; }
  bool is_embedding_model() const override { return false; }
  int64_t hidden_size() const override { return 8; }

  std::mutex mu;
  std::vector<std::function<void(const TokenEvent&)>> callbacks;
  std::atomic<int> aborts{0};
};

// One HTTP/1.1 exchange on a raw socket: send, then read until `until` appears or the peer closes (10 s
// at most: a generous bound for a loaded machine, never reached when the server behaves).
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  void send_post(const std::string& path, const std::string& body) {
    const std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd_, req.data(), req.size(), 0), ssize_t(req.size()));
  }
  // Reads until `until` is in what was received (or the peer closed, or 10 s passed); returns everything.
  const std::string& read_until(const std::string& until) {
    char buf[4096];
    while (got_.find(until) == std::string::npos) {
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got_.append(buf, size_t(n));
    }
    return got_;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string got_;
};

struct DrainHarness {
  DrainHarness() {
    ServerOptions o;
    o.port = 0;
    o.served_model_name = "demo";
    server = std::make_unique<ApiServer>(engine, codec, o);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    for (int i = 0; i < 2000 && !server->running(); ++i) std::this_thread::sleep_for(5ms);
  }
  ~DrainHarness() {
    server->stop();
    thread.join();
  }
  bool accepted(int n) {  // the server registered n requests (their submits returned)
    for (int i = 0; i < 2000; ++i) {
      if (server->counters().accepted.load() >= n) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  StuckEngine engine;
  fake::ByteCodec codec;
  std::unique_ptr<ApiServer> server;
  int port = 0;
  std::thread thread;
};

json chat(bool stream) {
  return {{"model", "demo"},
          {"messages", {{{"role", "user"}, {"content", "hi"}}}},
          {"max_tokens", 50},
          {"stream", stream}};
}

TEST(ServerDrain, EndAllEndsEveryStreamWithAFinalChunkDoneAndTheTerminator) {
  DrainHarness h;
  RawClient stream(h.port), completion(h.port), whole(h.port);
  ASSERT_TRUE(stream.connected() && completion.connected() && whole.connected());
  stream.send_post("/v1/chat/completions", chat(true).dump());
  completion.send_post("/v1/completions",
                       json({{"prompt", "hi"}, {"max_tokens", 9}, {"stream", true}}).dump());
  whole.send_post("/v1/chat/completions", chat(false).dump());
  // The chat stream has its role frame: the state the issue found cut by a TCP close.
  ASSERT_NE(stream.read_until("\"role\":\"assistant\"").find("\"role\":\"assistant\""), std::string::npos);
  ASSERT_TRUE(h.accepted(3));
  h.server->begin_drain();
  h.server->end_all();
  const std::string& s = stream.read_until("0\r\n\r\n");
  const size_t fin = s.find("\"finish_reason\":\"abort\"");
  const size_t done = s.find("data: [DONE]");
  EXPECT_NE(fin, std::string::npos) << s;
  EXPECT_NE(done, std::string::npos) << s;
  EXPECT_LT(fin, done) << s;
  ASSERT_GE(s.size(), 5u);
  EXPECT_EQ(s.substr(s.size() - 5), "0\r\n\r\n") << "no chunked terminator: " << s;
  const std::string& c = completion.read_until("0\r\n\r\n");
  EXPECT_NE(c.find("\"finish_reason\":\"abort\""), std::string::npos) << c;
  EXPECT_NE(c.find("data: [DONE]"), std::string::npos) << c;
  EXPECT_EQ(c.substr(c.size() - 5), "0\r\n\r\n") << c;
  const std::string& w = whole.read_until("\"finish_reason\":\"abort\"");
  EXPECT_NE(w.find("HTTP/1.1 200"), std::string::npos) << w;
  EXPECT_NE(w.find("\"finish_reason\":\"abort\""), std::string::npos) << w;
  EXPECT_TRUE(h.server->wait_idle(10s));
  const auto& n = h.server->counters();
  EXPECT_EQ(n.accepted.load(), 3);
  EXPECT_EQ(n.aborted.load(), 3);
  EXPECT_EQ(h.engine.aborts.load(), 3);  // the engine is still told, to free the pages when it can
  h.server->end_all();                   // nothing open: no effect
  EXPECT_EQ(n.aborted.load(), 3);
}

}  // namespace
}  // namespace kiln::server
