// http(s) image URLs through cpp-httplib (Debian's, built with OpenSSL: https verifies the server's
// certificate against the system's CA store).
#include <httplib.h>

#include <charconv>
#include <chrono>

#include "server/images.h"

namespace kiln::server {

namespace {

struct Url {
  std::string scheme_host_port, path;
};

Url split_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  const size_t path_start = url.find('/', scheme_end + 3);
  Url u;
  u.scheme_host_port = url.substr(0, path_start);
  u.path = path_start == std::string::npos ? "/" : url.substr(path_start);
  const size_t frag = u.path.find('#');
  if (frag != std::string::npos) u.path.resize(frag);
  return u;
}

[[noreturn]] void fetch_failed(const std::string& url, const std::string& why) {
  throw vision::ImageError(vision::ImageErrorKind::fetch_failed, "image URL " + url + ": " + why);
}

}  // namespace

std::vector<uint8_t> fetch_url(const std::string& url, size_t max_bytes, const ImageFetchOptions& opts) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + opts.timeout;
  std::string current = url;
  for (int hop = 0; hop <= opts.max_redirects; ++hop) {
    const Url u = split_url(current);
    httplib::Client cli(u.scheme_host_port);
    if (!cli.is_valid()) fetch_failed(url, "not a valid http(s) URL");
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    if (left.count() <= 0) fetch_failed(url, "timed out");
    cli.set_connection_timeout(std::chrono::duration_cast<std::chrono::seconds>(left).count(),
                               left.count() % 1000000);
    cli.set_read_timeout(std::chrono::duration_cast<std::chrono::seconds>(left).count(),
                         left.count() % 1000000);
    cli.set_write_timeout(std::chrono::duration_cast<std::chrono::seconds>(left).count(),
                          left.count() % 1000000);
    cli.set_follow_location(false);  // redirects counted here, each one under the same deadline
    std::vector<uint8_t> body;
    bool too_big = false, late = false;
    int status = 0;
    std::string location;
    auto res = cli.Get(
        u.path,
        [&](const httplib::Response& r) {
          status = r.status;
          location = r.get_header_value("Location");
          if (r.status == 200 && r.has_header("Content-Length")) {
            const std::string n = r.get_header_value("Content-Length");
            uint64_t declared = 0;
            const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), declared);
            too_big = ec == std::errc::result_out_of_range || (ec == std::errc() && declared > max_bytes);
          }
          return !too_big;
        },
        [&](const char* data, size_t n) {
          if (Clock::now() > deadline) {
            late = true;
            return false;
          }
          if (body.size() + n > max_bytes) {
            too_big = true;
            return false;
          }
          body.insert(body.end(), data, data + n);
          return true;
        });
    if (too_big)
      throw vision::ImageError(
          vision::ImageErrorKind::too_many_bytes,
          "image URL " + url + ": more than the limit of " + std::to_string(max_bytes) + " bytes");
    if (late) fetch_failed(url, "timed out");
    if (!res) {
      const httplib::Error err = res.error();
      // A read that stops within a few ms of the deadline is the deadline (the socket timeouts are
      // approximate).
      if (Clock::now() + std::chrono::milliseconds(50) >= deadline) fetch_failed(url, "timed out");
      fetch_failed(url, err == httplib::Error::Connection ? "unreachable (connection failed)"
                                                          : "fetch failed (" + httplib::to_string(err) + ")");
    }
    if (status >= 300 && status < 400 && !location.empty()) {
      current = location.front() == '/' ? u.scheme_host_port + location : location;
      if (current.rfind("http://", 0) != 0 && current.rfind("https://", 0) != 0)
        fetch_failed(url, "redirected to a non-http(s) URL");
      continue;
    }
    if (status != 200) fetch_failed(url, "HTTP status " + std::to_string(status));
    return body;
  }
  fetch_failed(url, "more than " + std::to_string(opts.max_redirects) + " redirects");
}

}  // namespace kiln::server
