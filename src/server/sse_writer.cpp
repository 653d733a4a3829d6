#include "server/sse_writer.h"

#include <array>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

namespace kiln::server::sse {
namespace {

// Bjoern Hoehrmann's UTF-8 DFA (MIT), the table nlohmann's serializer decodes with, so a sequence is
// rejected at the same byte as there.
constexpr uint8_t kAccept = 0, kReject = 1;
constexpr std::array<uint8_t, 400> kUtf8d = {
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // 00..1F
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // 20..3F
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // 40..5F
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // 60..7F
    1,  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    9,  9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9,  // 80..9F
    7,  7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7,  7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,  // A0..BF
    8,  8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2,  2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,  // C0..DF
    10, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 3, 3,  // E0..EF
    11, 6, 6, 6, 5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8,  // F0..FF
    0,  1, 2, 3, 5, 8, 7, 1, 1, 1, 4, 6, 1, 1, 1, 1,  // s0
    1,  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1,  0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1,  // s1..s2
    1,  2, 1, 1, 1, 1, 1, 2, 1, 2, 1, 1, 1, 1, 1, 1,
    1,  1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1,  // s3..s4
    1,  2, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1,
    1,  1, 1, 1, 1, 1, 1, 3, 1, 3, 1, 1, 1, 1, 1, 1,  // s5..s6
    1,  3, 1, 1, 1, 1, 1, 3, 1, 3, 1, 1, 1, 1, 1, 1,
    1,  3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,  // s7..s8
};

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Printable ASCII other than '"' and '\\': written as it is.
bool plain(char c) {
  const auto u = uint8_t(c);
  return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
}

// Escapes `s` (without quotes) onto `out` as nlohmann's dump_escaped does with ensure_ascii off and the
// replace handler. `partial`: stop at the last character boundary and return how many bytes were consumed
// (an unfinished sequence at the end is left for later); otherwise an unfinished sequence becomes U+FFFD.
size_t escape(std::string& out, std::string_view s, bool partial) {
  uint8_t state = kAccept;
  uint32_t cp = 0;
  size_t out_at_accept = out.size();  // the output length after the last whole character
  size_t in_at_accept = 0;            // and the input consumed then
  size_t undumped = 0;                // bytes of an unfinished sequence
  for (size_t i = 0; i < s.size(); ++i) {
    if (state == kAccept && plain(s[i])) {  // a run of ASCII that needs no escape: appended at once
      size_t e = i + 1;
      while (e < s.size() && plain(s[e])) ++e;
      out.append(s.data() + i, e - i);
      out_at_accept = out.size();
      in_at_accept = e;
      undumped = 0;
      i = e - 1;
      continue;
    }
    const auto byte = uint8_t(s[i]);
    const uint8_t type = kUtf8d[byte];
    cp = state != kAccept ? (byte & 0x3fu) | (cp << 6u) : (0xffu >> type) & byte;
    state = kUtf8d[256u + state * 16u + type];
    if (state == kAccept) {
      switch (cp) {
        case 0x08:
          out += "\\b";
          break;
        case 0x09:
          out += "\\t";
          break;
        case 0x0a:
          out += "\\n";
          break;
        case 0x0c:
          out += "\\f";
          break;
        case 0x0d:
          out += "\\r";
          break;
        case 0x22:
          out += "\\\"";
          break;
        case 0x5c:
          out += "\\\\";
          break;
        default:
          if (cp <= 0x1f) {
            static constexpr char kHex[] = "0123456789abcdef";
            out += "\\u00";
            out += kHex[cp >> 4];
            out += kHex[cp & 15];
          } else {
            out += char(byte);  // the sequence's earlier bytes went out as they came
          }
      }
      out_at_accept = out.size();
      in_at_accept = i + 1;
      undumped = 0;
    } else if (state == kReject) {
      // Drop the unfinished sequence for one U+FFFD; a byte that broke a sequence is read again alone.
      if (undumped > 0) --i;
      out.resize(out_at_accept);
      out += kReplacement;
      out_at_accept = out.size();
      in_at_accept = i + 1;
      undumped = 0;
      state = kAccept;
    } else {
      out += char(byte);
      ++undumped;
    }
  }
  if (state == kAccept) return s.size();
  out.resize(out_at_accept);
  if (partial) return in_at_accept;
  out += kReplacement;
  return s.size();
}

void append_ctx_tail(std::string& out, const ResponseCtx& c, std::string_view object) {
  out += "],\"created\":";
  append_int(out, c.created);
  out += ",\"id\":";
  append_string(out, c.id);
  out += ",\"model\":";
  append_string(out, c.model);
  out += ",\"object\":\"";
  out += object;
  out += "\",\"system_fingerprint\":null";
}

void append_usage_and_end(std::string& out, const ChunkParts& p) {
  if (!p.usage_json.empty()) {
    out += ",\"usage\":";
    out += p.usage_json;
  }
  out += "}\n\n";
}

}  // namespace

void append_string(std::string& out, std::string_view s) {
  out += '"';
  escape(out, s, false);
  out += '"';
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, size_t(r.ptr - buf));
}

