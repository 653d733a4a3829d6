// The direct SSE/JSON writer (src/server/sse_writer.h) against nlohmann's dump of the same values: strings
// with every escape, non-ASCII and invalid UTF-8 (replaced where nlohmann replaces), numbers, the chunk
// shapes, and the cached cumulative /generate frame grown a piece at a time.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "server/generation.h"
#include "server/responses.h"
#include "server/sse_writer.h"
#include "test_server_fakes.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;

namespace {

std::string literal(std::string_view s) {
  std::string out;
  sse::append_string(out, s);
  return out;
}

// Strings that stress the UTF-8 decoder: mostly high bytes, some ASCII and control characters.
std::string random_bytes(std::mt19937& rng, size_t max_len) {
  static const uint8_t pool[] = {'a',  '"',  '\\', '\n', 0x01, 0x1f, 0x7f, 0x80, 0x8f, 0x9f, 0xa0, 0xbf,
                                 0xc0, 0xc2, 0xdf, 0xe0, 0xe2, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0x00};
  std::string s(rng() % (max_len + 1), '\0');
  for (char& c : s) c = char(pool[rng() % sizeof pool]);
  return s;
}

ResponseCtx ctx(int index = 0) {
  ResponseCtx c;
  c.id = "cmpl-\"q\\x\"é";
  c.created = 1764547200;
  c.model = "demo/\u00e9\t";
  c.index = index;
  return c;
}

}  // namespace

TEST(SseWriter, StringsMatchNlohmannIncludingInvalidUtf8) {
  const std::vector<std::string> fixed = {"",
                                          "plain",
                                          "quote \" backslash \\ slash /",
                                          "\b\f\n\r\t",
                                          std::string("\0\x01\x1f\x7f", 4),
                                          "é中🙂",
                                          "\x80",
                                          "\xff",
                                          "\xe2\x82",
                                          "\xe2\x82"
                                          "a",
                                          "\xc0\x80",
                                          "\xed\xa0\x80",
                                          "\xf4\x90\x80\x80",
                                          "\xf0\x9f\x99",
                                          "ok\xe4\xb8"
                                          "\xe4\xb8\xad",
                                          "\xc3\xa9\xc3"};
  for (const auto& s : fixed) EXPECT_EQ(literal(s), dump_json(json(s))) << json(valid_utf8(s)).dump();
  for (int c = 0; c < 256; ++c) {
    const std::string s(1, char(c));
    EXPECT_EQ(literal(s), dump_json(json(s))) << c;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::string s = random_bytes(rng, 12);
    ASSERT_EQ(literal(s), dump_json(json(s))) << json(valid_utf8(s)).dump();
  }
}

TEST(SseWriter, GrowingStringCacheMatchesAWholeDump) {
  std::mt19937 rng(11);
  for (int i = 0; i < 3000; ++i) {
    sse::StringCache cache;
    std::string s;
    for (int piece = 0; piece < 8; ++piece) {
      s += random_bytes(rng, 4);
      Frame out;
      cache.append_literal(out, s);
      ASSERT_EQ(out.str(), dump_json(json(s))) << json(valid_utf8(s)).dump();
    }
  }
  sse::IdsCache ids;
  std::vector<int32_t> v;
  for (int32_t x : {0, 7, -1, 151935, 2147483647}) {
    v.push_back(x);
    Frame out;
    ids.append_array(out, v);
    EXPECT_EQ(out.str(), json(v).dump());
  }
}

// A frame's views name a prefix of an append-only string and are read when the frame is sent: two views of
// one string in one frame (two events in one pull) stay right across the reallocation between them.
TEST(SseWriter, FrameViewsAreResolvedWhenSent) {
  std::string grows = "ab";
  Frame f;
  f.bytes += "<";
  f.view(grows, grows.size());
  f.bytes += "|";
  grows += std::string(4096, 'x');  // reallocates
  f.view(grows, 3);
  f.view(grows, 0);  // nothing
  f.bytes += ">";
  EXPECT_EQ(f.size(), 8u);
  EXPECT_EQ(f.str(), "<ab|abx>");
  std::string flat = "head:";
  f.append_to(flat);
  EXPECT_EQ(flat, "head:<ab|abx>");
  f.clear();
  EXPECT_TRUE(f.empty());
  f.bytes = "only bytes";
  EXPECT_EQ(f.str(), "only bytes");
}

