// The transport's internals, shared by http_transport.cpp (accepting, wake-ups, run and stop) and
// http_conn.cpp (one connection's life: reading requests, writing responses and streams, deadlines,
// lingering).
#pragma once

#include <atomic>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
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
#include "server/http_transport.h"
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

inline constexpr auto kLinger = 1s;  // how long a closing connection's unread input is drained
inline constexpr size_t kLingerBytes = 1u << 20;
inline constexpr int kMaxRejecting =
    256;  // connections past the cap being answered at once; beyond, closed at once
// How long a connection past the cap may take to send its request (a probe sends it at once).
inline constexpr std::chrono::milliseconds kOverCapWait{2000};

struct Conn;
struct WakeState;

struct HttpTransport::Impl : std::enable_shared_from_this<HttpTransport::Impl> {
  Impl(TransportOptions o, Routes r, ServerCounters& c)
      : opts(std::move(o)),
        routes(std::move(r)),
        counters(c),
        workers(size_t(std::max(1, opts.worker_threads))) {}

  TransportOptions opts;
  Routes routes;
  ServerCounters& counters;
  // Declared in this order so the workers (which post into ioc) are joined before ioc goes.
  asio::io_context ioc;
  asio::thread_pool workers;
  tcp::acceptor acceptor{asio::make_strand(ioc)};
  // Keeps ioc.run() going until stop(); stop() re-arms it to 5 s, for a connection that will not close (a
  // handler blocked on a worker). On the acceptor's strand.
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

  // Response wake-ups from producer threads, coalesced: the first wake after a drain posts one drain task,
  // which hands every woken connection to its strand (a step's events for hundreds of streams cost the
  // producer one post, not one per stream).
  std::mutex ready_mu;
  std::vector<std::shared_ptr<WakeState>> ready;
  bool drain_posted = false;
  void wake(const std::shared_ptr<WakeState>& ws);
  void drain_ready();

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
  WakeState(HttpTransport::Impl& s, asio::any_io_executor e, std::weak_ptr<Conn> c)
      : srv(s), ex(std::move(e)), conn(std::move(c)) {}
  HttpTransport::Impl& srv;
  asio::any_io_executor ex;  // the connection's strand
  std::weak_ptr<Conn> conn;
  std::atomic<bool> pending{false};  // coalesces wakes: one per pull
};

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(HttpTransport::Impl& s, tcp::socket so) : srv(s), sock(std::move(so)), deadline(sock.get_executor()) {
    error_code e;
    sock.non_blocking(true, e);  // for write()'s first, synchronous attempt
  }

  HttpTransport::Impl& srv;
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
  awaitable<void> serve_over_cap();
  awaitable<void> serve();
  awaitable<void> fail_read();
  awaitable<bool> write(std::string_view data);
  // One gathered send of prefix, the frame's pieces and suffix, not suspending: false on a socket error;
  // what the socket did not take is copied to `rest` (empty when it took everything), for write().
  bool send_frame(std::string_view prefix, const Frame& f, std::string_view suffix, std::string& rest);
  std::vector<asio::const_buffer> gather;  // send_frame's buffers, kept for their capacity
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
    watch_deadline(gen);
  }
  // On expiry: flag the timeout and cancel the socket's pending operation. A composed read or write
  // (Beast's header read, Asio's async_write) caught between two of its steps has nothing pending, and its
  // next step would start unharmed, so the cancel repeats every millisecond until the coroutine moves on
  // (re-arms or disarms: a new generation). Timer and coroutine share the connection's strand.
  void watch_deadline(uint64_t gen) {
    deadline.async_wait([w = weak_from_this(), gen](error_code e) {
      auto c = w.lock();
      if (e || !c || c->armed != gen) return;
      c->timed_out = true;
      error_code ignored;
      c->sock.cancel(ignored);
      c->deadline.expires_after(std::chrono::milliseconds(1));
      c->watch_deadline(gen);
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

}  // namespace kiln::server