void append_double(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  std::array<char, 64> buf;  // nlohmann's number buffer size
  const char* end = nlohmann::detail::to_chars(buf.data(), buf.data() + buf.size(), v);
  out.append(buf.data(), size_t(end - buf.data()));
}

void StringCache::append_literal(Frame& out, const std::string& s) {
  const std::string_view rest = std::string_view(s).substr(done_);
  done_ += escape(escaped_, rest, true);
  out.bytes += '"';
  out.view(escaped_, escaped_.size());
  escape(out.bytes, std::string_view(s).substr(done_), false);
  out.bytes += '"';
}

void IdsCache::append_array(Frame& out, const std::vector<int32_t>& ids) {
  for (; done_ < ids.size(); ++done_) {
    if (done_ > 0) joined_ += ',';
    append_int(joined_, ids[done_]);
  }
  out.bytes += '[';
  out.view(joined_, joined_.size());
  out.bytes += ']';
}

void append_chat_chunk(std::string& out, const ResponseCtx& c, const ChunkParts& p) {
  out += "data: {\"choices\":[{\"delta\":";
  out += p.body_json;
  out += ",\"finish_reason\":";
  out += p.finish_reason_json;
  out += ",\"index\":";
  append_int(out, c.index);
  out += ",\"logprobs\":";
  out += p.logprobs_json;
  out += '}';
  append_ctx_tail(out, c, "chat.completion.chunk");
  append_usage_and_end(out, p);
}

void append_completion_chunk(std::string& out, const ResponseCtx& c, const ChunkParts& p) {
  out += "data: {\"choices\":[{\"finish_reason\":";
  out += p.finish_reason_json;
  out += ",\"index\":";
  append_int(out, c.index);
  out += ",\"logprobs\":";
  out += p.logprobs_json;
  out += ",\"text\":";
  out += p.body_json;
  out += '}';
  append_ctx_tail(out, c, "text_completion");
  append_usage_and_end(out, p);
}

void append_text_delta(std::string& out, const std::string& content, const std::string& reasoning) {
  out += '{';
  if (!content.empty() || reasoning.empty()) {
    out += "\"content\":";
    append_string(out, content);
  }
  if (!reasoning.empty()) {
    if (!content.empty()) out += ',';
    out += "\"reasoning_content\":";
    append_string(out, reasoning);
  }
  out += '}';
}

void append_generate_running(Frame& frame, const ResponseCtx& c, const OutputTracker& t, bool with_index,
                             double e2e_seconds, StringCache& text, IdsCache& ids) {
  std::string& out = frame.bytes;
  out += "data: {";
  if (with_index) {
    out += "\"index\":";
    append_int(out, c.index);
    out += ',';
  }
  out += "\"meta_info\":{\"cached_tokens\":";
  append_int(out, t.cached_tokens());
  out += ",\"completion_tokens\":";
  append_int(out, t.completion_tokens());
  out += ",\"e2e_latency\":";
  append_double(out, e2e_seconds);
  out += ",\"finish_reason\":null,\"id\":";
  append_string(out, c.id);
  out += ",\"prompt_tokens\":";
  append_int(out, t.prompt_tokens());
  if (const spec::SpecRequestStats& sp = t.spec();
      sp.verify_rows > 0) {  // as responses.cpp's append_spec_meta
    out += ",\"spec_accept_length\":";
    append_double(out, sp.accept_length());
    out += ",\"spec_accepted_tokens\":";
    append_int(out, sp.accepted_tokens);
    out += ",\"spec_draft_tokens\":";
    append_int(out, sp.draft_tokens);
    out += ",\"spec_verify_ct\":";
    append_int(out, sp.verify_rows);
  }
  out += "},\"output_ids\":";
  ids.append_array(frame, t.output_ids());
  out += ",\"text\":";
  text.append_literal(frame, t.text());
  out += "}\n\n";
}

}  // namespace kiln::server::sse
