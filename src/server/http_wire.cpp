#include "server/http_wire.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>
#include <cerrno>
#include <climits>
#include <iterator>

namespace kiln::server {

namespace http = boost::beast::http;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (boost::beast::iequals(k, name)) return v;
  return "";
}

namespace wire {

std::string transfer_encoding_error(const std::vector<std::string_view>& te, bool has_content_length,
                                    bool http11) {
  if (te.empty()) return "";
  const std::string accepted = "; only a single 'Transfer-Encoding: chunked' is accepted";
  if (te.size() > 1) return "Transfer-Encoding given " + std::to_string(te.size()) + " times" + accepted;
  std::string_view v = te[0];
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (!boost::beast::iequals(v, "chunked"))
    return "Transfer-Encoding '" + std::string(v.substr(0, 64)) + "' is not supported" + accepted;
  if (has_content_length) return "Transfer-Encoding and Content-Length together" + accepted;
  if (!http11) return "Transfer-Encoding in an HTTP/1.0 request" + accepted;
  return "";
}

std::string response_head(const HttpResponse& r, bool keep_alive, bool chunked, size_t length) {
  std::string h = "HTTP/1.1 " + std::to_string(r.status) + ' ';
  const auto reason = http::obsolete_reason(http::int_to_status(unsigned(r.status)));
  h.append(reason.data(), reason.size());
  h += "\r\nContent-Type: " + r.content_type + "\r\n";
  for (const auto& [k, v] : r.headers) h += k + ": " + v + "\r\n";
  h += chunked ? std::string("Transfer-Encoding: chunked\r\n")
               : "Content-Length: " + std::to_string(length) + "\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

std::string_view chunk_header(size_t size, char (&buf)[24]) {
  char* p = std::end(buf) - 2;
  p[0] = '\r';
  p[1] = '\n';
  do {
    *--p = "0123456789abcdef"[size & 15];
    size >>= 4;
  } while (size > 0);
  return {p, size_t(std::end(buf) - p)};
}

bool peer_gone(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

bool is_http_parse_error(const boost::system::error_code& ec) {
  // The category object is a static of Beast's; compare addresses (no reference kept to a temporary).
  static const void* const cat = &make_error_code(http::error::bad_target).category();
  return static_cast<const void*>(&ec.category()) == cat && ec != http::error::end_of_stream &&
         ec != http::error::partial_message;
}

void raise_io_priority() {
  constexpr int kIoNice = -5;
  setpriority(PRIO_PROCESS, id_t(::gettid()), kIoNice);
}

int64_t raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return INT64_MAX;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur == RLIM_INFINITY ? INT64_MAX : int64_t(r.rlim_cur);
}

void reserve_fd_table(int fd, int64_t count) {
  if (count <= 0 || count > INT_MAX) return;
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, int(count - 1));  // the lowest free one >= count - 1
  if (high >= 0) ::close(high);
}

}  // namespace wire
}  // namespace kiln::server
