// HttpTransport on Boost.Asio + Boost.Beast (see http_transport.h for the contract): the I/O threads, the
// accept loop, coalesced response wake-ups, run and stop. One coroutine per connection on its own strand
// (http_conn.cpp); one watchdog timer per connection enforces every deadline by cancelling the socket's
// pending operation; responses are written as raw HTTP/1.1 (status line, headers, chunks).
#include <sys/resource.h>
#include <unistd.h>

#include "server/http_transport_impl.h"

namespace kiln::server {

void HttpTransport::Impl::wake(const std::shared_ptr<WakeState>& ws) {
  if (ws->pending.exchange(true)) return;
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    ready.push_back(ws);
    post = !std::exchange(drain_posted, true);
  }
  if (post) asio::post(ioc, [this] { drain_ready(); });  // the handler dies with ioc, a member
}

void HttpTransport::Impl::drain_ready() {
  std::vector<std::shared_ptr<WakeState>> batch;
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    batch.swap(ready);
    drain_posted = false;
  }
  for (auto& ws : batch)
    asio::post(ws->ex, [w = ws->conn] {
      if (auto c = w.lock()) c->resume({});
    });
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
    tcp::socket s =
        co_await acceptor.async_accept(asio::make_strand(ioc), asio::redirect_error(use_awaitable, ec));
    if (stopping || !acceptor.is_open()) break;
    if (ec) {  // out of descriptors, or the like: back off instead of spinning
      asio::steady_timer t(acceptor.get_executor(), 50ms);
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    s.set_option(tcp::no_delay(true), ec);
    counters.connections_total++;
    auto c = std::make_shared<Conn>(*this, std::move(s));
    if (counters.connections_open >= opts.max_connections) {
      if (rejecting < kMaxRejecting) {  // counted as rejected unless it is a probe that gets its answer
        rejecting++;
        asio::co_spawn(c->sock.get_executor(), Conn::run_reject(c), asio::detached);
      } else {
        counters.connections_rejected++;
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
    if (!e || self->all_closed) self->ioc.stop();
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
    tcp::resolver res(im.ioc);
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
  wire::reserve_fd_table(im.acceptor.native_handle(),
                         std::min(fds, int64_t(im.opts.max_connections) + kMaxRejecting + 256));
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
  for (int i = 1; i < im->opts.io_threads; ++i)
    threads.emplace_back([im] {
      wire::raise_io_priority();
      im->ioc.run();
    });
  // The calling thread serves too, at its own priority restored after.
  const int nice_before = getpriority(PRIO_PROCESS, id_t(::gettid()));
  wire::raise_io_priority();
  im->ioc.run();
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
    if (!im->ran) {  // no thread runs ioc: nothing to post to (and posting would keep `im` alive in it)
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
