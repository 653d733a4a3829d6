// Which addresses the server may fetch image URLs from (server-side request forgery): by default only public
// unicast ones. A URL's host is resolved once, every address it resolves to is checked, and the connection
// goes to a checked address (image_fetch.cpp pins it), so a name that resolves differently the second time
// (DNS rebinding) cannot lead the fetch elsewhere.
#pragma once

#include <netinet/in.h>

#include <string>
#include <vector>

namespace kiln::server {

// The non-public range an address is in, named with its prefix ("loopback (127.0.0.0/8)",
// "unique-local (fc00::/7)", "IPv4-mapped IPv6 of private (10.0.0.0/8)"), or "" for a public address.
// Refused: unspecified, loopback, private (10/8, 172.16/12, 192.168/16), shared CGNAT (100.64/10),
// link-local (169.254/16, fe80::/10), IETF-reserved, documentation, benchmarking, multicast, reserved
// (240/4, broadcast), unique-local (fc00::/7), site-local (fec0::/10), discard (100::/64), IPv4-compatible
// (::/96); IPv4-mapped (::ffff:0:0/96), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses are judged by
// the IPv4 address they carry.
std::string non_public_range(const in_addr& a);
std::string non_public_range(const in6_addr& a);

// The numeric addresses `host` resolves to (getaddrinfo, once), in the resolver's order. Unless
// allow_private, every one must be public: otherwise a message naming the address and its range goes to
// `refusal` and nothing is returned. An unresolvable host: empty, with `refusal` empty.
std::vector<std::string> resolve_fetch_host(const std::string& host, bool allow_private,
                                            std::string& refusal);

}  // namespace kiln::server
