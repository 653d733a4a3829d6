#include "server/cors.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::server {

namespace {
// Starlette's answer to a preflight when methods are "*".
constexpr const char* kAllowMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
constexpr const char* kMaxAgeSeconds = "600";

bool wildcard(const std::vector<std::string>& origins) {
  return std::find(origins.begin(), origins.end(), "*") != origins.end();
}
}  // namespace

bool CorsPolicy::allows(const std::string& origin) const {
  return wildcard(allowed_origins) ||
         std::find(allowed_origins.begin(), allowed_origins.end(), origin) != allowed_origins.end();
}

std::optional<HttpResponse> CorsPolicy::preflight(const HttpRequest& req) const {
  if (!enabled() || req.method != "OPTIONS") return std::nullopt;
  const std::string origin = req.header("Origin");
  const std::string method = req.header("Access-Control-Request-Method");
  if (origin.empty() || method.empty()) return std::nullopt;
  HttpResponse res;
  res.content_type = "text/plain; charset=utf-8";
  if (!allows(origin)) {
    res.status = 400;
    res.body = "Disallowed CORS origin";
    return res;
  }
  res.body = "OK";
  res.set_header("Access-Control-Allow-Origin", wildcard(allowed_origins) ? "*" : origin);
  if (!wildcard(allowed_origins)) res.set_header("Vary", "Origin");
  res.set_header("Access-Control-Allow-Methods", kAllowMethods);
  const std::string headers = req.header("Access-Control-Request-Headers");
  if (!headers.empty()) res.set_header("Access-Control-Allow-Headers", headers);
  res.set_header("Access-Control-Max-Age", kMaxAgeSeconds);
  return res;
}

void CorsPolicy::decorate(const HttpRequest& req, HttpResponse& res) const {
  if (!enabled()) return;
  const std::string origin = req.header("Origin");
  if (origin.empty() || !allows(origin)) return;
  for (const auto& [k, v] : res.headers)
    if (k == "Access-Control-Allow-Origin") return;  // a preflight reply already has it
  res.set_header("Access-Control-Allow-Origin", wildcard(allowed_origins) ? "*" : origin);
  if (!wildcard(allowed_origins)) res.set_header("Vary", "Origin");
}

std::vector<std::string> parse_allowed_origins(const std::string& flag) {
  std::vector<std::string> out;
  const auto first = flag.find_first_not_of(" \t");
  if (first != std::string::npos && flag[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(flag);
    } catch (const nlohmann::json::exception& e) {
      KILN_FAIL("--allowed-origins is not a valid JSON list: ", e.what());
    }
    KILN_CHECK(j.is_array(), "--allowed-origins must be a JSON list of strings");
    for (const auto& o : j) {
      KILN_CHECK(o.is_string() && !o.get<std::string>().empty(),
                 "--allowed-origins must be a JSON list of non-empty strings");
      out.push_back(o.get<std::string>());
    }
    return out;
  }
  size_t pos = 0;
  while (pos <= flag.size()) {
    size_t comma = flag.find(',', pos);
    if (comma == std::string::npos) comma = flag.size();
    std::string o = flag.substr(pos, comma - pos);
    o.erase(0, o.find_first_not_of(" \t"));
    o.erase(o.find_last_not_of(" \t") + 1);
    if (!o.empty()) out.push_back(o);
    pos = comma + 1;
  }
  return out;
}

}  // namespace kiln::server
