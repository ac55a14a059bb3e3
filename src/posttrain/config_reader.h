// A JSON config object read field by field: each get() takes a field if present (checking its
// type), finish() refuses any field no get() asked for, so a typo is an error rather than a
// silent default. Errors are "<file>: <field>: <problem>" (k3::Error).
#pragma once
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace k3 {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {
    if (!j_.is_object()) fail_input(file_, prefix_.empty() ? "" : prefix_, "must be a JSON object");
  }
  template <typename V>
  bool get(const char* key, V& out) {
    seen_.insert(key);
    if (!j_.contains(key)) return false;
    try {
      out = j_.at(key).get<V>();
    } catch (const std::exception&) {
      fail_input(file_, field(key), "has the wrong type (" + std::string(j_.at(key).type_name()) + ")");
    }
    return true;
  }
  const nlohmann::json* sub(const char* key) {
    seen_.insert(key);
    return j_.contains(key) ? &j_.at(key) : nullptr;
  }
  std::string field(const char* key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  [[noreturn]] void bad(const char* key, const std::string& what) const { fail_input(file_, field(key), what); }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) fail_input(file_, field(it.key().c_str()), "unknown field");
  }
  const std::string& file() const { return file_; }

 private:
  const nlohmann::json& j_;
  std::string file_, prefix_;
  std::set<std::string> seen_;
};

// Parses the JSON file at `path` (k3::Error naming it when missing or invalid).
nlohmann::json read_json_file(const std::string& path);

// A path a config file gives: as it is when absolute or empty, else relative to the directory
// of the file at `config_path` (so sft.json, rl.json and distill.json travel with what they name).
std::string resolve_config_path(const std::string& config_path, const std::string& p);

// An object {"low": N, "high": N, "max": N} of token budgets per effort (each optional, each at
// least 1), as rl.json and distill.json write `budgets` and `tool_budgets`; false when absent.
inline bool read_effort_budgets(ConfigReader& rd, const char* key, int64_t& low, int64_t& high, int64_t& max) {
  const nlohmann::json* b = rd.sub(key);
  if (!b) return false;
  ConfigReader br(*b, rd.file(), rd.field(key));
  for (auto [name, out] : {std::pair<const char*, int64_t*>{"low", &low}, {"high", &high}, {"max", &max}})
    if (br.get(name, *out) && *out < 1) br.bad(name, "must be at least 1");
  br.finish();
  return true;
}

}  // namespace k3
