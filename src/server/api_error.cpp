#include "server/api_error.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

namespace kiln::server {

std::string ApiError::default_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string strip_source_locations(const std::string& message) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const size_t open = message.find(" [", i);
    if (open == std::string::npos) break;
    // " [" dir "/" path ":" digits "]", no spaces: what kiln::throw_error appends
    const size_t close = message.find(']', open + 2);
    const std::string_view inside = close == std::string::npos
                                        ? std::string_view()
                                        : std::string_view(message).substr(open + 2, close - open - 2);
    const size_t colon = inside.rfind(':');
    bool location = colon != std::string_view::npos && colon + 1 < inside.size() &&
                    inside.find(' ') == std::string_view::npos;
    if (location) {
      location = false;
      for (std::string_view dir : {"src/", "include/", "tests/", "bench/"})
        location = location || inside.substr(0, dir.size()) == dir;
      for (char c : inside.substr(colon + 1)) location = location && c >= '0' && c <= '9';
    }
    out.append(message, i, open - i);
    if (!location) out += " [";
    i = location ? close + 1 : open + 2;
  }
  out.append(message, std::min(i, message.size()), std::string::npos);
  return out;
}

nlohmann::json error_body(int status, const std::string& message, const std::string& param,
                          const std::string& type, const std::string& code) {
  std::string shown = strip_source_locations(message);
  if (shown.size() != message.size()) std::fprintf(stderr, "kiln server: %d: %s\n", status, message.c_str());
  nlohmann::json err = {{"message", std::move(shown)},
                        {"type", type.empty() ? ApiError::default_type(status) : type},
                        {"param", nullptr},
                        {"code", nullptr}};
  if (!param.empty()) err["param"] = param;
  if (!code.empty()) err["code"] = code;
  return {{"error", err}};
}

nlohmann::json ApiError::to_json() const {
  return error_body(status_, what(), param_, type_, code_);
}

}  // namespace kiln::server
