// HttpTransport on Boost.Asio + Boost.Beast (see http_transport.h for the contract). One io_context per I/O
// thread (a shard); each connection lives on one, so its handlers never run concurrently without a strand.
// One coroutine per connection; one watchdog timer per connection enforces every deadline by cancelling the
// socket's pending operation; responses are written as raw HTTP/1.1 (status line, headers, chunks).
#include "server/http_transport.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kiln/error.h"
#include "server/http_wire.h"

namespace kiln::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using error_code = boost::system::error_code;
using namespace std::chrono_literals;

using wire::is_http_parse_error;
using wire::peer_gone;
using wire::response_head;

namespace {

constexpr auto kLinger = 1s;  // how long a closing connection's unread input is drained
constexpr size_t kLingerBytes = 1u << 20;
constexpr int kMaxRejecting = 256;  // connections being sent the over-cap 503 at once; beyond, closed at once

}  // namespace

struct Conn;
struct WakeState;

// One I/O thread's io_context and its pending response wake-ups. Wakes from producer threads are coalesced:
// the first after a drain posts one drain task, which resumes every woken connection in place (they all
// live on this thread), so a step's events for hundreds of streams cost the producer one post per shard.
struct IoShard {
  asio::io_context ioc{1};
  asio::executor_work_guard<asio::io_context::executor_type> keep{ioc.get_executor()};  // until stop
  std::mutex ready_mu;
  std::vector<std::shared_ptr<WakeState>> ready, draining;
  bool drain_posted = false;
  void wake(const std::shared_ptr<WakeState>& ws);
  void drain();
};

std::vector<std::unique_ptr<IoShard>> make_shards(int n) {
  std::vector<std::unique_ptr<IoShard>> v;
  for (int i = 0; i < std::max(1, n); ++i) v.push_back(std::make_unique<IoShard>());
  return v;
}

struct HttpTransport::Impl : std::enable_shared_from_this<HttpTransport::Impl> {
  Impl(TransportOptions o, Routes r, ServerCounters& c)
      : opts(std::move(o)),
        routes(std::move(r)),
        counters(c),
        workers(size_t(std::max(1, opts.worker_threads))) {}

  TransportOptions opts;
  Routes routes;
  ServerCounters& counters;
  // Declared in this order so the workers (which post into the shards) are joined before the shards go.
  std::vector<std::unique_ptr<IoShard>> shards = make_shards(opts.io_threads);
  asio::thread_pool workers;
  tcp::acceptor acceptor{shards[0]->ioc};  // shard 0, like the hard stop and the accept loop
  size_t next_shard = 0;                   // the accept loop's round robin
  // Ends every shard's run() when it fires: all connections closed, or stop() re-armed it to 5 s for a
  // connection that will not close (a handler blocked on a worker).
  asio::steady_timer hard_stop{acceptor.get_executor()};
  std::atomic<bool> all_closed{false};

  std::atomic<bool> stopping{false};
  std::atomic<bool> is_running{false};
  std::mutex run_mu;  // orders run()'s start against stop(): a transport never run is stopped directly
  bool ran = false;
  std::atomic<int> rejecting{0};
  std::mutex mu;  // guards conns and accept_done
  std::unordered_map<Conn*, std::weak_ptr<Conn>> conns;
  bool accept_done = false;

  awaitable<void> accept_loop();
  HttpResponse handle(const HttpRequest& req) noexcept;
  HttpResponse error(int status, const std::string& msg) noexcept;
  void forget(Conn* c);
  void maybe_done();  // with mu held
  void arm_hard_stop(asio::steady_timer::time_point at);
};

