// The HTTP transport at scale, over loopback against the fake engine: 1,000 idle connections + 300 streams +
// 200 slow clients at once while /health and /metrics answer within 50 ms; the connection cap (503 +
// Retry-After); header/body deadlines (408, counted) that block nobody else; keep-alive reuse and the idle
// timeout; mass disconnects aborting every request; the transport's own statuses (400, 431, 413 from the
// headers alone) with JSON bodies, and Expect: 100-continue. Clients are raw sockets on one poll() loop
// (scale_client.h); every loop is bounded by a deadline.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "scale_client.h"
#include "test_server_harness.h"

using namespace kiln;
using namespace kiln::server;
using namespace kiln::test::scale;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string kReply = "The quick brown fox jumps over the lazy dog, then naps in the sun.";

struct Scale : fake::ServerHarness {
  Scale(ServerOptions o, int step_ms, std::string reply = kReply)
      : ServerHarness(std::move(reply), step_ms, o, 2) {}
  bool settle(std::chrono::milliseconds limit = 10s) const {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      if (server->counters().active == 0 && engine.live() == 0) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  template <typename Pred>
  bool wait_for(Pred p, std::chrono::milliseconds limit = 5s) const {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end && !p()) std::this_thread::sleep_for(2ms);
    return p();
  }
};

// Polls /health and /metrics on fresh connections every 20 ms until stopped; keeps the worst latency.
struct Prober {
  explicit Prober(int port)
      : thread([this, port] {
          raise_thread_priority();
          for (int i = 0; !stop; ++i) {
            int status = 0;
            const double ms = timed_get(port, i % 2 ? "/metrics" : "/health", &status);
            polls++;
            if (status != 200) failures++;
            if (ms > worst_ms) worst_ms = ms;
            if (ms > 50.0) slow_polls++;
            std::this_thread::sleep_for(20ms);
          }
        }) {}
  ~Prober() { finish(); }
  void finish() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  std::atomic<bool> stop{false};
  std::atomic<int> polls{0}, failures{0}, slow_polls{0};
  std::atomic<double> worst_ms{0};
  std::thread thread;
};

// The text and completion_tokens of a streamed /v1/completions reply (include_usage); -1 tokens when
// malformed.
std::pair<std::string, int> stream_result(const std::string& reply) {
  const std::string body = body_of(reply);
  std::string text;
  int tokens = -1;
  bool done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    if (body.compare(pos, 6, "data: ") != 0) return {text, -1};
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) return {text, -1};
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(payload);
    if (!j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
    if (j["usage"].is_object()) tokens = j["usage"]["completion_tokens"];
  }
  return {text, done ? tokens : -1};
}

std::string stream_body(int max_tokens) {
  return json({{"prompt", "x"},
               {"max_tokens", max_tokens},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}})
      .dump();
}

}  // namespace

