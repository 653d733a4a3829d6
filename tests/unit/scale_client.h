// Loopback HTTP/1.1 clients for the scale tests, without a thread per connection: raw sockets, requests
// written whole or trickled, replies read until the server closes (requests say "Connection: close"), all
// driven by one poll() loop with a deadline. Also a timed one-shot GET for latency probes.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::test::scale {

using Clock = std::chrono::steady_clock;

// The soft descriptor limit raised to the hard one; returns the limit now in force.
inline long raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  getrlimit(RLIMIT_NOFILE, &r);
  return long(r.rlim_cur);
}

// The calling thread's priority raised (nice -10) where permitted: a prober stands for a load balancer on
// another machine, so the test's own client threads should not delay it on a shared CPU.
inline void raise_thread_priority() {
  setpriority(PRIO_PROCESS, id_t(::gettid()), -10);
}
// The calling thread's priority lowered (nice 10; always permitted): where the prober's cannot be raised
// (an unprivileged CI machine), the test's own load thread yields the shared CPU to it instead.
inline void lower_thread_priority() {
  setpriority(PRIO_PROCESS, id_t(::gettid()), 10);
}

// A connected socket to 127.0.0.1:port (blocking connect), or -1.
inline int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

inline std::string post_request(const std::string& path, const std::string& body, bool declare_full = true) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n" +
         "Content-Length: " + std::to_string(declare_full ? body.size() : body.size() + 100) + "\r\n\r\n" +
         body;
}

// One client connection: `out` is written (all at once, or one byte every `trickle` when set), `in` collects
// the reply until the server closes.
struct Conn {
  int fd = -1;
  std::string out;
  size_t sent = 0;
  std::chrono::milliseconds trickle{0};
  Clock::time_point next_send{};
  std::string in;
  bool eof = false;
  Clock::time_point closed_at{};
};

// Runs every connection until each has been closed by the server, or `deadline`. Returns true when all were.
inline bool pump(std::vector<Conn*>& conns, Clock::time_point deadline) {
  for (Conn* c : conns) fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  std::vector<pollfd> fds;
  char buf[16384];
  for (;;) {
    const auto now = Clock::now();
    fds.clear();
    size_t open = 0;
    for (Conn* c : conns) {
      if (c->eof) continue;
      ++open;
      if (c->sent < c->out.size() && (c->trickle.count() == 0 || now >= c->next_send)) {
        const size_t n = c->trickle.count() == 0 ? c->out.size() - c->sent : 1;
        const ssize_t w = ::send(c->fd, c->out.data() + c->sent, n, MSG_NOSIGNAL);
        if (w > 0) c->sent += size_t(w);
        c->next_send = now + c->trickle;
      }
      fds.push_back({c->fd, POLLIN, 0});
    }
    if (open == 0) return true;
    if (now >= deadline) return false;
    if (::poll(fds.data(), nfds_t(fds.size()), 20) < 0) return false;
    size_t k = 0;
    for (Conn* c : conns) {
      if (c->eof) continue;
      const pollfd& p = fds[k++];
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (;;) {
        const ssize_t r = ::recv(c->fd, buf, sizeof buf, 0);
        if (r > 0) {
          c->in.append(buf, size_t(r));
          continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
          c->eof = true;
          c->closed_at = Clock::now();
        }
        break;
      }
    }
  }
}

inline int status_of(const std::string& reply) {
  if (reply.compare(0, 9, "HTTP/1.1 ") != 0 || reply.size() < 12) return -1;
  return std::atoi(reply.substr(9, 3).c_str());
}

inline std::string header_of(const std::string& reply, const std::string& name) {
  const size_t end = reply.find("\r\n\r\n");
  const std::string key = "\r\n" + name + ": ";
  const size_t at = reply.find(key);
  if (at == std::string::npos || at > end) return "";
  const size_t v = at + key.size();
  return reply.substr(v, reply.find("\r\n", v) - v);
}

// The body of a reply, de-chunked when it is chunked; "" when malformed or cut short.
inline std::string body_of(const std::string& reply) {
  const size_t end = reply.find("\r\n\r\n");
  if (end == std::string::npos) return "";
  std::string rest = reply.substr(end + 4);
  if (header_of(reply, "Transfer-Encoding") != "chunked") return rest;
  std::string body;
  size_t pos = 0;
  for (;;) {
    const size_t eol = rest.find("\r\n", pos);
    if (eol == std::string::npos) return "";
    const size_t n = std::strtoul(rest.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (n == 0) return body;
    if (eol + 2 + n + 2 > rest.size()) return "";
    body.append(rest, eol + 2, n);
    pos = eol + 2 + n + 2;
  }
}

// GET path on a fresh connection; the time from connect to the whole reply, status in *status.
inline double timed_get(int port, const std::string& path, int* status, std::string* body = nullptr) {
  const auto t0 = Clock::now();
  Conn c;
  c.fd = dial(port);
  *status = -1;
  if (c.fd < 0) return 1e9;
  c.out = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::vector<Conn*> one{&c};
  pump(one, t0 + std::chrono::seconds(5));
  ::close(c.fd);
  *status = status_of(c.in);
  if (body) *body = body_of(c.in);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace kiln::test::scale