TEST(SseWriter, NumbersMatchNlohmann) {
  for (double d : {0.0, -0.0, 1.0, 0.1, 1e-5, 1.5e-7, 123456789.125, 2.5e15, 1e16, 1e300, 0.0123456789012345,
                   std::numeric_limits<double>::denorm_min(), std::nan(""), double(INFINITY)}) {
    std::string out;
    sse::append_double(out, d);
    EXPECT_EQ(out, json(d).dump()) << d;
  }
  for (int64_t i : {int64_t(0), int64_t(-5), int64_t(1764547200), std::numeric_limits<int64_t>::min()}) {
    std::string out;
    sse::append_int(out, i);
    EXPECT_EQ(out, json(i).dump());
  }
}

TEST(SseWriter, ChunksMatchTheJsonShapes) {
  const std::vector<std::pair<std::string, std::string>> deltas = {
      {"", ""}, {"Hello \"w\"\n", ""}, {"", "think é"}, {"a", "b\xff"}};
  for (int index : {0, 3}) {
    const ResponseCtx c = ctx(index);
    for (const auto& [content, reasoning] : deltas) {
      ParsedDelta pd;
      pd.content = content;
      pd.reasoning = reasoning;
      std::string body;
      sse::append_text_delta(body, content, reasoning);
      EXPECT_EQ(body, dump_json(chat_delta(pd)));
      std::string out;
      sse::append_chat_chunk(out, c, {body, "null", "null", ""});
      EXPECT_EQ(out, sse_frame(chat_chunk(c, chat_delta(pd), nullptr, nullptr)));
    }
    const json lp = {{"content", json::array({{{"token", "x"}, {"logprob", -0.25}}})}};
    const json usage = {{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}};
    const json delta = {{"content", "x"}};
    std::string out;
    sse::append_chat_chunk(out, c, {dump_json(delta), "\"stop\"", dump_json(lp), dump_json(usage)});
    json want = chat_chunk(c, delta, "stop", lp);
    want["usage"] = usage;
    EXPECT_EQ(out, sse_frame(want));

    for (const std::string text : {"", "tok\u00e9n", "\x01\xe2\x82"}) {
      std::string lit, chunk;
      sse::append_string(lit, text);
      sse::append_completion_chunk(chunk, c, {lit, "null", "null", "null"});
      json w = completion_chunk(c, text, nullptr, nullptr);
      w["usage"] = nullptr;
      EXPECT_EQ(chunk, sse_frame(w));
    }
  }
}

TEST(SseWriter, CumulativeGenerateFramesMatchGenerateResponse) {
  fake::ByteCodec codec;
  for (int n : {1, 2}) {
    GenSpec spec;
    spec.endpoint = Endpoint::generate;
    spec.prompt = {1, 2, 3};
    spec.n = n;
    spec.stream = true;
    OutputTracker t(codec, spec);
    const ResponseCtx c = ctx(n - 1);
    sse::StringCache text;
    sse::IdsCache ids;
    const std::string reply = "He said \"é中\"\n\x01 \xf0\x9f\x99\x82!";
    TokenEvent e;
    e.prompt_tokens = 3;
    e.cached_tokens = 1;
    for (size_t i = 0; i < reply.size(); ++i) {
      e.ids = {int32_t(uint8_t(reply[i]))};
      e.completion_tokens = int(i + 1);
      if (i >= 4) e.spec = {int32_t(i / 4), int32_t(i), int32_t(i / 2)};  // speculative decoding's counts
      t.consume(e);
      const double e2e = 0.001 * double(i) + 1e-6;
      Frame out;
      sse::append_generate_running(out, c, t, n > 1, e2e, text, ids);
      ASSERT_EQ(out.str(), sse_frame(generate_response(c, t, spec, codec, e2e))) << i;
      const json meta = generate_response(c, t, spec, codec, e2e)["meta_info"];
      EXPECT_EQ(meta.contains("spec_verify_ct"), i >= 4) << i;
      if (i >= 4) {
        EXPECT_EQ(meta["spec_verify_ct"], int(i / 4));
        EXPECT_EQ(meta["spec_draft_tokens"], int(i));
        EXPECT_EQ(meta["spec_accepted_tokens"], int(i / 2));
        EXPECT_DOUBLE_EQ(meta["spec_accept_length"].get<double>(), 1.0 + double(i / 2) / double(i / 4));
      }
    }
  }
}
