// OpenAI response and stream-chunk JSON (pure builders).
// Chat: object "chat.completion" with choices[{index, message{role, content, reasoning_content,
// tool_calls[{id, type:"function", function{name, arguments}}]}, logprobs, finish_reason}] and
// usage{prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details{cached_tokens}};
// content is null only when the reply is tool calls alone; reasoning_content is null when
// there was none. Stream: objects "chat.completion.chunk", choices[{index, delta, logprobs,
// finish_reason}], the first delta of a choice {role:"assistant", content:""}, then one delta
// per piece: {reasoning_content}, {content} or {tool_calls:[{index, id, type, function{name,
// arguments:""}}]} / {tool_calls:[{index, function{arguments}}]}; the last chunk of a choice an
// empty delta with its finish_reason; with include_usage a final chunk with choices [] and usage
// (every other chunk has usage null, as OpenAI sends it).
// Completions: "text_completion" with choices[{index, text, logprobs, finish_reason}].
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/chat_parse.h"
#include "serve/api_error.h"

namespace k3::serve {

struct ResponseHead {
  std::string id;      // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
};

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
Json message_json(const chat::ParsedOutput& out);
Json chat_choice_json(int index, const chat::ParsedOutput& out, const Json& logprobs);
Json chat_completion_json(const ResponseHead& h, const std::vector<Json>& choices, const Json& usage);

Json delta_json(const chat::Delta& d);  // one piece (not finish)
Json role_delta_json();                 // {"role":"assistant","content":""}
Json chat_chunk_json(const ResponseHead& h, int index, const Json& delta, const Json& finish_reason = nullptr,
                     const Json& logprobs = nullptr);
Json chat_usage_chunk_json(const ResponseHead& h, const Json& usage);
// Consecutive deltas of one kind (and call index) joined: fewer, larger chunks.
std::vector<chat::Delta> merge_deltas(const std::vector<chat::Delta>& ds);

Json completion_choice_json(int index, const std::string& text, const std::string& finish, const Json& logprobs);
Json completion_json(const ResponseHead& h, const std::vector<Json>& choices, const Json& usage);
Json completion_chunk_json(const ResponseHead& h, int index, const std::string& text, const Json& finish_reason,
                           const Json& logprobs = nullptr);
Json completion_usage_chunk_json(const ResponseHead& h, const Json& usage);

Json models_json(const std::string& model, int64_t created, int64_t ctx);

}  // namespace k3::serve
