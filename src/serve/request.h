// OpenAI request bodies -> what the engine runs, validated. Pure: no HTTP, no model.
//  - parse_body: the body text as JSON (malformed JSON, invalid UTF-8, numbers out of range:
//    400 ApiError);
//  - parse_chat / parse_completion: the fields of POST /v1/chat/completions and
//    /v1/completions, each checked for type and range (a wrong one is a 400 naming the field;
//    a tools array whose parameters are not a JSON schema is a 422); the conversation goes
//    through chat::parse_request (io/chat_json.h), whose k3::Error becomes a 400 with the
//    field as param;
//  - resolve_max_tokens: once the prompt is tokenized, the generated-token limit (default: the
//    rest of the context; a prompt that fills the context, or prompt + max_tokens beyond it, is
//    a 400 "context_length_exceeded");
//  - make_requests: one GenerationRequest per choice (n), choice i seeded seed + i.
// Fields OpenAI clients send that change nothing here (user, metadata, penalties at 0, ...)
// are accepted and ignored; unknown fields are ignored as OpenAI's server does.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "io/chat_types.h"
#include "serve/api_error.h"

namespace k3::serve {

inline constexpr int kMaxChoices = 16;      // n at most
inline constexpr int kMaxStopStrings = 16;  // stop strings at most
inline constexpr int kMaxTopLogprobs = 20;

struct CommonParams {
  std::string model;                  // as sent ("" when absent); responses name the served model
  SamplerOptions sampling;            // seed: choice 0's
  std::optional<int64_t> max_tokens;  // max_tokens / max_completion_tokens
  std::vector<std::string> stop;      // stop strings (non-empty, distinct)
  int n = 1;
  int top_logprobs = -1;              // -1: no logprobs; 0..20
  bool stream = false, include_usage = false;
};

struct ChatPlan {
  CommonParams params;
  chat::Conversation conv;
};

struct CompletionPlan {
  CommonParams params;
  std::string prompt;            // raw text, encoded without a chat template
  std::vector<int32_t> prompt_ids;  // or token ids as given (then prompt is empty)
  bool prompt_is_ids = false;
};

Json parse_body(const std::string& body);
// `default_seed`: choice 0's seed when the request names none (the caller draws it).
ChatPlan parse_chat(const Json& body, uint64_t default_seed);
CompletionPlan parse_completion(const Json& body, uint64_t default_seed);
int64_t resolve_max_tokens(const CommonParams& p, int64_t prompt_tokens, int64_t ctx);
std::vector<GenerationRequest> make_requests(const CommonParams& p, const std::vector<int32_t>& prompt,
                                             int64_t max_tokens, const std::vector<int32_t>& stop_ids);

// A tool declaration list as OpenAI defines it: [{type:"function", function:{name, description?,
// parameters?: a JSON schema object}}]; ApiError (422, param "tools[i]...") otherwise.
void check_tools_schema(const Json& tools);

}  // namespace k3::serve
