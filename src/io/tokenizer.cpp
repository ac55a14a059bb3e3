#include "io/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace k3 {

ByteTokenizer::ByteTokenizer() {
  specials_ = {{"<|bos|>", 256}, {"<|eos|>", 257}, {"<|pad|>", 258}, {"<|sep|>", 259}};
}

ByteTokenizer ByteTokenizer::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail_system("cannot open tokenizer", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail_input(path, "", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail_input(path, "", "expected a JSON object");
  const std::string type = j.value("type", std::string());
  if (type != "k3cpp-byte")
    fail_input(path, "type", "tokenizer type '" + type + "' is not supported (k3cpp reads 'k3cpp-byte' tokenizers only)");
  if (!j.contains("special_tokens") || !j["special_tokens"].is_object())
    fail_input(path, "special_tokens", "missing or not an object");
  ByteTokenizer t;
  t.specials_.clear();
  std::set<int32_t> seen;
  for (auto& [name, id] : j["special_tokens"].items()) {
    if (!id.is_number_integer()) fail_input(path, "special_tokens." + name, "expected an integer id");
    int64_t v = id.get<int64_t>();
    if (v < 256 || v > 1 << 20) fail_input(path, "special_tokens." + name, "id " + std::to_string(v) + " must be >= 256");
    if (!seen.insert(int32_t(v)).second) fail_input(path, "special_tokens." + name, "id " + std::to_string(v) + " used twice");
    t.specials_[name] = int32_t(v);
  }
  // Ids must be dense 256..256+n-1 so vocab_size() is exact.
  int32_t expect = 256;
  for (int32_t v : seen)
    if (v != expect++) fail_input(path, "special_tokens", "ids must be consecutive from 256");
  return t;
}

std::string ByteTokenizer::to_json() const {
  nlohmann::json j;
  j["type"] = "k3cpp-byte";
  j["version"] = 1;
  j["special_tokens"] = specials_;
  return j.dump(2) + "\n";
}

void ByteTokenizer::save(const std::string& path) const { write_text_file_atomic(path, to_json()); }

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string ByteTokenizer::decode_one(int32_t id) const {
  if (id >= 0 && id < 256) return std::string(1, char(id));
  for (auto& [name, v] : specials_)
    if (v == id) return name;
  return "<|" + std::to_string(id) + "|>";
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) s += decode_one(id);
  return s;
}

int32_t ByteTokenizer::special(const std::string& name) const {
  auto it = specials_.find(name);
  if (it == specials_.end()) fail("tokenizer has no special token " + name);
  return it->second;
}

}  // namespace k3
