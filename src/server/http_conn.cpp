// One connection's life on its strand: reading requests under the deadlines, handing them to the routes,
// writing replies and streamed responses, noticing a client that left, lingering before a close.
#include <sys/socket.h>

#include "server/http_transport_impl.h"

// g++ flags Asio's coroutine frames (awaitable_frame_base's own operator new / sized delete) as a mismatched
// pair where it inlines them here (g++ 12; GCC bug 109224, a false positive for coroutine frames): off for
// this file only, on every g++ the builds use (12 here, 14 on the GPU machine).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace kiln::server {

// While a response waits, the socket's readability says the client may have gone (a FIN or a reset), so no
// token pays for a check. Pipelined bytes make it readable too: then the watch is renewed (the next arrival,
// a reset included, fires it again), and a client that only closes is noticed when a write fails.
void Conn::watch_peer() {
  sock.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code e) {
    if (e || !self->watching) return;
    if (peer_gone(self->sock.native_handle())) {
      self->peer_left = true;
      self->resume({});
    } else {
      self->watch_peer();
    }
  });
}

awaitable<void> Conn::run(std::shared_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lock(c->srv.mu);
    c->srv.conns.emplace(c.get(), c);
  }
  if (!c->srv.stopping) {  // registered first, so stop() either sees it or it sees stopping
    try {
      co_await c->serve();
    } catch (const std::exception&) {  // a failure on one connection closes that connection only
    }
  }
  error_code e;
  c->sock.close(e);
  c->deadline.cancel();
  c->srv.counters.connections_open--;
  c->srv.forget(c.get());
}

awaitable<void> Conn::run_reject(std::shared_ptr<Conn> c) {
  try {
    co_await c->serve_over_cap();
  } catch (const std::exception&) {
  }
  error_code e;
  c->sock.close(e);
  c->deadline.cancel();
  c->srv.rejecting--;
}

awaitable<void> Conn::serve() {
  const TransportOptions& o = srv.opts;
  beast::flat_buffer buf;
  for (;;) {
    if (buf.size() == 0) {  // keep-alive: nothing buffered, wait for the next request's first byte
      buf.shrink_to_fit();  // an idle connection holds no buffer
      arm(o.idle_timeout);
      co_await sock.async_wait(tcp::socket::wait_read, token());
      if (ec || closing) co_return;  // idle too long, stop(), or a reset: closed without a reply
    }
    http::request_parser<http::string_body> p;
    p.header_limit(uint32_t(std::min<size_t>(o.max_header_bytes, UINT32_MAX)));
    p.body_limit(o.max_body_bytes);
    arm(o.header_timeout);
    co_await http::async_read_header(sock, buf, p, token());
    if (ec) co_return co_await fail_read();
    {  // Beast reads a body only by the last coding (gzip: no body, the body is the next request)
      const auto& h = p.get();
      std::vector<std::string_view> te;
      for (auto [it, end] = h.equal_range(http::field::transfer_encoding); it != end; ++it)
        te.emplace_back(it->value());
      const std::string bad = wire::transfer_encoding_error(
          te, h.find(http::field::content_length) != h.end(), h.version() >= 11);
      if (!bad.empty()) {
        disarm();
        co_return co_await reply_and_close(400, bad);
      }
    }
    if (!p.is_done()) {
      if (beast::iequals(p.get()[http::field::expect], "100-continue") &&
          !co_await write("HTTP/1.1 100 Continue\r\n\r\n"))
        co_return;
      arm(o.body_timeout);
      co_await http::async_read(sock, buf, p, token());
      if (ec) co_return co_await fail_read();
    }
    disarm();
    if (closing) co_return;

    auto& m = p.get();
    HttpRequest req;
    req.method = std::string(m.method_string());
    req.target = std::string(m.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : m) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req.body = std::move(m.body());
    const bool head_only = req.method == "HEAD";
    if (head_only) req.method = "GET";
    const bool keep_alive = m.keep_alive();

    HttpResponse res;
    if (srv.routes.is_fast(req)) {
      res = srv.handle(req);
    } else {  // parsing, tokenization, submission: off the I/O threads
      auto* s = &srv;
      res = co_await asio::co_spawn(
          srv.workers, [s, &req]() -> awaitable<HttpResponse> { co_return s->handle(req); }, use_awaitable);
    }
    if (!res.source) {
      std::string wire = response_head(res, keep_alive && !closing, false, res.body.size());
      if (!head_only) wire += res.body;
      if (!co_await write(wire)) co_return;
    } else if (!co_await write_source(res, keep_alive, head_only)) {
      co_return;
    }
    if (closing) co_return;
    if (!keep_alive) co_return co_await linger();
  }
}

// Past --max-connections: one request is read, within kOverCapWait, and answered if it is a snapshot route
// (Routes::is_fast: /health, /metrics, /v1/models), so a load balancer's probe is answered however many idle
// connections hold the cap; anything else (or nothing in time) gets the 503. Then the connection closes.
awaitable<void> Conn::serve_over_cap() {
  const std::string busy = "too many connections (--max-connections " +
                           std::to_string(srv.opts.max_connections) + "): retry later";
  beast::flat_buffer buf;
  http::request_parser<http::string_body> p;
  p.header_limit(uint32_t(std::min<size_t>(srv.opts.max_header_bytes, UINT32_MAX)));
  arm(std::min<std::chrono::milliseconds>(srv.opts.header_timeout, kOverCapWait));
  co_await http::async_read_header(sock, buf, p, token());
  disarm();
  if (closing) co_return;
  const auto& m = p.get();
  HttpRequest req;
  if (!ec) {
    req.method = std::string(m.method_string());
    req.target = std::string(m.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : m) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  }
  const bool head_only = req.method == "HEAD";
  if (head_only) req.method = "GET";
  // Only a request without a body: the next bytes are not read.
  if (ec || !p.is_done() || req.method != "GET" || !srv.routes.is_fast(req)) {
    srv.counters.connections_rejected++;
    co_return co_await reply_and_close(503, busy);
  }
  const HttpResponse res = srv.handle(req);  // a snapshot route: a whole reply, never a source
  std::string wire = response_head(res, false, false, res.body.size());
  if (!head_only) wire += res.body;
  if (co_await write(wire)) co_await linger();
}

