// read_json_file (see config_reader.h).
#include "posttrain/config_reader.h"

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

}  // namespace k3
