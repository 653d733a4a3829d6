// ApiError: a request the server refuses, carried to the HTTP layer and written in OpenAI's error shape:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
// Every handler throws ApiError for bad input; the HTTP layer turns it into the status and body. Nothing
// else in the server changes state when one is thrown before a request is submitted.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace kiln::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "",
           std::string code = "")
      : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {
    type_ = !type.empty() ? std::move(type) : default_type(status);
  }
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  nlohmann::json to_json() const;

  static std::string default_type(int status);

 private:
  int status_;
  std::string type_, param_, code_;
};

// 400 invalid_request_error naming the offending field.
inline ApiError bad_request(const std::string& message, const std::string& param = "") {
  return ApiError(400, message, param);
}

// `message` without the source locations kiln::Error appends (" [src/runtime/sampler.cpp:14]"): those are for
// the server's log, not for clients.
std::string strip_source_locations(const std::string& message);

// The OpenAI error body for any status and message (param/code null when empty). A message that carried a
// source location is written to stderr whole, and sent without it.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = "",
                          const std::string& type = "", const std::string& code = "");

}  // namespace kiln::server