// A request that could not be read: answered when it was the client's doing, else closed quietly.
awaitable<void> Conn::fail_read() {
  const error_code e = ec;
  if (closing) co_return;
  if (timed_out) {
    srv.counters.rejected_timeout++;
    co_return co_await reply_and_close(408, "the request was not received in time (header/body deadline)");
  }
  if (e == http::error::header_limit)
    co_return co_await reply_and_close(
        431, "request headers exceed " + std::to_string(srv.opts.max_header_bytes) + " bytes");
  if (e == http::error::body_limit)
    co_return co_await reply_and_close(
        413, "request body exceeds " + std::to_string(srv.opts.max_body_bytes) + " bytes");
  if (is_http_parse_error(e))
    co_return co_await reply_and_close(400, "malformed HTTP request: " + e.message());
  // end of stream, a reset, a partial message from a client that left: nobody to answer
}

awaitable<bool> Conn::write(std::string_view data) {
  // Most writes fit the socket's buffer: done at once (the socket is non-blocking), no timer, no suspension.
  const size_t now = sock.write_some(asio::buffer(data.data(), data.size()), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) co_return false;
  if (now == data.size()) co_return true;
  data.remove_prefix(now);
  arm(srv.opts.write_timeout);
  co_await asio::async_write(sock, asio::buffer(data.data(), data.size()), token());
  disarm();
  co_return !ec;
}

bool Conn::send_frame(std::string_view prefix, const Frame& f, std::string_view suffix, std::string& rest) {
  gather.clear();
  size_t total = 0;
  auto add = [&](const char* d, size_t n) {
    gather.emplace_back(d, n);
    total += n;
  };
  add(prefix.data(), prefix.size());
  f.each(add);
  add(suffix.data(), suffix.size());
  const size_t now = sock.write_some(gather, ec);  // sendmsg (Asio gathers at most 64 buffers at once)
  rest.clear();
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) return false;
  if (now == total) return true;
  rest.reserve(total - now);
  size_t skip = now;
  for (const asio::const_buffer& b : gather) {
    const size_t n = b.size() > skip ? b.size() - skip : 0;
    rest.append(static_cast<const char*>(b.data()) + (b.size() - n), n);
    skip -= b.size() - n;
  }
  return true;
}

awaitable<bool> Conn::write_source(HttpResponse& res, bool keep_alive, bool head_only) {
  const std::shared_ptr<ResponseSource> src = res.source;
  struct Finish {  // finish() exactly once, also when this frame is destroyed mid-way
    ResponseSource* s;
    bool complete = false;
    ~Finish() { s->finish(complete); }
  } fin{src.get()};
  auto ws = std::make_shared<WakeState>(srv, sock.get_executor(), weak_from_this());
  src->attach([ws] { ws->srv.wake(ws); });
  struct Watch {  // the peer watch, on for this response only
    Conn& c;
    explicit Watch(Conn& conn) : c(conn) {
      c.watching = true;
      c.peer_left = false;
      c.watch_peer();
      // A FIN that came before the watch was registered raised no event: look once.
      if (peer_gone(c.sock.native_handle())) c.peer_left = true;
    }
    ~Watch() {
      c.watching = false;
      error_code e;
      c.sock.cancel(e);
    }
  } watch{*this};
  if (res.stream && !co_await write(response_head(res, keep_alive && !closing, true, 0))) co_return false;
  Frame out;
  std::string wire;
  char hex[24];
  for (;;) {
    ws->pending = false;
    out.clear();
    wire.clear();
    const bool done = src->pull(out, res);
    if (res.stream && !out.empty()) {  // one chunk (and the last, when done), gathered from the frame
      // Sent here without a coroutine call; only what the socket did not take waits in write().
      if (!send_frame(wire::chunk_header(out.size(), hex), out, done ? "\r\n0\r\n\r\n" : "\r\n", wire))
        co_return false;
    } else if (res.stream && done) {
      wire = "0\r\n\r\n";
    } else if (done) {
      wire = response_head(res, keep_alive && !closing, false, out.size());
      if (!head_only) out.append_to(wire);
    }
    if (!wire.empty() && !co_await write(wire)) co_return false;
    if (done) {
      fin.complete = true;
      co_return true;
    }
    if (closing || peer_left) co_return false;
    if (!ws->pending) co_await wait_wake();
    if (closing || peer_left) co_return false;
  }
}

awaitable<void> Conn::reply_and_close(int status, const std::string& msg) {
  HttpResponse r = srv.error(status, msg);
  std::string wire = response_head(r, false, false, r.body.size()) + r.body;
  if (co_await write(wire)) co_await linger();
}

// Half-close, then read and drop what the client still sends (up to a limit and a deadline), so closing does
// not reset the connection before the client has read the reply.
awaitable<void> Conn::linger() {
  error_code e;
  sock.shutdown(tcp::socket::shutdown_send, e);
  arm(std::chrono::duration_cast<std::chrono::milliseconds>(kLinger));
  std::vector<char> scratch(4096);
  size_t total = 0;
  while (total < kLingerBytes && !closing) {
    total += co_await sock.async_read_some(asio::buffer(scratch), token());
    if (ec) break;
  }
  disarm();
}

}  // namespace kiln::server
