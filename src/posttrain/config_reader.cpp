// read_json_file and resolve_config_path (see config_reader.h).
#include "posttrain/config_reader.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace k3 {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_system("cannot open the config", path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    fail_input(path, "", std::string("not valid JSON (") + e.what() + ")");
  }
}

std::string resolve_config_path(const std::string& config_path, const std::string& p) {
  namespace fs = std::filesystem;
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(config_path).parent_path() / p).lexically_normal().string();
}

}  // namespace k3
