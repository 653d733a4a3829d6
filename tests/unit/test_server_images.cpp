// Image inputs through the real HTTP server (fake engine, a byte tokenizer whose chat rendering writes the
// vision tokens): data: URLs, http URLs from a loopback server of this test (its own ephemeral port), several
// images per message and per request, /generate image_data, and a 4xx with the right code for every bad image
// (truncated base64, truncated or zero-size or huge images, other formats, too many, unreachable or slow
// URLs, images to a text-only model). The server stays up and accounts every request.
#include <gtest/gtest.h>
#include <httplib.h>

#include <mutex>
#include <thread>

#include "test_server_harness.h"
#include "unit/vision_test_util.h"

namespace {

using namespace kiln::server;
using namespace std::chrono_literals;
using nlohmann::json;

constexpr int32_t kStart = 257, kEnd = 258, kPad = 259;

// ByteCodec, plus image parts rendered as the Qwen3-VL template does: \x01\x02\x03 = start, pad, end.
class VisionCodec : public fake::ByteCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c == 1 ? kStart : c == 2 ? kPad : c == 3 ? kEnd : int32_t(c));
    return ids;
  }
  std::string render_chat(const json& req) const override {
    std::string s;
    for (const auto& m : req["messages"]) {
      s += m["role"].get<std::string>() + ": ";
      if (m["content"].is_string()) {
        s += m["content"].get<std::string>();
      } else {
        for (const auto& part : m["content"])
          s += part["type"] == "text" ? part["text"].get<std::string>() : std::string("\x01\x02\x03");
      }
      s += "\n";
    }
    return s + "assistant:";
  }
};

std::string b64(const std::vector<uint8_t>& bytes) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    for (int k = 18; k >= 0; k -= 6) out += t[(v >> k) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = bytes[i] << 16;
    out += std::string{t[(v >> 18) & 63], t[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8);
    out += std::string{t[(v >> 18) & 63], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
  }
  return out;
}

std::vector<uint8_t> image(const char* name) {
  return kiln::vision_test::read_bytes(kiln::vision_test::fixture_dir() / "images" / name);
}
std::string data_url(const std::vector<uint8_t>& bytes, const char* mime = "image/png") {
  return std::string("data:") + mime + ";base64," + b64(bytes);
}

std::shared_ptr<const VisionSetup> small_vision() {
  auto v = std::make_shared<VisionSetup>();
  v->processor = kiln::vision::parse_processor_config(
      R"({"size": {"shortest_edge": 1024, "longest_edge": 16384}, "patch_size": 16, "merge_size": 2,
          "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})");
  v->tokens = {kStart, kEnd, kPad};
  v->limits.max_images = 4;
  v->limits.max_bytes = 30000;  // big_odd.png (~35 KB) is over
  v->limits.max_pixels = 1 << 20;
  v->fetch.timeout = 400ms;
  v->fetch.allow_private = true;  // the image host below is on loopback
  return v;
}

// A loopback image host: /<name> serves a fixture image, /slow waits past the fetch deadline, /big sends more
// than the byte limit, /redirect points at /odd_rgb.png.
struct ImageHost {
  ImageHost() {
    srv.Get("/slow", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(1200ms);
      res.set_content("late", "text/plain");
    });
    srv.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(200000, 'x'), "application/octet-stream");
    });
    srv.Get("/redirect",
            [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/odd_rgb.png"); });
    srv.Get(R"(/([a-z_]+\.(png|jpg|webp)))", [](const httplib::Request& req, httplib::Response& res) {
      const auto bytes = image(req.matches[1].str().c_str());
      if (bytes.empty()) {
        res.status = 404;
        return;
      }
      res.set_content(std::string(bytes.begin(), bytes.end()), "image/png");
    });
    port = srv.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { srv.listen_after_bind(); });
    for (int i = 0; i < 400 && !srv.is_running(); ++i) std::this_thread::sleep_for(5ms);
  }
  ~ImageHost() {
    srv.stop();
    thread.join();
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port) + path; }
  httplib::Server srv;
  int port = 0;
  std::thread thread;
};

class Harness : public fake::BasicServerHarness<VisionCodec> {
 public:
  explicit Harness(std::shared_ptr<const VisionSetup> vision = small_vision())
      : BasicServerHarness("ok", 1, options(std::move(vision)), 4) {
    engine.script = [this](const kiln::Request& r) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(r);
      return std::vector<int32_t>{'o', 'k', fake::kEos};
    };
  }
  static ServerOptions options(std::shared_ptr<const VisionSetup> vision) {
    ServerOptions o;
    o.vision = std::move(vision);
    return o;
  }
  httplib::Result post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
  kiln::Request last() {
    std::lock_guard<std::mutex> lock(mu);
    return seen.back();
  }
  size_t submitted() {
    std::lock_guard<std::mutex> lock(mu);
    return seen.size();
  }
  std::mutex mu;
  std::vector<kiln::Request> seen;
};

