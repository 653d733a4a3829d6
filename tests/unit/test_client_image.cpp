// kiln bench serve --image: every random-id request carries the image as /generate image_data, with the
// placeholder tokens appended after the random ids (so no two requests share a cached prefix).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "client/request.h"
#include "client/workload.h"

using namespace kiln::client;

TEST(ClientImage, Base64) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("h"), "aA==");
  EXPECT_EQ(base64_encode("he"), "aGU=");
  EXPECT_EQ(base64_encode("hello"), "aGVsbG8=");
  EXPECT_EQ(base64_encode(std::string("\xff\x00\x10", 3)), "/wAQ");
}

TEST(ClientImage, RequestsCarryTheImageAndItsPlaceholder) {
  Workload w;
  w.input_len = 8;
  w.output_len = 4;
  w.image_b64 = base64_encode("fake image bytes");
  const auto reqs = make_requests(w, 3, 2);
  ASSERT_EQ(reqs.size(), 2u);
  for (const auto& r : reqs) {
    ASSERT_EQ(r.input_ids.size(), 11u);
    EXPECT_EQ(std::vector<int32_t>(r.input_ids.end() - 3, r.input_ids.end()),
              (std::vector<int32_t>{151652, 151655, 151653}));
    EXPECT_EQ(r.expected_input, -1);  // the server adds the image's tokens
    const auto body = nlohmann::json::parse(build_stream_body(r, StreamOptions{}));
    EXPECT_EQ(body["image_data"], w.image_b64);
    EXPECT_EQ(body["input_ids"].size(), 11u);
  }
  EXPECT_NE(reqs[0].input_ids[0], reqs[1].input_ids[0]);
  w.image_b64.clear();
  EXPECT_FALSE(nlohmann::json::parse(build_stream_body(make_requests(w, 3, 1)[0], StreamOptions{}))
                   .contains("image_data"));
}
