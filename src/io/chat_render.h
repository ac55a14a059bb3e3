// Render a chat::Conversation into Kimi K3 XTML segments, exactly as `encoding_k3.py`
// build_chat_segments does (vllm-project/vllm, vllm/tokenizers/encoding_k3.py; the same
// rules as llama.cpp models/templates/Kimi-K3.jinja). A segment is encoded on its own: BPE
// never merges across segments, and only control segments may become special ids. User,
// tool, attribute and argument text is always a text segment, so a user message that
// spells "<|open|>" is tokenized as ordinary text (the injection guard).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/chat_types.h"

namespace k3::chat {

inline constexpr const char* kOpen = "<|open|>";
inline constexpr const char* kClose = "<|close|>";
inline constexpr const char* kSep = "<|sep|>";
inline constexpr const char* kEndOfMsg = "<|end_of_msg|>";

struct Segment {
  std::string text;
  bool is_control = false;
  bool operator==(const Segment&) const = default;
};

// The whole prompt: tool declarations, thinking effort, the messages (tool results
// re-ordered), tool_choice and response_format notes, then the generation prompt.
// k3::Error ("conversation: messages[i].tool: ...") when a tool result's name cannot be
// resolved, as in the reference.
std::vector<Segment> render(const Conversation& conv);

// The messages with each run of tool results re-sorted into its assistant's tool_calls
// order (matched by tool_call_id) and the matched results' tool name set to the call's
// name; a run with any unmatched result is left as it is (normalize_xtml_tool_result_messages).
std::vector<Message> order_tool_results(const std::vector<Message>& messages);

// Segments -> token ids. Text segments go through encode_text one by one; control segments
// are looked up by name in the tokenizer's special-token table (an absent name is an error,
// never a silent text fallback).
using EncodeText = std::function<std::vector<int32_t>(const std::string&)>;
using LookupSpecial = std::function<std::optional<int32_t>(const std::string&)>;
std::vector<int32_t> segments_to_ids(const std::vector<Segment>& segments, const EncodeText& encode_text,
                                     const LookupSpecial& lookup_special);

// The segments joined into one string (for display and for string-level tests).
std::string join_segments(const std::vector<Segment>& segments);

}  // namespace k3::chat