// The writer's wake-up, shared with the response source's producer (any thread). The transport outlives
// every wake: a source calls wake only until its finish() returns, which is before the connection ends.
struct WakeState {
  WakeState(IoShard& s, std::weak_ptr<Conn> c) : shard(s), conn(std::move(c)) {}
  IoShard& shard;  // the connection's
  std::weak_ptr<Conn> conn;
  std::atomic<bool> pending{false};  // coalesces wakes: one per pull
};

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(HttpTransport::Impl& s, IoShard& sh, tcp::socket so)
      : srv(s), shard(sh), sock(std::move(so)), deadline(sock.get_executor()) {
    error_code e;
    sock.non_blocking(true, e);  // for write()'s first, synchronous attempt
  }

  HttpTransport::Impl& srv;
  IoShard& shard;  // the I/O thread sock lives on
  tcp::socket sock;
  asio::steady_timer deadline;  // the watchdog: on expiry the socket's pending operation is cancelled
  uint64_t armed = 0;           // generation of the watchdog wait, so a stale expiry does nothing
  bool timed_out = false;
  bool closing = false;    // stop() reached this connection
  bool watching = false;   // a response is being written: watch_peer() is on
  bool peer_left = false;  // seen while watching: the client closed or reset the connection
  // A response waiting for its producer sleeps here; resumed by a wake, the client leaving, or stop().
  // (Type-erased by hand: Boost 1.81's any_completion_handler recurses when moved.)
  struct Waiter {
    virtual ~Waiter() = default;
    virtual void resume(error_code e) = 0;
  };
  std::unique_ptr<Waiter> waiter;
  error_code ec;

  static awaitable<void> run(std::shared_ptr<Conn> c);
  static awaitable<void> run_reject(std::shared_ptr<Conn> c);
  awaitable<void> serve();
  awaitable<void> fail_read();
  awaitable<bool> write(std::string_view data);
  // One gathered send of prefix, the frame's pieces and suffix (the rest, if the socket takes less, copied
  // and written as write() does).
  awaitable<bool> write_frame(std::string_view prefix, const Frame& f, std::string_view suffix);
  std::vector<asio::const_buffer> gather;  // write_frame's buffers, kept for their capacity
  awaitable<bool> write_source(HttpResponse& res, bool keep_alive, bool head_only);
  awaitable<void> reply_and_close(int status, const std::string& msg);
  awaitable<void> linger();
  void watch_peer();
  void resume(error_code e) {
    if (!waiter) return;
    const std::unique_ptr<Waiter> w = std::move(waiter);  // the resumed coroutine may wait again
    w->resume(e);
  }
  void close_now() {
    closing = true;
    error_code e;
    sock.cancel(e);
    deadline.cancel();
    resume(asio::error::operation_aborted);
  }

  void arm(std::chrono::milliseconds d) {
    timed_out = false;
    const uint64_t gen = ++armed;
    deadline.expires_after(d);
    deadline.async_wait([w = weak_from_this(), gen](error_code e) {
      auto c = w.lock();
      if (e || !c || c->armed != gen) return;
      c->timed_out = true;
      error_code ignored;
      c->sock.cancel(ignored);
    });
  }
  void disarm() {
    ++armed;
    deadline.cancel();
  }
  auto token() { return asio::redirect_error(use_awaitable, ec); }
  // Sleeps until resume().
  auto wait_wake() {
    auto t = token();
    return asio::async_initiate<decltype(t), void(error_code)>(
        [this](auto handler) {
          struct Held : Waiter {
            explicit Held(decltype(handler)&& h) : h(std::move(h)) {}
            void resume(error_code e) override { std::move(h)(e); }
            decltype(handler) h;
          };
          waiter = std::make_unique<Held>(std::move(handler));
        },
        t);
  }
};

void IoShard::wake(const std::shared_ptr<WakeState>& ws) {
  if (ws->pending.exchange(true)) return;
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    ready.push_back(ws);
    post = !std::exchange(drain_posted, true);
  }
  if (post) asio::post(ioc, [this] { drain(); });  // the handler dies with ioc, a member
}

void IoShard::drain() {
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    draining.swap(ready);  // both keep their capacity from step to step
    drain_posted = false;
  }
  for (auto& ws : draining)
    if (auto c = ws->conn.lock()) c->resume({});  // this shard's thread: the connection's
  draining.clear();
}

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
    co_await c->reply_and_close(503, "too many connections (--max-connections " +
                                         std::to_string(c->srv.opts.max_connections) + "): retry later");
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

