// CORS for browser front ends, with vLLM's defaults (--allowed-origins '["*"]', methods and headers "*",
// no credentials): every response to a request carrying an Origin header that is allowed gets
// Access-Control-Allow-Origin, and a preflight (OPTIONS with Access-Control-Request-Method) is answered
// 200 with the allowed methods and the requested headers, before authentication (browsers send no
// Authorization on a preflight). A preflight from an origin not allowed gets 400, as Starlette's
// CORSMiddleware answers it. An empty origin list turns CORS off: no header is ever added.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/http_transport.h"

namespace kiln::server {

struct CorsPolicy {
  std::vector<std::string> allowed_origins = {"*"};  // exact origins ("https://app.example"), or "*"

  bool enabled() const { return !allowed_origins.empty(); }
  bool allows(const std::string& origin) const;
  // The reply to a preflight request; nullopt when `req` is not one.
  std::optional<HttpResponse> preflight(const HttpRequest& req) const;
  // Adds Access-Control-Allow-Origin (and Vary: Origin when the answer depends on it) to `res`.
  void decorate(const HttpRequest& req, HttpResponse& res) const;
};

// --allowed-origins: a JSON list ('["https://a", "https://b"]', vLLM's form) or a comma-separated list;
// '[]' or '' turns CORS off. Throws kiln::Error on a malformed list.
std::vector<std::string> parse_allowed_origins(const std::string& flag);

}  // namespace kiln::server
