// OpenAI-style chat request JSON -> chat::Conversation, validated. Bad input is one k3::Error
// "<source>: <field>: <what is wrong>" with the field spelled as in the request
// ("messages[2].tool_calls[0].function.arguments"); source is the file name when loaded
// from a file. Field meanings follow `encoding_k3.py` (vllm-project/vllm,
// vllm/tokenizers/encoding_k3.py); where the reference silently skips or guesses (an unknown
// role, a named tool_choice), this parser refuses instead, so a request is never rendered
// differently from what its sender meant.
#pragma once
#include <string>

#include "io/chat_types.h"

namespace k3::chat {

// request: {"messages": [...], "tools": [...], "tool_choice": ..., "response_format": ...,
//           "thinking"/"enable_thinking": bool, "reasoning_effort"/"thinking_effort": str,
//           "add_generation_prompt": bool, "chat_template_kwargs": {the same option keys}}
Conversation parse_request(const Json& request, const std::string& source = "request");
Conversation parse_request_text(const std::string& text, const std::string& source = "request");
Conversation load_request(const std::string& path);

// Tool-call arguments as OpenAI sends them (a JSON object string, an object, null or "")
// -> the object, or the raw text when it is not JSON (rendered as a json block).
// A JSON value that is not an object is an error, as in the reference.
void parse_arguments(const Json& arguments, ToolCall& call, const std::string& source,
                     const std::string& field);

}  // namespace k3::chat
