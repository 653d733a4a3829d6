#include "server/api_error.h"

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

nlohmann::json error_body(int status, const std::string& message, const std::string& param,
                          const std::string& type, const std::string& code) {
  nlohmann::json err = {{"message", message},
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
