// Server-side request forgery (issue 41): image URLs naming loopback, private, link-local and other
// non-public addresses are refused by default, whatever spelling or name leads there; the refusal names the
// range and the flag, and nothing reaches the host. --image-url-allow-private (allow_private) lifts it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <thread>

#include "server/address_policy.h"
#include "server/images.h"

using namespace kiln;
using namespace kiln::server;
using namespace std::chrono_literals;

namespace {

std::string range_of(const char* text) {
  in_addr a4{};
  if (inet_pton(AF_INET, text, &a4) == 1) return non_public_range(a4);
  in6_addr a6{};
  EXPECT_EQ(inet_pton(AF_INET6, text, &a6), 1) << text;
  return non_public_range(a6);
}

// A loopback web server that counts the requests it got.
struct Host {
  Host() {
    srv.Get("/x.png", [this](const httplib::Request&, httplib::Response& res) {
      ++hits;
      res.set_content("not really a png", "image/png");
    });
    srv.Get("/to_private", [this](const httplib::Request&, httplib::Response& res) {
      ++hits;
      res.set_redirect("http://10.1.2.3/x.png");
    });
    port = srv.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { srv.listen_after_bind(); });
    for (int i = 0; i < 400 && !srv.is_running(); ++i) std::this_thread::sleep_for(5ms);
  }
  ~Host() {
    srv.stop();
    thread.join();
  }
  httplib::Server srv;
  int port = 0;
  std::atomic<int> hits{0};
  std::thread thread;
};

std::string fetch_error(const std::string& url, const ImageFetchOptions& o) {
  try {
    fetch_url(url, 1 << 20, o);
  } catch (const vision::ImageError& e) {
    EXPECT_EQ(e.kind(), vision::ImageErrorKind::fetch_failed) << e.what();
    return e.what();
  }
  return "fetched";
}

}  // namespace

TEST(ImageUrlPolicy, NonPublicRangesAreNamed) {
  for (const char* a : {"0.0.0.0",
                        "10.0.0.1",
                        "100.64.0.1",
                        "127.0.0.1",
                        "127.255.255.254",
                        "169.254.169.254",
                        "172.16.0.1",
                        "172.31.255.255",
                        "192.0.0.8",
                        "192.0.2.1",
                        "192.168.1.1",
                        "198.18.0.1",
                        "198.51.100.7",
                        "203.0.113.9",
                        "224.0.0.1",
                        "239.255.255.250",
                        "240.0.0.1",
                        "255.255.255.255",
                        "::",
                        "::1",
                        "::ffff:127.0.0.1",
                        "::ffff:10.0.0.1",
                        "::ffff:169.254.1.1",
                        "::127.0.0.1",
                        "64:ff9b::10.0.0.1",
                        "64:ff9b:1::1",
                        "100::1",
                        "2001::1",
                        "2001:db8::1",
                        "2002:7f00:1::1",
                        "2002:c0a8:101::",
                        "fc00::1",
                        "fd12:3456::1",
                        "fe80::1",
                        "febf::1",
                        "fec0::1",
                        "ff02::1"})
    EXPECT_NE(range_of(a), "") << a << " was judged public";
  EXPECT_NE(range_of("127.0.0.1").find("loopback (127.0.0.0/8)"), std::string::npos);
  EXPECT_NE(range_of("::ffff:10.0.0.1").find("IPv4-mapped IPv6 of private (10.0.0.0/8)"), std::string::npos);
  EXPECT_NE(range_of("fe80::1").find("link-local (fe80::/10)"), std::string::npos);
  for (const char* a : {"8.8.8.8", "1.1.1.1", "172.32.0.1", "172.15.255.255", "192.169.0.1", "100.128.0.1",
                        "169.255.0.1", "223.255.255.255", "2606:4700::1111", "2a00:1450::1", "::ffff:8.8.8.8",
                        "64:ff9b::8.8.8.8", "2002:808:808::"})
    EXPECT_EQ(range_of(a), "") << a << " was judged non-public";
}

TEST(ImageUrlPolicy, LoopbackIsRefusedByDefaultInEverySpelling) {
  Host host;
  ImageFetchOptions o;
  o.timeout = 2s;
  const std::string port = std::to_string(host.port);
  for (const std::string& url :
       {"http://127.0.0.1:" + port + "/x.png", "http://localhost:" + port + "/x.png",
        "http://127.1:" + port + "/x.png", "http://2130706433:" + port + "/x.png",
        "http://[::1]:" + port + "/x.png", "http://[::ffff:127.0.0.1]:" + port + "/x.png",
        "http://0.0.0.0:" + port + "/x.png", "https://127.0.0.1:" + port + "/x.png"}) {
    const std::string msg = fetch_error(url, o);
    const char* range = url.find("0.0.0.0") != std::string::npos ? "which is unspecified" : "loopback (";
    EXPECT_NE(msg.find(range), std::string::npos) << url << ": " << msg;
    EXPECT_NE(msg.find("--image-url-allow-private"), std::string::npos) << msg;
  }
  EXPECT_EQ(host.hits, 0);
  EXPECT_NE(fetch_error("http://user:pw@example.com/x.png", o).find("credentials"), std::string::npos);
  EXPECT_NE(fetch_error("http://127.0.0.1:99999/x.png", o).find("port"), std::string::npos);
}

TEST(ImageUrlPolicy, AllowPrivateFetchesAndRedirectsAreCheckedAgain) {
  Host host;
  ImageFetchOptions o;
  o.timeout = 2s;
  o.allow_private = true;
  const std::string base = "http://localhost:" + std::to_string(host.port);
  // localhost may resolve to ::1 first, where nothing listens: the next checked address is tried.
  const auto bytes = fetch_url(base + "/x.png", 1 << 20, o);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "not really a png");
  EXPECT_EQ(host.hits, 1);
  // A redirect is resolved and judged like the first URL: with private addresses allowed, 10.1.2.3 is
  // fetched (and, unreachable from here, fails as unreachable or timed out, not as refused).
  ImageFetchOptions quick = o;
  quick.timeout = 300ms;
  const std::string redirected = fetch_error(base + "/to_private", quick);
  EXPECT_EQ(redirected.find("--image-url-allow-private"), std::string::npos) << redirected;
  EXPECT_EQ(host.hits, 2);
}
