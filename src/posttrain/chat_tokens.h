// Conversations as training sequences: the XTML rendering (io/chat_render.h) encoded segment
// by segment with the model's chat vocabulary (infer/chat_vocab.h), and the loss mask. The
// trained tokens are exactly what the model generates after a generation prompt: for each
// assistant message, the tokens from the end of the prompt that precedes it (rendered with
// add_generation_prompt) to the end of the message (its <|end_of_msg|>). Everything else is
// masked: the thinking-effort and tool-declaration system messages, system and user turns,
// tool results, and the generation prompt itself. The mask is found by rendering, so it holds
// whatever the renderer writes; a conversation whose prompt rendering is not a prefix of
// its full rendering (a response_format or tool_choice note) is refused.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "infer/chat_vocab.h"
#include "io/chat_types.h"

namespace k3 {

struct ChatSequence {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;  // [ids.size()]: 1 when ids[i] is a trained token
  int64_t trained() const;
  // Image conversations (posttrain/image_task.h): the frozen encoder's rows for the positions
  // of ids holding media_id (never trained tokens).
  std::vector<float> image_rows;
  int64_t image_tokens = 0;
  int32_t media_id = -1;
};

// images: image parts are allowed (each one <|media_pad|> id, never trained; the caller
// expands it and attaches the encoder's rows, posttrain/image_task.h); otherwise refused.
ChatSequence tokenize_conversation(const chat::Conversation& conv, const ChatVocab& vocab, const std::string& source,
                                   bool images = false);

// Segments of `longer` after those of `prefix`; k3::Error (naming `what`) when `prefix` is
// not a segment prefix of `longer`.
std::vector<chat::Segment> segment_suffix(const std::vector<chat::Segment>& prefix,
                                          const std::vector<chat::Segment>& longer, const std::string& what);

}  // namespace k3
