// The HTTP/1.1 bytes the transport writes (heads, chunk framing) and the socket and process helpers it
// uses; see http_transport.cpp.
#pragma once

#include <boost/system/error_code.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_transport.h"

namespace kiln::server::wire {

// Status line and headers, through the blank line: Content-Length `length`, or chunked.
std::string response_head(const HttpResponse& r, bool keep_alive, bool chunked, size_t length);
// A chunk's header, "<size in hex>\r\n", in `buf` (its data and "\r\n" follow on the wire).
std::string_view chunk_header(size_t size, char (&buf)[24]);
// RFC 9112 6.3: why a request's framing headers are refused, "" when they are fine. The only
// Transfer-Encoding accepted is one field saying `chunked` (any case, optional whitespace), on HTTP/1.1,
// without Content-Length; any other coding, a list, a repeat, or chunked beside Content-Length is refused
// (400, and the connection closed: its body's end cannot be trusted). `te`: every Transfer-Encoding value.
std::string transfer_encoding_error(const std::vector<std::string_view>& te, bool has_content_length,
                                    bool http11);
// True when the client has closed or reset the connection (a non-blocking peek; pipelined bytes stay queued).
bool peer_gone(int fd);
// A malformed request (Beast's parse errors, not the end of the stream or a partial message).
bool is_http_parse_error(const boost::system::error_code& ec);
// I/O threads do little work each time they wake, and a CPU-bound engine (the CPU backend's pool) may share
// their cores: a higher priority lets them answer /health at once. Needs CAP_SYS_NICE; without it, nothing.
void raise_io_priority();
// Servers hold a descriptor per connection: take the hard limit (a no-op where the soft one already is).
// Returns the limit in force.
int64_t raise_fd_limit();
// Grows the process's descriptor table to hold `count` descriptors now. The kernel doubles the table as
// descriptors are opened, and in a process with threads each doubling waits for an RCU grace period (tens of
// milliseconds on a busy machine) inside whichever thread opened the descriptor: the thread accepting a burst
// of connections would stall there, and every poll waiting to be accepted with it.
// `fd`: any open descriptor (duplicated once, then closed).
void reserve_fd_table(int fd, int64_t count);

}  // namespace kiln::server::wire
