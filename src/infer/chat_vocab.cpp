// Loading a model directory's chat vocabulary (see chat_vocab.h).
#include "infer/chat_vocab.h"

#include "core/error.h"

namespace k3 {

std::optional<int32_t> ChatVocab::control(const std::string& name) const {
  for (const SpecialToken& s : tok.specials())
    if (s.name == name) return s.id;
  return std::nullopt;
}

std::vector<int32_t> ChatVocab::encode(const std::vector<chat::Segment>& segments) const {
  return chat::segments_to_ids(
      segments, [&](const std::string& t) { return tok.encode(t, false); },
      [&](const std::string& n) { return control(n); });
}

std::vector<int32_t> ChatVocab::stop_ids() const {
  std::vector<int32_t> ids = {markers.end_of_msg};
  if (eos) ids.push_back(*eos);
  return ids;
}

ChatVocab load_chat_vocab(const ModelDir& md) {
  Tiktoken tok = Tiktoken::load(md.dir);
  if (tok.vocab_size() > md.config.vocab_size)
    fail_input(md.config_path, "vocab_size",
               std::to_string(md.config.vocab_size) + " is smaller than the tokenizer's " +
                   std::to_string(tok.vocab_size()) + " ids");
  ChatVocab v{std::move(tok), {}, std::nullopt};
  const auto open = v.control(chat::kOpen), close = v.control(chat::kClose), sep = v.control(chat::kSep),
             end = v.control(chat::kEndOfMsg);
  if (!open || !close || !sep || !end)
    fail_input(md.dir + "/tokenizer_config.json", "added_tokens_decoder",
               "lacks the XTML control tokens <|open|>, <|close|>, <|sep|>, <|end_of_msg|>");
  v.markers = {*open, *close, *sep, *end};
  v.eos = v.control("[EOS]");
  return v;
}

}  // namespace k3
