// OpenAI-shaped errors (see api_error.h).
#include "serve/api_error.h"

namespace k3::serve {

namespace {
std::string default_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 429) return "rate_limit_error";
  if (status == 404) return "not_found_error";
  if (status == 503) return "service_unavailable";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}
}  // namespace

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(std::move(message)),
      status(status_),
      type(type_.empty() ? default_type(status_) : std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

Json error_json(int status, const std::string& message, const std::string& param, const std::string& code,
                const std::string& type) {
  Json e = Json::object();
  e["message"] = message;
  e["type"] = type.empty() ? default_type(status) : type;
  e["param"] = param.empty() ? Json() : Json(param);
  e["code"] = code.empty() ? Json() : Json(code);
  return Json{{"error", e}};
}

Json error_json(const ApiError& e) { return error_json(e.status, e.what(), e.param, e.code, e.type); }

std::string dump(const Json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace k3::serve