TEST(ServerScale, IdleStreamingAndSlowClientsAtOnce) {
  if (raise_fd_limit() < 4000) GTEST_SKIP() << "needs 4000 file descriptors (ulimit -Hn)";
  ServerOptions o;
  o.max_connections = 3000;
  o.header_timeout = 1000ms;
  o.body_timeout = 1000ms;
  Scale h(o, 5);
  constexpr int kIdle = 1000, kStreams = 300, kSlow = 200, kTokens = 24;

  std::vector<int> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(dial(h.port));
    ASSERT_GE(idle.back(), 0) << "connection " << i;
  }
  ASSERT_TRUE(h.wait_for([&] { return h.server->counters().connections_open >= kIdle; }));

  Prober probe(h.port);
  std::vector<Conn> streams(kStreams), slow(kSlow);
  std::vector<Conn*> all;
  for (auto& c : streams) {
    c.fd = dial(h.port);
    ASSERT_GE(c.fd, 0);
    c.out = post_request("/v1/completions", stream_body(kTokens));
    all.push_back(&c);
  }
  const std::string partial = stream_body(1);
  for (int i = 0; i < kSlow; ++i) {
    Conn& c = slow[size_t(i)];
    c.fd = dial(h.port);
    ASSERT_GE(c.fd, 0);
    c.trickle = 200ms;  // one byte per 200 ms: far too slow for a 1 s deadline
    const std::string req = post_request("/v1/completions", partial, /*declare_full=*/false);
    if (i % 2) {  // the headers at once, the body trickled
      const size_t head = req.find("\r\n\r\n") + 4;
      ASSERT_EQ(::send(c.fd, req.data(), head, MSG_NOSIGNAL), ssize_t(head));
      c.out = req.substr(head);
    } else {  // the headers trickled
      c.out = req;
    }
    all.push_back(&c);
  }
  const auto t0 = Clock::now();
  ASSERT_TRUE(pump(all, t0 + 30s)) << "some connection was never closed by the server";
  probe.finish();

  const std::string expected = kReply.substr(0, kTokens);
  for (const auto& c : streams) {
    ASSERT_EQ(status_of(c.in), 200) << c.in.substr(0, 200);
    const auto [text, tokens] = stream_result(c.in);
    EXPECT_EQ(text, expected);
    EXPECT_EQ(tokens, kTokens);
  }
  for (const auto& c : slow) {
    ASSERT_EQ(status_of(c.in), 408) << c.in.substr(0, 200);
    EXPECT_TRUE(json::parse(body_of(c.in)).contains("error"));
    const double s = std::chrono::duration<double>(c.closed_at - t0).count();
    EXPECT_GT(s, 0.9);
    EXPECT_LT(s, 5.0);
  }
  EXPECT_GE(probe.polls, 10);
  EXPECT_EQ(probe.failures, 0);
  // Within 50 ms; one straggler allowed (under 200 ms) for a CI machine whose 2 cores run another test
  // beside this one (e2e_scale, run alone, holds every poll to 50 ms).
  EXPECT_LE(probe.slow_polls, 1) << "over " << probe.polls << " polls";
  EXPECT_LT(probe.worst_ms, 200.0) << "over " << probe.polls << " polls";
  std::printf("scale: %d polls of /health and /metrics, worst %.1f ms; streams done in %.2f s\n",
              probe.polls.load(), probe.worst_ms.load(),
              std::chrono::duration<double>(Clock::now() - t0).count());

  // The idle connections were held all along (not cut by the other clients' deadlines).
  int still_open = 0;
  for (int fd : idle) {
    char ch;
    if (::recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) ++still_open;
  }
  EXPECT_EQ(still_open, kIdle);
  for (int fd : idle) ::close(fd);

  ASSERT_TRUE(h.settle());
  const auto& c = h.server->counters();
  EXPECT_EQ(c.accepted, kStreams);
  EXPECT_EQ(c.completed, kStreams);
  EXPECT_EQ(c.rejected_timeout, kSlow);
  EXPECT_EQ(h.engine.stats().kv_pages_used, 0);
  EXPECT_TRUE(h.wait_for([&] { return c.connections_open == 0; })) << c.connections_open;
  int status = 0;
  std::string metrics;
  timed_get(h.port, "/metrics", &status, &metrics);
  EXPECT_NE(metrics.find("kiln_server_requests_rejected_total{model_name=\"demo\",reason=\"timeout\"} 200\n"),
            std::string::npos);
}

// The process's descriptor table is grown to the connection cap at bind. Grown on demand instead, each
// doubling stalls the accepting thread for an RCU grace period (tens of ms on a busy machine): e2e_scale's
// first /health poll, queued behind 1,000 idle connections' accepts, took 50-65 ms that way.
// (gtest_discover_tests runs this test in a process of its own, whose table starts small.)
TEST(ServerScale, DescriptorTableHoldsTheConnectionCapFromBind) {
  ServerOptions o;
  o.max_connections = 3000;
  Scale h(o, 2);
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  std::ifstream status("/proc/self/status");
  std::string line;
  long fd_size = -1;
  while (std::getline(status, line))
    if (line.rfind("FDSize:", 0) == 0) fd_size = std::stol(line.substr(7));
  ASSERT_GT(fd_size, 0) << "no FDSize in /proc/self/status";
  EXPECT_GE(fd_size, std::min<long>(long(lim.rlim_cur), 3000));
}

