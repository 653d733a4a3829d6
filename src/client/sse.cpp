#include "client/sse.h"

namespace kiln::client {

void SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') continue;
    }
    if (c == '\r' || c == '\n') {
      skip_lf_ = c == '\r';
      line(line_);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::finish() {
  if (!line_.empty()) {
    line(line_);
    line_.clear();
  }
  dispatch();
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {
    dispatch();
    return;
  }
  if (l.front() == ':') return;
  const size_t colon = l.find(':');
  std::string_view field = l.substr(0, colon), value;
  if (colon != std::string_view::npos) {
    value = l.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) cur_.data.push_back('\n');
    cur_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    cur_.event = std::string(value);
  }
  // "id" and "retry" mean nothing to a one-shot client; unknown fields are ignored as the format says.
}

void SseParser::dispatch() {
  if (has_data_) sink_(cur_);
  cur_ = SseEvent{};
  has_data_ = false;
}

}  // namespace kiln::client
