// A model directory's chat vocabulary: K3's tiktoken tokenizer (tiktoken.model and
// tokenizer_config.json beside config.json), the XTML control ids the output parser needs
// (io/chat_parse.h MarkerIds) and the ids that end a reply (<|end_of_msg|>, and [EOS] when the
// vocabulary has it). Shared by `k3cpp chat` and `k3cpp serve` so both read a model
// directory the same way and fail on the same bad input with the same sentence.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/chat_parse.h"
#include "io/chat_render.h"
#include "io/tiktoken.h"
#include "model/checkpoint.h"

namespace k3 {

struct ChatVocab {
  Tiktoken tok;
  chat::MarkerIds markers;
  std::optional<int32_t> eos;  // [EOS], when the vocabulary names it

  // A special token's id by name (chat::LookupSpecial), nullopt when absent.
  std::optional<int32_t> control(const std::string& name) const;
  // Rendered segments -> ids (text segments never become special ids).
  std::vector<int32_t> encode(const std::vector<chat::Segment>& segments) const;
  // The ids whose sampling ends a reply: <|end_of_msg|> first, then [EOS] if present.
  std::vector<int32_t> stop_ids() const;
  bool is_marker(int32_t id) const {
    return id == markers.open || id == markers.close || id == markers.sep || id == markers.end_of_msg;
  }
  // An ordinary (non-special) id of the vocabulary: decodable as text.
  bool is_text(int32_t id) const { return id >= 0 && id < tok.vocab_size() && !tok.is_special(id); }
};

// Loads <md.dir>/tiktoken.model (+ tokenizer_config.json). k3::Error, naming the file and
// field, when the tokenizer is missing or malformed, when it has more ids than the config's
// vocab_size, or when it lacks one of <|open|>, <|close|>, <|sep|>, <|end_of_msg|>.
ChatVocab load_chat_vocab(const ModelDir& md);

}  // namespace k3