TEST(ServerScale, ConnectionCapIs503WithRetryAfter) {
  ServerOptions o;
  o.max_connections = 8;
  Scale h(o, 2);
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(dial(h.port));
  ASSERT_TRUE(h.wait_for([&] { return h.server->counters().connections_open == 8; }));
  Conn extra;
  extra.fd = dial(h.port);
  ASSERT_GE(extra.fd, 0);
  extra.out = post_request("/v1/completions", R"({"prompt": "a"})");  // work; a probe would be answered
  std::vector<Conn*> one{&extra};
  ASSERT_TRUE(pump(one, Clock::now() + 5s));
  ::close(extra.fd);
  EXPECT_EQ(status_of(extra.in), 503) << extra.in;
  EXPECT_EQ(header_of(extra.in, "Retry-After"), "1");
  EXPECT_TRUE(json::parse(body_of(extra.in))["error"]["message"].is_string());
  EXPECT_EQ(h.server->counters().connections_rejected, 1);
  // A place freed is a place taken.
  ::close(held.back());
  held.pop_back();
  ASSERT_TRUE(h.wait_for([&] { return h.server->counters().connections_open == 7; }));
  int status = 0;
  timed_get(h.port, "/health", &status);
  EXPECT_EQ(status, 200);
  for (int fd : held) ::close(fd);
}

TEST(ServerScale, SlowHeadersGet408WhileOthersAreServed) {
  ServerOptions o;
  o.header_timeout = 300ms;
  Scale h(o, 2);
  std::vector<Conn> slow(20);
  std::vector<Conn*> all;
  for (auto& c : slow) {
    c.fd = dial(h.port);
    c.out = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + std::string(100, 'p') + "\r\n\r\n";
    c.trickle = 50ms;
    all.push_back(&c);
  }
  const auto t0 = Clock::now();
  std::thread trickler([&] { pump(all, t0 + 10s); });
  std::this_thread::sleep_for(100ms);
  int status = 0;
  const double ms = timed_get(h.port, "/v1/models", &status);
  EXPECT_EQ(status, 200);
  EXPECT_LT(ms, 50.0);
  trickler.join();
  for (const auto& c : slow) {
    EXPECT_EQ(status_of(c.in), 408) << c.in.substr(0, 100);
    const double s = std::chrono::duration<double>(c.closed_at - t0).count();
    EXPECT_GT(s, 0.25);
    EXPECT_LT(s, 3.0);
    ::close(c.fd);
  }
  EXPECT_EQ(h.server->counters().rejected_timeout, 20);
}

TEST(ServerScale, KeepAliveReuseThenIdleTimeout) {
  ServerOptions o;
  o.idle_timeout = 300ms;
  Scale h(o, 2);
  const int fd = dial(h.port);
  ASSERT_GE(fd, 0);
  const std::string req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  std::string got;
  char buf[4096];
  for (int round = 0; round < 2; ++round) {  // two requests on one connection
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
    got.clear();
    while (got.find("{\"status\":\"ok\"}") == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "round " << round;
      got.append(buf, size_t(n));
    }
    EXPECT_EQ(status_of(got), 200);
    EXPECT_EQ(header_of(got, "Connection"), "keep-alive");
  }
  EXPECT_EQ(h.server->counters().connections_total, 1);
  const auto t0 = Clock::now();
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0);  // closed by the server, without a reply
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GT(s, 0.2);
  EXPECT_LT(s, 3.0);
  ::close(fd);
}

