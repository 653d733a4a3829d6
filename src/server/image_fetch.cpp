// http(s) image URLs through cpp-httplib (Debian's, built with OpenSSL: https verifies the server's
// certificate against the system's CA store). Each hop's host is resolved here and must be public unless
// --image-url-allow-private (address_policy.h); the client is pinned to the checked address.
#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <memory>

#include "server/address_policy.h"
#include "server/images.h"

namespace kiln::server {

namespace {

struct Url {
  bool https = false;
  std::string host;  // brackets of an IPv6 literal removed
  int port = 0;
  std::string authority;  // host[:port] as written: the Host header
  std::string path;       // path and query, "/" when empty; the fragment dropped
};

[[noreturn]] void fetch_failed(const std::string& url, const std::string& why) {
  throw vision::ImageError(vision::ImageErrorKind::fetch_failed, "image URL " + url + ": " + why);
}

Url parse_url(const std::string& url, const std::string& shown) {
  Url u;
  size_t at = 0;
  if (url.compare(0, 7, "http://") == 0) {
    at = 7;
  } else if (url.compare(0, 8, "https://") == 0) {
    u.https = true;
    at = 8;
  } else {
    fetch_failed(shown, "not an http(s) URL");
  }
  const size_t auth_end = std::min(url.find_first_of("/?#", at), url.size());
  u.authority = url.substr(at, auth_end - at);
  u.path = url.substr(auth_end);
  if (const size_t frag = u.path.find('#'); frag != std::string::npos) u.path.resize(frag);
  if (u.path.empty() || u.path[0] != '/') u.path.insert(0, "/");
  if (u.authority.find('@') != std::string::npos)
    fetch_failed(shown, "credentials in the URL are not supported");
  std::string port;
  if (!u.authority.empty() && u.authority[0] == '[') {
    const size_t close = u.authority.find(']');
    if (close == std::string::npos) fetch_failed(shown, "not a valid http(s) URL");
    u.host = u.authority.substr(1, close - 1);
    if (close + 1 < u.authority.size()) {
      if (u.authority[close + 1] != ':') fetch_failed(shown, "not a valid http(s) URL");
      port = u.authority.substr(close + 2);
    }
  } else {
    const size_t colon = u.authority.rfind(':');
    u.host = u.authority.substr(0, colon);
    if (colon != std::string::npos) port = u.authority.substr(colon + 1);
  }
  u.port = u.https ? 443 : 80;
  if (!port.empty()) {
    int n = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), n);
    if (ec != std::errc() || end != port.data() + port.size() || n < 1 || n > 65535)
      fetch_failed(shown, "not a valid port '" + port + "'");
    u.port = n;
  }
  if (u.host.empty()) fetch_failed(shown, "not a valid http(s) URL");
  return u;
}

}  // namespace

std::vector<uint8_t> fetch_url(const std::string& url, size_t max_bytes, const ImageFetchOptions& opts) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + opts.timeout;
  std::string current = url;
  for (int hop = 0; hop <= opts.max_redirects; ++hop) {
    const Url u = parse_url(current, url);
    // Resolved once here, every address checked (address_policy.h); the client connects to a checked one.
    std::string refusal;
    const std::vector<std::string> addrs = resolve_fetch_host(u.host, opts.allow_private, refusal);
    if (!refusal.empty()) fetch_failed(url, refusal);
    if (addrs.empty()) fetch_failed(url, "unreachable (host '" + u.host + "' does not resolve)");
    std::vector<uint8_t> body;
    bool too_big = false, late = false;
    int status = 0;
    std::string location;
    httplib::Result res{nullptr, httplib::Error::Connection};
    for (const std::string& addr : addrs) {
      std::unique_ptr<httplib::ClientImpl> cli;
      if (u.https)
        cli = std::make_unique<httplib::SSLClient>(u.host, u.port);
      else
        cli = std::make_unique<httplib::ClientImpl>(u.host, u.port);
      if (!cli->is_valid()) fetch_failed(url, "not a valid http(s) URL");
      cli->set_hostname_addr_map({{u.host, addr}});  // no second lookup: this address, checked above
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
      if (left.count() <= 0) fetch_failed(url, "timed out");
      const time_t sec = std::chrono::duration_cast<std::chrono::seconds>(left).count();
      const time_t usec = left.count() % 1000000;
      cli->set_connection_timeout(sec, usec);
      cli->set_read_timeout(sec, usec);
      cli->set_write_timeout(sec, usec);
      cli->set_follow_location(false);  // redirects counted and checked here, each under the same deadline
      body.clear();
      const httplib::Headers host_header{{"Host", u.authority}};
      res = cli->Get(
          u.path, host_header,
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
      if (res || res.error() != httplib::Error::Connection) break;  // else: the next address
    }
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
      current = location.front() == '/'
                    ? std::string(u.https ? "https://" : "http://") + u.authority + location
                    : location;
      if (current.rfind("http://", 0) != 0 && current.rfind("https://", 0) != 0)
        fetch_failed(url, "redirected to a non-http(s) URL");
      continue;  // the new host is resolved and checked like the first
    }
    if (status != 200) fetch_failed(url, "HTTP status " + std::to_string(status));
    return body;
  }
  fetch_failed(url, "more than " + std::to_string(opts.max_redirects) + " redirects");
}

}  // namespace kiln::server