awaitable<bool> Conn::write_frame(std::string_view prefix, const Frame& f, std::string_view suffix) {
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
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) co_return false;
  if (now == total) co_return true;
  std::string rest;
  rest.reserve(total - now);
  size_t skip = now;
  for (const asio::const_buffer& b : gather) {
    const size_t n = b.size() > skip ? b.size() - skip : 0;
    rest.append(static_cast<const char*>(b.data()) + (b.size() - n), n);
    skip -= b.size() - n;
  }
  co_return co_await write(rest);
}

awaitable<bool> Conn::write_source(HttpResponse& res, bool keep_alive, bool head_only) {
  const std::shared_ptr<ResponseSource> src = res.source;
  struct Finish {  // finish() exactly once, also when this frame is destroyed mid-way
    ResponseSource* s;
    bool complete = false;
    ~Finish() { s->finish(complete); }
  } fin{src.get()};
  auto ws = std::make_shared<WakeState>(shard, weak_from_this());
  src->attach([ws] { ws->shard.wake(ws); });
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
      if (!co_await write_frame(wire::chunk_header(out.size(), hex), out, done ? "\r\n0\r\n\r\n" : "\r\n"))
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

HttpResponse HttpTransport::Impl::handle(const HttpRequest& req) noexcept {
  try {
    return routes.handle(req);
  } catch (const std::exception& e) {
    return error(500, std::string("internal error: ") + e.what());
  }
}

HttpResponse HttpTransport::Impl::error(int status, const std::string& msg) noexcept {
  try {
    return routes.error(status, msg);
  } catch (...) {
    HttpResponse r;
    r.status = status;
    r.content_type = "text/plain";
    r.body = msg;
    return r;
  }
}

awaitable<void> HttpTransport::Impl::accept_loop() {
  error_code ec;
  while (!stopping) {
    IoShard& shard = *shards[next_shard++ % shards.size()];
    tcp::socket s = co_await acceptor.async_accept(shard.ioc, asio::redirect_error(use_awaitable, ec));
    if (stopping || !acceptor.is_open()) break;
    if (ec) {  // out of descriptors, or the like: back off instead of spinning
      asio::steady_timer t(acceptor.get_executor(), 50ms);
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    s.set_option(tcp::no_delay(true), ec);
    counters.connections_total++;
    auto c = std::make_shared<Conn>(*this, shard, std::move(s));
    if (counters.connections_open >= opts.max_connections) {
      counters.connections_rejected++;
      if (rejecting < kMaxRejecting) {
        rejecting++;
        asio::co_spawn(c->sock.get_executor(), Conn::run_reject(c), asio::detached);
      }
      continue;  // else dropped: closed by ~Conn
    }
    counters.connections_open++;
    asio::co_spawn(c->sock.get_executor(), Conn::run(c), asio::detached);
  }
  std::lock_guard<std::mutex> lock(mu);
  accept_done = true;
  maybe_done();
}

void HttpTransport::Impl::forget(Conn* c) {
  std::lock_guard<std::mutex> lock(mu);
  conns.erase(c);
  maybe_done();
}

void HttpTransport::Impl::maybe_done() {
  if (!stopping || !accept_done || !conns.empty() || all_closed.exchange(true)) return;
  asio::post(acceptor.get_executor(), [self = shared_from_this()] { self->hard_stop.cancel(); });
}

void HttpTransport::Impl::arm_hard_stop(asio::steady_timer::time_point at) {
  hard_stop.expires_at(at);  // a wait replaced here ends with operation_aborted and does nothing
  hard_stop.async_wait([self = shared_from_this()](error_code e) {
    if (!e || self->all_closed)
      for (auto& sh : self->shards) sh->ioc.stop();
  });
}

HttpTransport::HttpTransport(TransportOptions opts, Routes routes, ServerCounters& counters)
    : impl_(std::make_shared<Impl>(std::move(opts), std::move(routes), counters)) {}

HttpTransport::~HttpTransport() {
  stop();
}

int HttpTransport::bind() {
  Impl& im = *impl_;
  // Past the descriptor limit accept() would fail and clients would wait unanswered in the backlog: keep the
  // cap below it, leaving room for the over-cap replies and the process's own files.
  const int64_t fds = wire::raise_fd_limit();
  const int64_t room = fds - std::min<int64_t>(kMaxRejecting + 64, fds / 4);
  if (room < im.opts.max_connections) im.opts.max_connections = int(std::max<int64_t>(1, room));
  error_code ec;
  asio::ip::address addr = asio::ip::make_address(im.opts.host, ec);
  if (ec) {  // a host name: its first address
    tcp::resolver res(im.shards[0]->ioc);
    auto r = res.resolve(im.opts.host, "", ec);
    KILN_CHECK(!ec && !r.empty(), "cannot resolve host '", im.opts.host, "': ", ec.message());
    addr = r.begin()->endpoint().address();
  }
  const tcp::endpoint ep(addr, uint16_t(im.opts.port));
  im.acceptor.open(ep.protocol(), ec);
  KILN_CHECK(!ec, "cannot open a socket for ", im.opts.host, ": ", ec.message());
  // SO_REUSEADDR allows a quick restart on a port in TIME_WAIT; no SO_REUSEPORT, so a second server on a
  // busy port fails instead of silently taking half its connections.
  im.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  im.acceptor.bind(ep, ec);
  KILN_CHECK(!ec, "cannot bind ", im.opts.host, ":", im.opts.port, " (", ec.message(), ")");
  im.acceptor.listen(4096, ec);  // a burst of clients (a benchmark opening 512 at once) fits the queue
  KILN_CHECK(!ec, "listen() failed: ", ec.message());
  return im.acceptor.local_endpoint().port();
}

void HttpTransport::run() {
  auto im = impl_;
  {
    std::lock_guard<std::mutex> lock(im->run_mu);
    if (im->stopping) return;
    im->ran = true;
    im->is_running = true;
  }
  asio::post(im->acceptor.get_executor(), [im] {
    if (!im->all_closed) im->arm_hard_stop(asio::steady_timer::time_point::max());
  });
  asio::co_spawn(im->acceptor.get_executor(), im->accept_loop(), asio::detached);
  std::vector<std::thread> threads;
  for (size_t i = 1; i < im->shards.size(); ++i)
    threads.emplace_back([im, i] {
      wire::raise_io_priority();
      im->shards[i]->ioc.run();
    });
  // The calling thread serves shard 0 (the acceptor's), at its own priority restored after.
  const int nice_before = getpriority(PRIO_PROCESS, id_t(::gettid()));
  wire::raise_io_priority();
  im->shards[0]->ioc.run();
  setpriority(PRIO_PROCESS, id_t(::gettid()), nice_before);
  for (auto& t : threads) t.join();
  im->is_running = false;
}

bool HttpTransport::running() const {
  return impl_->is_running && !impl_->stopping;
}

void HttpTransport::stop() {
  auto im = impl_;
  {
    std::lock_guard<std::mutex> lock(im->run_mu);
    if (im->stopping.exchange(true)) return;
    if (!im->ran) {  // no thread runs a shard: nothing to post to (and posting would keep `im` alive in it)
      error_code e;
      im->acceptor.close(e);
      return;
    }
  }
  asio::post(im->acceptor.get_executor(), [im] {
    error_code e;
    im->acceptor.close(e);
  });
  std::vector<std::shared_ptr<Conn>> live;
  {
    std::lock_guard<std::mutex> lock(im->mu);
    for (auto& [p, w] : im->conns)
      if (auto c = w.lock()) live.push_back(std::move(c));
    im->maybe_done();
  }
  for (auto& c : live) asio::post(c->sock.get_executor(), [c] { c->close_now(); });
  asio::post(im->acceptor.get_executor(), [im] {
    if (!im->all_closed) im->arm_hard_stop(asio::steady_timer::clock_type::now() + 5s);
  });
}

}  // namespace kiln::server
