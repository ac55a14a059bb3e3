// The HTTP layer's one error type: an OpenAI-shaped error with its HTTP status.
// Every bad request ends as `{"error":{"message","type","param","code"}}` (param and code null
// when not set), the shape the `openai` clients read (they throw on it, naming the message).
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace k3::serve {

using Json = nlohmann::ordered_json;

struct ApiError : std::runtime_error {
  int status;          // 400, 401, 404, 413, 422, 429, 500, 503
  std::string type;    // invalid_request_error, authentication_error, ...
  std::string param;   // the request field at fault ("" none)
  std::string code;    // machine-readable code ("" none)
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "");
};

// The error body; type defaults from the status (4xx invalid_request_error, 401
// authentication_error, 429 rate_limit_error, 5xx server_error).
Json error_json(int status, const std::string& message, const std::string& param = "",
                const std::string& code = "", const std::string& type = "");
Json error_json(const ApiError& e);

// Compact JSON text that never throws: invalid UTF-8 in strings becomes U+FFFD.
std::string dump(const Json& j);

}  // namespace k3::serve
