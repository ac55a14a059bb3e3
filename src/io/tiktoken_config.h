// Special tokens of a tiktoken vocabulary, from `tokenizer_config.json` as K3 ships it:
// `added_tokens_decoder` maps id strings to {"content": name, "special": bool, ...}. As in
// the reference (tokenization_kimi.py), the 256 ids after the base vocabulary are special;
// ids the config does not name are `<|reserved_token_ID|>`. K3's own layout of those ids
// (docs/model.md section 14) is here too, for the trainer to write.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

constexpr int32_t kReservedSpecialIds = 256;

struct SpecialToken {
  int32_t id = 0;
  std::string name;
  bool special = true;  // false for K3's <|open|>, <|close|>, <|sep|> (kept by decoders)
};

// All 256 special ids after `base_size`, named from the config's added_tokens_decoder at
// `path` (or all reserved when path is empty). k3::Error naming the file and field for a
// malformed entry, an id inside the base vocabulary, an id past the reserved range, or a
// name used twice.
std::vector<SpecialToken> read_special_tokens(const std::string& path, int32_t base_size);
// The same from the file's contents; `path` only names it in errors.
std::vector<SpecialToken> parse_special_tokens(const std::string& text, const std::string& path, int32_t base_size);

// K3's layout: [BOS] base, [EOS] base+1, <|end_of_msg|> base+2, <|open|>, <|close|>,
// <|sep|>, <|media_begin|> base+18 .. <|media_pad|> base+21, [UNK] base+254, [PAD] base+255;
// the rest reserved.
std::vector<SpecialToken> k3_special_tokens(int32_t base_size);
// tokenizer_config.json text naming those tokens.
std::string k3_tokenizer_config_json(int32_t base_size);

}  // namespace k3
