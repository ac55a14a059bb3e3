#include "io/tiktoken_config.h"

#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace k3 {
namespace {

using json = nlohmann::json;

std::vector<SpecialToken> reserved(int32_t base) {
  std::vector<SpecialToken> out(kReservedSpecialIds);
  for (int32_t k = 0; k < kReservedSpecialIds; ++k) {
    out[k].id = base + k;
    out[k].name = "<|reserved_token_" + std::to_string(base + k) + "|>";
  }
  return out;
}

// Offsets of K3's named specials after the base vocabulary; `false`: flagged non-special.
struct Named {
  int32_t offset;
  const char* name;
  bool special;
};
const Named kK3Named[] = {
    {0, "[BOS]", true},          {1, "[EOS]", true},          {2, "<|end_of_msg|>", true},
    {3, "<|open|>", false},      {4, "<|close|>", false},     {5, "<|sep|>", false},
    {18, "<|media_begin|>", true}, {19, "<|media_content|>", true}, {20, "<|media_end|>", true},
    {21, "<|media_pad|>", true}, {254, "[UNK]", true},        {255, "[PAD]", true},
};

}  // namespace

std::vector<SpecialToken> read_special_tokens(const std::string& path, int32_t base) {
  if (path.empty()) return reserved(base);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_system("cannot open the tokenizer config", path);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail_system("cannot read the tokenizer config", path);
  return parse_special_tokens(text, path, base);
}

std::vector<SpecialToken> parse_special_tokens(const std::string& text, const std::string& path, int32_t base) {
  std::vector<SpecialToken> out = reserved(base);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail_input(path, "json", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail_input(path, "json", "expected an object");
  if (!j.contains("added_tokens_decoder")) return out;
  const json& dec = j["added_tokens_decoder"];
  if (!dec.is_object()) fail_input(path, "added_tokens_decoder", "expected an object of id -> token");
  std::map<std::string, std::string> seen;  // name -> field, for duplicates
  for (auto it = dec.begin(); it != dec.end(); ++it) {
    const std::string field = "added_tokens_decoder." + it.key();
    const std::string& key = it.key();
    if (key.empty() || key.size() > 10 || key.find_first_not_of("0123456789") != std::string::npos)
      fail_input(path, field, "the key must be a token id");
    const long long id = std::stoll(key);
    if (!it->is_object() || !it->contains("content") || !(*it)["content"].is_string())
      fail_input(path, field, "expected an object with a string \"content\"");
    const std::string name = (*it)["content"].get<std::string>();
    if (name.empty()) fail_input(path, field + ".content", "empty token name");
    if (id < base)
      fail_input(path, field, "special token '" + name + "' collides with base rank " + key + " (the vocabulary has " +
                                  std::to_string(base) + " base tokens)");
    if (id >= int64_t(base) + kReservedSpecialIds)
      fail_input(path, field, "id " + key + " is past the " + std::to_string(kReservedSpecialIds) +
                                  " special ids after the base vocabulary (" + std::to_string(base) + ".." +
                                  std::to_string(base + kReservedSpecialIds - 1) + ")");
    if (auto s = seen.find(name); s != seen.end())
      fail_input(path, field, "token name '" + name + "' is also used by " + s->second);
    seen[name] = field;
    bool special = true;
    if (it->contains("special")) {
      if (!(*it)["special"].is_boolean()) fail_input(path, field + ".special", "expected true or false");
      special = (*it)["special"].get<bool>();
    }
    out[id - base] = {int32_t(id), name, special};
  }
  // A config name that is the reserved name of an id the config leaves unnamed would make
  // two ids share it.
  for (const auto& t : out)
    if (auto s = seen.find(t.name); s != seen.end() && s->second != "added_tokens_decoder." + std::to_string(t.id))
      fail_input(path, s->second, "token name '" + t.name + "' is the reserved name of id " + std::to_string(t.id));
  return out;
}

std::vector<SpecialToken> k3_special_tokens(int32_t base) {
  std::vector<SpecialToken> out = reserved(base);
  for (const auto& n : kK3Named) out[n.offset] = {base + n.offset, n.name, n.special};
  return out;
}

std::string k3_tokenizer_config_json(int32_t base) {
  // As K3 ships it: only the named ids in added_tokens_decoder (loaders name the rest
  // <|reserved_token_ID|>), the stop and media tokens as additional special tokens.
  json dec = json::object();
  for (const auto& n : kK3Named)
    dec[std::to_string(base + n.offset)] = {{"content", n.name}, {"lstrip", false}, {"normalized", false},
                                            {"rstrip", false}, {"single_word", false}, {"special", n.special}};
  json j = {{"added_tokens_decoder", dec},
            {"additional_special_tokens",
             {"<|end_of_msg|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>"}},
            {"bos_token", "[BOS]"},
            {"eos_token", "[EOS]"},
            {"unk_token", "[UNK]"},
            {"pad_token", "[PAD]"},
            {"clean_up_tokenization_spaces", false},
            {"tokenizer_class", "TikTokenTokenizer"},
            {"model_max_length", 1048576}};
  return j.dump(2) + "\n";
}

}  // namespace k3
