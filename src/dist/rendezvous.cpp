#include "dist/rendezvous.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "kiln/error.h"

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_in(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
int ms_left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms > 0 ? int(ms) : 0;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  KILN_CHECK(rc == 0 && res, "rendezvous: cannot resolve '", host, "': ", ::gai_strerror(rc));
  return res;
}

// Waits until fd is ready for `events` or the deadline passes.
void wait_fd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return;
    KILN_CHECK(rc != 0, "rendezvous: timed out ", what);
    KILN_CHECK(errno == EINTR, "rendezvous: poll failed ", what, ": ", std::strerror(errno));
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    wait_fd(fd, POLLOUT, deadline, "sending");
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    KILN_CHECK(k > 0 || errno == EINTR || errno == EAGAIN, "rendezvous: send failed: ", std::strerror(errno));
    if (k > 0) p += k, n -= size_t(k);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    wait_fd(fd, POLLIN, deadline, "receiving");
    const ssize_t k = ::recv(fd, p, n, 0);
    KILN_CHECK(k != 0, "rendezvous: node 0 closed the connection early");
    KILN_CHECK(k > 0 || errno == EINTR || errno == EAGAIN, "rendezvous: recv failed: ", std::strerror(errno));
    if (k > 0) p += k, n -= size_t(k);
  }
}

constexpr uint32_t kMaxBlob = 1 << 20;

}  // namespace

void parse_dist_addr(const std::string& addr, std::string* host, int* port) {
  const size_t colon = addr.rfind(':');
  KILN_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < addr.size(),
             "--dist-init-addr must be host:port, got '", addr, "'");
  std::string h = addr.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);  // [::1]:port
  const std::string p = addr.substr(colon + 1);
  KILN_CHECK(p.find_first_not_of("0123456789") == std::string::npos && p.size() <= 5,
             "--dist-init-addr: bad port in '", addr, "'");
  const int v = std::stoi(p);
  KILN_CHECK(v >= 1 && v <= 65535, "--dist-init-addr: port must be in [1, 65535], got ", v);
  *host = h;
  *port = v;
}

RendezvousServer::RendezvousServer(const std::string& host, int port) {
  addrinfo* res = resolve(host, port, true);
  Fd s;
  s.fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  const bool ok = s.fd >= 0 && ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
                  ::bind(s.fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(s.fd, 64) == 0;
  const int err = errno;
  ::freeaddrinfo(res);
  KILN_CHECK(ok, "rendezvous: cannot listen on ", host, ":", port, ": ", std::strerror(err));
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  KILN_CHECK(::getsockname(s.fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0, "rendezvous: getsockname");
  port_ = sa.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  fd_ = s.fd;
  s.fd = -1;
}

RendezvousServer::~RendezvousServer() {
  if (fd_ >= 0) ::close(fd_);
}

void RendezvousServer::serve(const std::string& blob, int n_peers, double timeout_s) {
  KILN_CHECK(blob.size() <= kMaxBlob, "rendezvous: blob too large");
  const auto deadline = deadline_in(timeout_s);
  const uint32_t n = uint32_t(blob.size());
  for (int i = 0; i < n_peers; ++i) {
    wait_fd(fd_, POLLIN, deadline, "waiting for the other nodes");
    Fd c;
    c.fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    KILN_CHECK(c.fd >= 0, "rendezvous: accept failed: ", std::strerror(errno));
    send_all(c.fd, &n, sizeof n, deadline);
    send_all(c.fd, blob.data(), blob.size(), deadline);
  }
}

std::string rendezvous_fetch(const std::string& host, int port, double timeout_s) {
  const auto deadline = deadline_in(timeout_s);
  for (;;) {
    addrinfo* res = resolve(host, port, false);
    Fd c;
    c.fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = c.fd >= 0 && ::connect(c.fd, res->ai_addr, res->ai_addrlen) == 0;
    ::freeaddrinfo(res);
    if (connected) {
      uint32_t n = 0;
      recv_all(c.fd, &n, sizeof n, deadline);
      KILN_CHECK(n <= kMaxBlob, "rendezvous: node 0 announced ", n, " bytes");
      std::string blob(n, '\0');
      recv_all(c.fd, blob.data(), n, deadline);
      return blob;
    }
    // Node 0 may not be listening yet: retry until the deadline.
    KILN_CHECK(ms_left(deadline) > 0, "rendezvous: cannot reach node 0 at ", host, ":", port, ": ",
               std::strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string exchange_blob(const std::string& addr, int nnodes, int node_rank, const std::string& blob,
                          double timeout_s) {
  KILN_CHECK(nnodes >= 1, "--nnodes must be >= 1, got ", nnodes);
  KILN_CHECK(node_rank >= 0 && node_rank < nnodes, "--node-rank must be in [0, ", nnodes, "), got ",
             node_rank);
  if (nnodes == 1) return blob;
  std::string host;
  int port = 0;
  parse_dist_addr(addr, &host, &port);
  if (node_rank == 0) {
    RendezvousServer server(host, port);
    server.serve(blob, nnodes - 1, timeout_s);
    return blob;
  }
  return rendezvous_fetch(host, port, timeout_s);
}

}  // namespace kiln::dist
