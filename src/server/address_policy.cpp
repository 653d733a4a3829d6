#include "server/address_policy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>

namespace kiln::server {

namespace {

struct Range4 {
  uint32_t prefix;
  int bits;
  const char* name;
};

constexpr uint32_t ip4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return (uint32_t(a) << 24) | (uint32_t(b) << 16) | (uint32_t(c) << 8) | uint32_t(d);
}

constexpr Range4 kRanges4[] = {
    {ip4(0, 0, 0, 0), 8, "unspecified (0.0.0.0/8)"},
    {ip4(10, 0, 0, 0), 8, "private (10.0.0.0/8)"},
    {ip4(100, 64, 0, 0), 10, "shared, carrier-grade NAT (100.64.0.0/10)"},
    {ip4(127, 0, 0, 0), 8, "loopback (127.0.0.0/8)"},
    {ip4(169, 254, 0, 0), 16, "link-local (169.254.0.0/16)"},
    {ip4(172, 16, 0, 0), 12, "private (172.16.0.0/12)"},
    {ip4(192, 0, 0, 0), 24, "IETF protocol assignments (192.0.0.0/24)"},
    {ip4(192, 0, 2, 0), 24, "documentation (192.0.2.0/24)"},
    {ip4(192, 168, 0, 0), 16, "private (192.168.0.0/16)"},
    {ip4(198, 18, 0, 0), 15, "benchmarking (198.18.0.0/15)"},
    {ip4(198, 51, 100, 0), 24, "documentation (198.51.100.0/24)"},
    {ip4(203, 0, 113, 0), 24, "documentation (203.0.113.0/24)"},
    {ip4(224, 0, 0, 0), 4, "multicast (224.0.0.0/4)"},
    {ip4(240, 0, 0, 0), 4, "reserved or broadcast (240.0.0.0/4)"},
};

std::string range_of(uint32_t a) {
  for (const Range4& r : kRanges4)
    if ((a >> (32 - r.bits)) == (r.prefix >> (32 - r.bits))) return r.name;
  return "";
}

uint32_t v4_at(const in6_addr& a, int byte) {
  const uint8_t* b = a.s6_addr;
  return ip4(b[byte], b[byte + 1], b[byte + 2], b[byte + 3]);
}

// The first `bits` bits of `a` equal those of the 16 bytes `p`.
bool has_prefix(const in6_addr& a, const uint8_t (&p)[16], int bits) {
  const uint8_t* b = a.s6_addr;
  for (int i = 0; i < bits / 8; ++i)
    if (b[i] != p[i]) return false;
  const int rest = bits % 8;
  return rest == 0 || (b[bits / 8] >> (8 - rest)) == (p[bits / 8] >> (8 - rest));
}

std::string carried(const char* how, uint32_t v4) {
  const std::string r = range_of(v4);
  return r.empty() ? "" : std::string(how) + " of " + r;
}

}  // namespace

std::string non_public_range(const in_addr& a) {
  return range_of(ntohl(a.s_addr));
}

std::string non_public_range(const in6_addr& a) {
  static constexpr uint8_t zero[16] = {};
  static constexpr uint8_t loop[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static constexpr uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static constexpr uint8_t nat64[16] = {0, 0x64, 0xff, 0x9b};
  static constexpr uint8_t nat64_local[16] = {0, 0x64, 0xff, 0x9b, 0, 1};
  static constexpr uint8_t discard[16] = {0x01, 0x00};
  static constexpr uint8_t ietf[16] = {0x20, 0x01};
  static constexpr uint8_t doc[16] = {0x20, 0x01, 0x0d, 0xb8};
  static constexpr uint8_t six_to_four[16] = {0x20, 0x02};
  static constexpr uint8_t ula[16] = {0xfc};
  static constexpr uint8_t link_local[16] = {0xfe, 0x80};
  static constexpr uint8_t site_local[16] = {0xfe, 0xc0};
  static constexpr uint8_t multicast[16] = {0xff};
  if (has_prefix(a, zero, 128)) return "unspecified (::/128)";
  if (has_prefix(a, loop, 128)) return "loopback (::1/128)";
  if (has_prefix(a, mapped, 96)) return carried("IPv4-mapped IPv6", v4_at(a, 12));
  if (has_prefix(a, zero, 96)) return "IPv4-compatible IPv6 (::/96, deprecated)";
  if (has_prefix(a, nat64, 96)) return carried("NAT64 (64:ff9b::/96)", v4_at(a, 12));
  if (has_prefix(a, nat64_local, 48)) return "local-use NAT64 (64:ff9b:1::/48)";
  if (has_prefix(a, discard, 64)) return "discard-only (100::/64)";
  if (has_prefix(a, doc, 32)) return "documentation (2001:db8::/32)";
  if (has_prefix(a, ietf, 23)) return "IETF protocol assignments, Teredo included (2001::/23)";
  if (has_prefix(a, six_to_four, 16)) return carried("6to4 (2002::/16)", v4_at(a, 2));
  if (has_prefix(a, ula, 7)) return "unique-local (fc00::/7)";
  if (has_prefix(a, link_local, 10)) return "link-local (fe80::/10)";
  if (has_prefix(a, site_local, 10)) return "site-local (fec0::/10, deprecated)";
  if (has_prefix(a, multicast, 8)) return "multicast (ff00::/8)";
  return "";
}

std::vector<std::string> resolve_fetch_host(const std::string& host, bool allow_private,
                                            std::string& refusal) {
  refusal.clear();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return {};
  std::vector<std::string> out;
  for (const addrinfo* p = res; p; p = p->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    std::string range;
    if (p->ai_family == AF_INET) {
      const in_addr& a = reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr;
      inet_ntop(AF_INET, &a, text, sizeof text);
      range = non_public_range(a);
    } else if (p->ai_family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr;
      inet_ntop(AF_INET6, &a, text, sizeof text);
      range = non_public_range(a);
    } else {
      continue;
    }
    if (!allow_private && !range.empty()) {
      refusal = "host '" + host + "' resolves to " + text + ", which is " + range +
                ": image URLs may only name public addresses (--image-url-allow-private lifts this)";
      out.clear();
      break;
    }
    bool seen = false;
    for (const auto& s : out) seen = seen || s == text;
    if (!seen) out.emplace_back(text);
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace kiln::server
