#include "client/http.h"

#include <httplib.h>

#include "kiln/error.h"

namespace kiln::client {

BaseUrl parse_base_url(const std::string& url) {
  BaseUrl out;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    out.scheme = "https";
    out.port = 443;
  } else {
    KILN_FAIL("base URL must start with http:// or https://, got '", url, "'");
  }
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) out.prefix = rest.substr(slash);
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  // OpenAI SDKs take ".../v1" as their base; the tools add "/v1/..." themselves and also call /generate.
  if (out.prefix.size() >= 3 && out.prefix.compare(out.prefix.size() - 3, 3, "/v1") == 0)
    out.prefix.resize(out.prefix.size() - 3);
  const size_t colon = hostport.rfind(':');
  if (colon != std::string::npos && hostport.find(']') == std::string::npos) {
    const std::string p = hostport.substr(colon + 1);
    KILN_CHECK(!p.empty() && p.size() <= 5 && p.find_first_not_of("0123456789") == std::string::npos,
               "bad port '", p, "' in base URL '", url, "'");
    out.port = std::stoi(p);
    KILN_CHECK(out.port > 0 && out.port < 65536, "port out of range in base URL '", url, "'");
    hostport = hostport.substr(0, colon);
  }
  KILN_CHECK(!hostport.empty(), "no host in base URL '", url, "'");
  out.host = hostport;
  return out;
}

struct HttpClient::Impl {
  BaseUrl base;
  httplib::Client cli;
  httplib::Headers headers;
  explicit Impl(BaseUrl b)
      : base(std::move(b)), cli(base.scheme + "://" + base.host + ":" + std::to_string(base.port)) {}
};

HttpClient::HttpClient(const std::string& base_url, double timeout_s, std::string api_key)
    : impl_(std::make_unique<Impl>(parse_base_url(base_url))) {
  KILN_CHECK(timeout_s > 0, "timeout must be positive, got ", timeout_s);
  const time_t sec = time_t(timeout_s);
  const time_t usec = time_t((timeout_s - double(sec)) * 1e6);
  impl_->cli.set_connection_timeout(10, 0);
  impl_->cli.set_read_timeout(sec, usec);
  impl_->cli.set_write_timeout(sec, usec);
  impl_->cli.set_keep_alive(true);
  impl_->cli.set_tcp_nodelay(true);
  if (!api_key.empty()) impl_->headers.emplace("Authorization", "Bearer " + api_key);
}

HttpClient::~HttpClient() = default;

static HttpResponse from_result(const httplib::Result& r) {
  HttpResponse out;
  if (!r) {
    out.error = httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  return out;
}

HttpResponse HttpClient::get(const std::string& path) {
  return from_result(impl_->cli.Get(impl_->base.prefix + path, impl_->headers));
}

HttpResponse HttpClient::post_json(const std::string& path, const std::string& body) {
  return from_result(impl_->cli.Post(impl_->base.prefix + path, impl_->headers, body, "application/json"));
}

HttpResponse HttpClient::post_stream(const std::string& path, const std::string& body,
                                     const std::function<bool(std::string_view)>& on_data) {
  // httplib 0.11 has no Post overload with a content receiver; a hand-built Request does the same.
  httplib::Request req;
  req.method = "POST";
  req.path = impl_->base.prefix + path;
  req.headers = impl_->headers;
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  req.body = body;
  HttpResponse out;
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  bool aborted = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.status < 200 || out.status >= 300) {
      if (out.body.size() < 4096) out.body.append(data, n);
      return true;
    }
    if (!on_data(std::string_view(data, n))) {
      aborted = true;
      return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = impl_->cli.send(req, res, err);
  if (!sent && !aborted) out.error = httplib::to_string(err);
  if (out.status == 0 && sent) out.status = res.status;
  return out;
}

}  // namespace kiln::client