json image_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}
json text_part(const std::string& t) {
  return {{"type", "text"}, {"text", t}};
}
json chat(json content) {
  return {{"model", "demo"},
          {"max_tokens", 4},
          {"messages", {{{"role", "user"}, {"content", std::move(content)}}}}};
}

// The error's status and code.
void expect_error(const httplib::Result& r, int status, const std::string& code,
                  const std::string& words = "") {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  const json e = json::parse(r->body)["error"];
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << r->body;
  }
  if (!words.empty()) {
    EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos)
        << words << " not in " << r->body;
  }
}

int count(const std::vector<int32_t>& ids, int32_t id) {
  return int(std::count(ids.begin(), ids.end(), id));
}

}  // namespace

TEST(ServerImages, DataUrlBecomesPatchesAndPads) {
  Harness h;
  const auto r =
      h.post("/v1/chat/completions",
             chat({text_part("What is "), image_part(data_url(image("odd_rgb.png"))), text_part("?")}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const kiln::Request req = h.last();
  ASSERT_EQ(req.images.size(), 1u);
  // 53x37 with min 1024 / max 16384 pixels: 64x32 -> grid 2 x 4 -> 2 merged tokens.
  EXPECT_EQ(req.images[0].grid_h, 2);
  EXPECT_EQ(req.images[0].grid_w, 4);
  EXPECT_EQ(req.images[0].values.size(), size_t{8} * 1536);
  EXPECT_EQ(count(req.prompt, kPad), 2);
  EXPECT_EQ(count(req.prompt, kStart), 1);
  // usage counts the expanded prompt
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"].get<size_t>(), req.prompt.size());
}

TEST(ServerImages, SeveralImagesPerMessageAndRequestInOrder) {
  Harness h;
  ImageHost host;
  json body =
      chat({image_part(data_url(image("grey.png"))), text_part("and"), image_part(host.url("/photo.jpg"))});
  body["messages"].push_back({{"role", "assistant"}, {"content", "Two."}});
  body["messages"].push_back(
      {{"role", "user"}, {"content", {image_part(host.url("/redirect")), text_part("third")}}});
  const auto r = h.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const kiln::Request req = h.last();
  ASSERT_EQ(req.images.size(), 3u);
  // grey 45x45 -> 32x32 (1 token); photo 83x61 -> 96x64 (6); the redirect serves odd_rgb (2).
  EXPECT_EQ(req.images[0].merged_tokens(2), 1);
  EXPECT_EQ(req.images[1].merged_tokens(2), 6);
  EXPECT_EQ(req.images[2].merged_tokens(2), 2);
  EXPECT_EQ(count(req.prompt, kPad), 9);
  EXPECT_NE(req.images[0].content_hash, req.images[1].content_hash);
  // The same image twice has the same hash.
  ASSERT_EQ(h.post("/v1/chat/completions", chat({image_part(host.url("/odd_rgb.png"))}))->status, 200);
  EXPECT_EQ(h.last().images[0].content_hash, req.images[2].content_hash);
}

TEST(ServerImages, GenerateImageData) {
  Harness h;
  const std::string png = b64(image("odd_rgb.png"));
  json body = {{"text", "look: \x01\x02\x03 and \x01\x02\x03"},
               {"image_data", {png, data_url(image("grey.png"))}},
               {"sampling_params", {{"max_new_tokens", 2}}}};
  auto r = h.post("/generate", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(h.last().images.size(), 2u);
  EXPECT_EQ(count(h.last().prompt, kPad), 3);
  body["image_data"] = png;  // one string: one image, but two placeholders
  expect_error(h.post("/generate", body), 400, "", "2 image placeholder(s)");
  body = {{"input_ids", {1, kStart, kPad, kEnd}}, {"image_data", png}};
  r = h.post("/generate", body);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(count(h.last().prompt, kPad), 2);
  body["image_data"] = 7;
  expect_error(h.post("/generate", body), 400, "", "image_data");
}

TEST(ServerImages, BadImagesGetTheirCode) {
  Harness h;
  ImageHost host;
  const auto png = image("odd_rgb.png");
  std::string trunc_b64 = b64(png);
  trunc_b64.resize(trunc_b64.size() - 5);  // not a whole number of 4-character groups
  expect_error(h.post("/v1/chat/completions", chat({image_part("data:image/png;base64," + trunc_b64)})), 400,
               "invalid_image", "base64");
  expect_error(h.post("/v1/chat/completions", chat({image_part("data:image/png;base64,@@@@")})), 400,
               "invalid_image", "base64");
  const std::vector<uint8_t> half(png.begin(), png.begin() + long(png.size() / 2));
  expect_error(h.post("/v1/chat/completions", chat({image_part(data_url(half))})), 400, "invalid_image",
               "truncated");
  const std::string gif = "GIF89a\x01\x00\x01\x00\x00\x00\x00";
  expect_error(h.post("/v1/chat/completions", chat({image_part(data_url({gif.begin(), gif.end()}))})), 400,
               "unsupported_image_format", "GIF");
  expect_error(h.post("/v1/chat/completions", chat({image_part(data_url({}))})), 400, "invalid_image",
               "empty");
  expect_error(h.post("/v1/chat/completions", chat({image_part("data:image/png,abc")})), 400, "invalid_image",
               "base64");
  expect_error(h.post("/v1/chat/completions", chat({image_part("ftp://example.com/a.png")})), 400,
               "invalid_image", "'ftp:'");
  expect_error(h.post("/v1/chat/completions", chat({image_part(data_url(image("big_odd.png")))})), 413,
               "image_too_large", "bytes");
  // Declared 100000 x 100000 in a valid PNG header: refused from the header.
  auto huge = png;
  huge[16] = 0x00, huge[17] = 0x01, huge[18] = 0x86, huge[19] = 0xA0;  // width 100000 (IHDR CRC now wrong)
  const auto r = h.post("/v1/chat/completions", chat({image_part(data_url(huge))}));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->status == 400 || r->status == 413) << r->body;
  json five = json::array();
  for (int i = 0; i < 5; ++i) five.push_back(image_part(data_url(png)));
  expect_error(h.post("/v1/chat/completions", chat(five)), 400, "too_many_images", "limit of 4");
  expect_error(h.post("/v1/chat/completions", chat({image_part(host.url("/slow"))})), 400,
               "image_fetch_failed", "timed out");
  expect_error(h.post("/v1/chat/completions", chat({image_part(host.url("/big"))})), 413, "image_too_large");
  expect_error(h.post("/v1/chat/completions", chat({image_part(host.url("/missing.png"))})), 400,
               "image_fetch_failed", "404");
  expect_error(h.post("/v1/chat/completions", chat({image_part("http://127.0.0.1:1/x.png")})), 400,
               "image_fetch_failed", "unreachable");
  expect_error(h.post("/v1/chat/completions", chat({{{"type", "image_url"}, {"image_url", {{"url", 5}}}}})),
               400, "", "image_url");
  EXPECT_EQ(h.submitted(), 0u);  // nothing reached the engine
  // And the server still serves.
  ASSERT_EQ(h.post("/v1/chat/completions", chat({image_part(data_url(png))}))->status, 200);
}

TEST(ServerImages, TextOnlyModelRefusesImages) {
  Harness h(nullptr);
  expect_error(h.post("/v1/chat/completions", chat({image_part(data_url(image("odd_rgb.png")))})), 400,
               "images_not_supported", "text-only");
  expect_error(h.post("/generate", {{"text", "x"}, {"image_data", "AAAA"}}), 400, "images_not_supported");
  ASSERT_EQ(h.post("/v1/chat/completions", chat({text_part("plain")}))->status, 200);
  EXPECT_TRUE(h.last().images.empty());
}

TEST(ServerImages, UrlsCanBeTurnedOff) {
  auto v = std::make_shared<VisionSetup>(*small_vision());
  v->fetch.allow_urls = false;
  Harness h(v);
  expect_error(h.post("/v1/chat/completions", chat({image_part("http://127.0.0.1:1/x.png")})), 400,
               "image_fetch_failed", "disabled");
}

TEST(ServerImages, Base64Decoder) {
  EXPECT_EQ(decode_base64("aGVsbG8=", "p"), (std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o'}));
  EXPECT_THROW(decode_base64("aGVsbG8", "p"), ApiError);  // unpadded: Python refuses it too
  EXPECT_EQ(decode_base64("aGVs\nbG8=", "p").size(), 5u);
  EXPECT_EQ(decode_base64("", "p").size(), 0u);
  EXPECT_THROW(decode_base64("a", "p"), ApiError);
  EXPECT_THROW(decode_base64("aGVsbG8===", "p"), ApiError);
  EXPECT_THROW(decode_base64("aG=Vs", "p"), ApiError);
  EXPECT_THROW(decode_base64("aGVs*G8=", "p"), ApiError);
}
