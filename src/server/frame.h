// Frame: the bytes one ResponseSource::pull() hands to the socket. Most are appended to `bytes`; a long
// field that grows by appends across a stream (/generate's cumulative text and ids) goes in as a view of
// the string that keeps it, so each frame is sent from where the field lives (one gathered send) instead of
// being copied into every frame.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kiln::server {

class Frame {
 public:
  std::string bytes;  // append here

  // Then the first n bytes of *s. *s must outlive the send and may only grow by appends until then (its
  // first n bytes never change): the view is resolved when the frame is sent, so a reallocation of *s in
  // between is harmless.
  void view(const std::string& s, size_t n) {
    if (n == 0) return;
    close_bytes();
    pieces_.push_back({&s, 0, n});
    viewed_ += n;
  }

  bool empty() const { return size() == 0; }
  size_t size() const { return viewed_ + bytes.size(); }
  void clear() {
    bytes.clear();
    pieces_.clear();
    closed_ = 0;
    viewed_ = 0;
  }
  // Calls f(const char* data, size_t len) for each piece, in order.
  template <typename F>
  void each(F&& f) const {
    for (const Piece& p : pieces_) f((p.src ? p.src->data() : bytes.data()) + p.off, p.len);
    if (closed_ < bytes.size()) f(bytes.data() + closed_, bytes.size() - closed_);
  }
  void append_to(std::string& out) const {
    out.reserve(out.size() + size());
    each([&](const char* d, size_t n) { out.append(d, n); });
  }
  std::string str() const {
    std::string s;
    append_to(s);
    return s;
  }

 private:
  struct Piece {
    const std::string* src;  // null: bytes[off, off + len)
    size_t off, len;
  };
  void close_bytes() {
    if (closed_ < bytes.size()) pieces_.push_back({nullptr, closed_, bytes.size() - closed_});
    closed_ = bytes.size();
  }

  std::vector<Piece> pieces_;
  size_t closed_ = 0;  // bytes[0, closed_) are in pieces_
  size_t viewed_ = 0;  // bytes in view pieces
};

}  // namespace kiln::server