TEST(ServerScale, MassDisconnectAbortsEveryRequest) {
  Scale h({}, 10);
  constexpr int kStreams = 200;
  std::vector<Conn> streams(kStreams);
  for (auto& c : streams) {
    c.fd = dial(h.port);
    const std::string req = post_request("/v1/completions", stream_body(60));
    ASSERT_EQ(::send(c.fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
  }
  ASSERT_TRUE(h.wait_for([&] { return h.server->counters().accepted == kStreams; }));
  ASSERT_TRUE(h.wait_for([&] { return h.engine.stats().generation_tokens_total >= 2 * kStreams; }));
  for (auto& c : streams) ::close(c.fd);
  ASSERT_TRUE(h.settle()) << h.engine.live() << " requests still live";
  const auto& c = h.server->counters();
  EXPECT_EQ(c.aborted, kStreams);
  EXPECT_EQ(c.completed, 0);
  EXPECT_EQ(h.engine.stats().finished_abort, kStreams);
  EXPECT_LT(h.engine.stats().generation_tokens_total, 40 * kStreams);  // stopped well before 60 each
  EXPECT_EQ(h.engine.stats().kv_pages_used, 0);
}

TEST(ServerScale, TransportStatusesHaveJsonBodies) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  Scale h(o, 2);
  auto exchange = [&](const std::string& request) {
    Conn c;
    c.fd = dial(h.port);
    c.out = request;
    std::vector<Conn*> one{&c};
    EXPECT_TRUE(pump(one, Clock::now() + 5s));
    ::close(c.fd);
    return c.in;
  };
  auto expect_error = [](const std::string& reply, int status) {
    EXPECT_EQ(status_of(reply), status) << reply.substr(0, 200);
    EXPECT_EQ(header_of(reply, "Connection"), "close");
    const json j = json::parse(body_of(reply), nullptr, false);
    ASSERT_TRUE(j.is_object()) << reply;
    EXPECT_TRUE(j["error"]["message"].is_string());
  };
  expect_error(exchange("BLAH\r\n\r\n"), 400);
  expect_error(exchange("GET /health HTTP/1.1\r\nX-Big: " + std::string(70000, 'x') + "\r\n\r\n"), 431);
  // A declared length over the limit is refused from the headers alone, without waiting for the body.
  const auto t0 = Clock::now();
  expect_error(exchange("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"), 413);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.5);  // 1 s linger at most
  EXPECT_GE(h.server->counters().rejected_invalid, 3);
  // Expect: 100-continue gets the interim reply before the body is sent.
  const int fd = dial(h.port);
  const std::string body = json({{"prompt", "a"}, {"max_tokens", 2}}).dump();
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, size_t(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  Conn rest;
  rest.fd = fd;
  rest.out = body;
  std::vector<Conn*> one{&rest};
  ASSERT_TRUE(pump(one, Clock::now() + 5s));
  ::close(fd);
  EXPECT_EQ(status_of(rest.in), 200) << rest.in;
  EXPECT_EQ(json::parse(body_of(rest.in))["choices"][0]["text"], "Th");
}

// A /generate stream far larger than the socket buffers of a client that reads nothing at first: the
// gathered sends (cumulative text and ids sent from the session's caches) go out partly, the rest after
// the socket drains, and every frame arrives whole and in order.
TEST(ServerScale, StreamOutgrowingTheSocketBuffersArrivesWhole) {
  std::string reply;
  for (int i = 0; reply.size() < 2500; ++i) reply += "tok" + std::to_string(i) + (i % 7 ? " " : "\n\"q\"\\");
  Scale h({}, 1, reply);
  h.engine.max_context = 4096;
  Conn c;
  c.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int small = 4096;  // before connect, so the advertised window stays small
  ASSERT_EQ(setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(h.port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const int n = int(reply.size());
  c.out = post_request("/generate", json({{"text", "x"},
                                          {"stream", true},
                                          {"sampling_params", {{"max_new_tokens", n}, {"temperature", 0}}}})
                                        .dump());
  ASSERT_EQ(::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL), ssize_t(c.out.size()));
  c.sent = c.out.size();
  // Nothing is read until the whole reply is generated: ~16 MB of frames, far more than the socket buffers.
  EXPECT_TRUE(h.wait_for([&] { return h.engine.stats().generation_tokens_total >= n; }, 30s))
      << h.engine.stats().generation_tokens_total;
  std::vector<Conn*> all{&c};
  ASSERT_TRUE(pump(all, Clock::now() + 60s));
  ::close(c.fd);
  ASSERT_EQ(status_of(c.in), 200) << c.in.substr(0, 200);
  const std::string body = body_of(c.in);
  ASSERT_FALSE(body.empty()) << "malformed chunking";
  size_t last_len = 0;
  int frames = 0;
  json last;
  bool done = false;
  for (const std::string& payload : fake::sse_payloads(body)) {
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(payload);
    const std::string text = j["text"];
    ASSERT_EQ(reply.compare(0, text.size(), text), 0)
        << "frame " << frames << " is not a prefix of the reply";
    ASSERT_GE(text.size(), last_len);
    ASSERT_EQ(j["output_ids"].size(), text.size()) << "one byte per token";
    last_len = text.size();
    last = j;
    ++frames;
  }
  EXPECT_TRUE(done);
  // The events that queue while a send waits are merged into the next frame, so the count depends on how
  // the socket drained; the stream must still have been far larger than the socket buffers.
  EXPECT_GT(frames, 10);
  EXPECT_GT(body.size(), size_t(1) << 20);
  EXPECT_EQ(last["text"], reply);
  EXPECT_EQ(last["meta_info"]["completion_tokens"], n);
  EXPECT_TRUE(h.settle());
}
