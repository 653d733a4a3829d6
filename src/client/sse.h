// Incremental Server-Sent Events parser (the WHATWG event-stream format): bytes arrive in arbitrary
// pieces (an event, a line, even a CRLF pair may be split across network reads) and complete events are
// handed out as soon as their terminating blank line is seen.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace kiln::client {

struct SseEvent {
  std::string event;  // the "event:" field; empty for the default "message"
  std::string data;   // "data:" lines joined with '\n'
};

class SseParser {
 public:
  using Sink = std::function<void(const SseEvent&)>;
  explicit SseParser(Sink sink) : sink_(std::move(sink)) {}

  // Lines end with "\r\n", "\n" or "\r". Comment lines (":...") are ignored; one space after "field:"
  // is stripped; an event is dispatched on a blank line when it holds data.
  void feed(std::string_view bytes);
  // End of stream: a final event not followed by a blank line is dispatched too (lenient, as some servers
  // end the body right after the last "data:" line).
  void finish();

 private:
  void line(std::string_view l);
  void dispatch();

  Sink sink_;
  std::string line_;
  bool skip_lf_ = false;  // the previous piece ended in '\r': a leading '\n' belongs to that line ending
  bool has_data_ = false;
  SseEvent cur_;
};

}  // namespace kiln::client
