// The tiktoken vocabulary file (`tiktoken.model`, tiktoken/load.py's format): one line per
// token, `<standard base64 of the token's bytes> <decimal rank>`, empty lines ignored.
// k3cpp requires the ranks to be exactly 0..N-1 (each once) and the token bytes distinct,
// since the rank is the token id; anything else is refused naming the file and line.
#pragma once
#include <string>
#include <string_view>

#include "io/bpe_ranks.h"

namespace k3 {

std::string base64_encode(std::string_view bytes);
// Standard alphabet with '=' padding, length a multiple of 4; false on anything else.
bool base64_decode(std::string_view text, std::string& out);

BpeRanks read_tiktoken_model(const std::string& path);
// Parses the file's contents; `path` only names it in errors.
BpeRanks parse_tiktoken_model(std::string_view contents, const std::string& path);
// The file's text for `ranks` (rank order), as the trainer writes it.
std::string format_tiktoken_model(const BpeRanks& ranks);

}  // namespace k3
