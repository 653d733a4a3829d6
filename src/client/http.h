// A small HTTP client over cpp-httplib, kept behind this header so that only http.cpp compiles httplib.
// One HttpClient is one keep-alive connection: use one per worker thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace kiln::client {

struct BaseUrl {
  std::string scheme = "http";  // "http" or "https"
  std::string host;
  int port = 80;
  std::string prefix;  // path prefix without a trailing '/', e.g. "" or "/engine"
};
// "http[s]://host[:port][/prefix]"; the port defaults to 80 / 443; a trailing "/v1" is dropped (the
// tools add "/v1/completions" themselves), so an OpenAI SDK-style base URL works too.
BaseUrl parse_base_url(const std::string& url);

struct HttpResponse {
  int status = 0;     // 0 when the request never got a response (error says why)
  std::string body;   // the body for post/get; for post_stream only a non-2xx body (for error messages)
  std::string error;  // transport error, empty on success
  bool ok() const { return error.empty() && status >= 200 && status < 300; }
};

class HttpClient {
 public:
  HttpClient(const std::string& base_url, double timeout_s, std::string api_key = "");
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpResponse get(const std::string& path);
  HttpResponse post_json(const std::string& path, const std::string& body);
  // POST, handing each piece of a 2xx body to on_data as it arrives; on_data returns false to abort.
  HttpResponse post_stream(const std::string& path, const std::string& body,
                           const std::function<bool(std::string_view)>& on_data);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::client
