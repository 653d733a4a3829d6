// HttpTransport: kiln's event-driven HTTP/1.1 server transport (Boost.Beast's request parser on Boost.Asio,
// C++20 coroutines; only the transport's own files, src/server/http_*, see Boost). It knows nothing
// of OpenAI or the engine: it parses requests, hands each to Routes, and writes what comes back.
//
// Threads: `io_threads` run every connection (each on its own strand), so thousands of idle or streaming
// connections cost no thread; a request is handled on the I/O thread when
// Routes::is_fast says so (cheap snapshots: /health, /metrics), otherwise on one of `worker_threads` (body
// parsing, tokenization, submission), so a slow handler never delays an I/O thread. A streamed response
// (ResponseSource) is pulled on the I/O thread whenever its producer wakes it, and holds nothing while it
// waits.
//
// Limits, each per connection, none able to block another client:
//   idle_timeout    keep-alive: time allowed before the first byte of a request (then closed, no reply)
//   header_timeout  from that first byte to the end of the headers        -> 408
//   body_timeout    from the end of the headers to the end of the body    -> 408
//   write_timeout   one write to a client that does not read              -> connection closed
//   max_header_bytes -> 431, max_body_bytes -> 413, a malformed request -> 400
//   max_connections: a connection beyond it may send one request (within 2 s): a GET of a snapshot route
//                    (Routes::is_fast: /health, /metrics) is answered, anything else gets 503 with
//                    Retry-After; then it is closed. So probes are answered however many idle connections
//                    hold the cap (at most 256 such connections at once; beyond, closed unanswered).
// A connection answered with an error is closed after the reply (lingering: its unread input is drained
// for up to a second, so the client reads the reply instead of a reset).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/frame.h"
#include "server/metrics.h"

namespace kiln::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... (HEAD is routed as GET and answered without a body)
  std::string target;  // as sent, query included
  std::string path;    // target up to '?'
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // The first header of that name (case-insensitive), "" when absent.
  std::string header(std::string_view name) const;
};

class ResponseSource;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Set: the body comes later, from the source. stream: chunked, the status and headers go out at once and
  // each pull()'s bytes as they come; otherwise one reply (Content-Length) once pull() says it is done.
  std::shared_ptr<ResponseSource> source;
  bool stream = false;

  void set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
};

// A response produced over time by another thread (the engine's token events).
class ResponseSource {
 public:
  virtual ~ResponseSource() = default;
  // Once, on the connection's I/O thread, before the first pull(). The source calls `wake` (from any thread,
  // as often as it likes, until finish() has returned) when pull() has something new.
  virtual void attach(std::function<void()> wake) = 0;
  // On the connection's I/O thread: appends what is ready to `out` (its views must stay valid until the next
  // pull() or finish()); returns true when the response is
  // complete (a deferred reply may then set res.status, res.headers, res.content_type).
  virtual bool pull(Frame& out, HttpResponse& res) = 0;
  // Exactly once, on the I/O thread: complete = every byte was handed to the socket; false = the client went
  // away (noticed at the next wake, or within a second), a write timed out, or the server is stopping.
  virtual void finish(bool complete) = 0;
};

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  int io_threads = 2;
  int worker_threads = 2;
  int max_connections = 4096;
  size_t max_body_bytes = 16u << 20;
  size_t max_header_bytes = 64u << 10;
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};
  int retry_after_s = 1;
};

struct Routes {
  // True: handle() is cheap and never blocks, run it on the I/O thread.
  std::function<bool(const HttpRequest&)> is_fast;
  // The reply; an exception escaping it becomes a 500 from error().
  std::function<HttpResponse(const HttpRequest&)> handle;
  // The reply for a status the transport produces itself (400, 408, 413, 431, 500, 503).
  std::function<HttpResponse(int status, const std::string& message)> error;
};

class HttpTransport {
 public:
  // `counters`: the connection gauges and the timeout count are kept there (shown by /metrics).
  HttpTransport(TransportOptions opts, Routes routes, ServerCounters& counters);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens; throws kiln::Error when the address cannot be bound. Returns the port.
  int bind();
  // Serves on io_threads threads (this one included) until stop(). Call after bind().
  void run();
  bool running() const;
  // Closes the listener and every connection (their sources finish(false)); run() then returns. Any thread.
  void stop();

  struct Impl;  // http_transport.cpp

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln::server
