#include "common/json_schema_check.h"

#include <cmath>

namespace k3::test {

namespace {

using nlohmann::json;

bool of_type(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

}  // namespace

std::string schema_violation(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>() ? "" : "schema false";
  if (s.contains("$ref")) {
    const std::string r = s["$ref"].get<std::string>();
    return schema_violation(v, root.at(json::json_pointer(r.substr(1))), root);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) {
    const bool one = s.contains("oneOf");
    int matched = 0;
    for (const json& b : s[one ? "oneOf" : "anyOf"]) matched += schema_violation(v, b, root).empty();
    if (matched == 0) return "no anyOf/oneOf branch matches " + v.dump();
    if (one && matched > 1) return "several oneOf branches match " + v.dump();
  }
  if (s.contains("const") && v != s["const"]) return v.dump() + " is not the const";
  if (s.contains("enum")) {
    bool found = false;
    for (const json& e : s["enum"]) found |= e == v;
    if (!found) return v.dump() + " is not in the enum";
  }
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = of_type(v, s["type"]);
    else
      for (const json& t : s["type"]) ok |= of_type(v, t);
    if (!ok) return v.dump() + " is not of type " + s["type"].dump();
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return "missing required " + r.dump();
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (auto why = schema_violation(x, props[k], root); !why.empty()) return k + ": " + why;
      } else if (s.contains("additionalProperties")) {
        if (auto why = schema_violation(x, s["additionalProperties"], root); !why.empty())
          return "additional " + k + ": " + why;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "fewer than minItems";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "more than maxItems";
    if (s.contains("items"))
      for (const json& x : v)
        if (auto why = schema_violation(x, s["items"], root); !why.empty()) return "item: " + why;
  }
  return "";
}

}  // namespace k3::test
