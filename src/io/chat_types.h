// A conversation for the Kimi K3 XTML chat format and the options that change its rendering.
// The fields are the ones `encoding_k3.py` (vllm-project/vllm, vllm/tokenizers/encoding_k3.py)
// reads from an OpenAI-style request; parse them from JSON with chat_json.h, render them with
// chat_render.h. Nothing here validates: the parser does, so every instance is well formed.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace k3::chat {

// Insertion-ordered JSON: tool-call arguments keep the order they were written in (the
// reference iterates a Python dict); tool and response schemas are key-sorted when dumped.
using Json = nlohmann::ordered_json;

enum class Role { system, user, assistant, tool };

// The placeholder an image part renders as (K3's `<|media_pad|>`, the config's
// media_placeholder_token_id), expanded to the image's tokens before the prompt runs.
inline constexpr const char* kMediaPad = "<|media_pad|>";

struct ToolCall {
  std::optional<std::string> id;  // OpenAI tool_calls[].id, matched by tool results
  std::string name;               // function.name
  Json arguments = Json::object();  // always an object
  // Arguments given as a string that is not valid JSON: the reference renders the raw text
  // as one `json type="object"` block instead of typed arguments.
  std::optional<std::string> json_block;
};

// An image content part (user messages): where it sits among the text parts and its source
// as given (an OpenAI image_url.url; the CLI: a file). It renders as one `<|media_pad|>`
// control segment, which the caller expands to the image's tokens (infer/image_prompt.h).
struct ImagePart {
  size_t before = 0;  // the number of text parts that precede it in the message
  std::string url;    // image_url.url (a data: URL for the server), or a file name
  std::string field;  // the request field, for errors ("messages[1].content[0].image_url.url")
  bool operator==(const ImagePart&) const = default;
};

struct Message {
  Role role = Role::user;
  // Content parts in order (a string content is one part). Each part becomes its own text
  // segment, so parts are never merged: BPE does not merge across segments.
  std::vector<std::string> content;
  std::vector<ImagePart> images;      // user messages: image parts, in order
  std::string name;                   // optional `name` attribute (user, system, assistant)
  std::optional<std::string> reasoning;  // assistant reasoning_content (or reasoning)
  std::vector<ToolCall> tool_calls;      // assistant
  std::optional<std::string> tool_call_id;  // tool result: which call it answers
  std::optional<std::string> tool_name;     // tool result: `tool`, else `name`
  // A system message carrying `tools` is rendered as the dynamic "New Tools Available"
  // declaration instead of a plain system message.
  std::optional<Json> tools;
};

enum class Effort { low, high, max };
enum class ToolChoice { auto_, required, none };
enum class ResponseFormat { text, json_object, json_schema };

struct Options {
  bool thinking = true;          // reference default: thinking on
  Effort effort = Effort::max;   // reference default: max
  ToolChoice tool_choice = ToolChoice::auto_;
  ResponseFormat response_format = ResponseFormat::text;
  Json response_schema;          // json_schema only: the schema object as given
  bool add_generation_prompt = true;
};

struct Conversation {
  std::vector<Message> messages;
  Json tools = Json::array();  // OpenAI tool declarations, as given
  Options options;
};

const char* effort_name(Effort e);
const char* role_name(Role r);

}  // namespace k3::chat
