// The real ApiServer over the fake engine and byte tokenizer (test_server_fakes.h) on an ephemeral loopback
// port, listening on a thread of its own until destroyed: the fixture the HTTP tests build on.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/server.h"
#include "test_server_fakes.h"

namespace kiln::server::fake {

// Codec: the tokenizer double (ByteCodec, or one derived from it).
template <typename Codec = ByteCodec>
struct BasicServerHarness {
  // reply: what the engine "generates", one byte a token every step_ms.
  BasicServerHarness(std::string reply, int step_ms, ServerOptions o, int http_threads)
      : engine(std::move(reply), step_ms) {
    o.port = 0;
    o.served_model_name = "demo";
    o.http_threads = http_threads;
    server = std::make_unique<ApiServer>(engine, codec, o);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    for (int i = 0; i < 1000 && !server->running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~BasicServerHarness() {
    server->stop();
    thread.join();
  }
  BasicServerHarness(const BasicServerHarness&) = delete;
  BasicServerHarness& operator=(const BasicServerHarness&) = delete;

  Codec codec;
  FakeEngine engine;
  std::unique_ptr<ApiServer> server;
  int port = 0;
  std::thread thread;
};
struct ServerHarness : BasicServerHarness<> {
  using BasicServerHarness::BasicServerHarness;
};

// Splits an SSE body into its data payloads, checking the framing ("data: ...\n\n", nothing else).
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    EXPECT_EQ(body.compare(pos, 6, "data: "), 0) << "frame at " << pos << ": " << body.substr(pos, 40);
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

}  // namespace kiln::server::fake
