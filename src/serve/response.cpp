// OpenAI response JSON builders (see response.h).
#include "serve/response.h"

namespace k3::serve {

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  Json u = Json::object();
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["prompt_tokens_details"] = Json{{"cached_tokens", cached_tokens}};
  return u;
}

Json message_json(const chat::ParsedOutput& out) {
  Json m = Json::object();
  m["role"] = "assistant";
  m["content"] = out.content.empty() && !out.tool_calls.empty() ? Json() : Json(out.content);
  m["reasoning_content"] = out.reasoning.empty() ? Json() : Json(out.reasoning);
  if (!out.tool_calls.empty()) {
    Json calls = Json::array();
    for (const chat::ParsedCall& c : out.tool_calls)
      calls.push_back(Json{{"id", c.id}, {"type", "function"}, {"function", Json{{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = calls;
  }
  return m;
}

Json chat_choice_json(int index, const chat::ParsedOutput& out, const Json& logprobs) {
  Json c = Json::object();
  c["index"] = index;
  c["message"] = message_json(out);
  c["logprobs"] = logprobs;
  c["finish_reason"] = out.finish_reason;
  return c;
}

// The envelope every non-streamed response shares; `object` names its kind.
static Json response_json(const char* object, const ResponseHead& h, const std::vector<Json>& choices,
                          const Json& usage) {
  Json r = Json::object();
  r["id"] = h.id;
  r["object"] = object;
  r["created"] = h.created;
  r["model"] = h.model;
  r["choices"] = choices;
  r["usage"] = usage;
  r["system_fingerprint"] = nullptr;
  return r;
}

Json chat_completion_json(const ResponseHead& h, const std::vector<Json>& choices, const Json& usage) {
  return response_json("chat.completion", h, choices, usage);
}

Json delta_json(const chat::Delta& d) {
  switch (d.kind) {
    case chat::Delta::Kind::reasoning: return Json{{"reasoning_content", d.text}};
    case chat::Delta::Kind::content: return Json{{"content", d.text}};
    case chat::Delta::Kind::tool_call_start:
      return Json{{"tool_calls", Json::array({Json{{"index", d.index},
                                                   {"id", d.id},
                                                   {"type", "function"},
                                                   {"function", Json{{"name", d.name}, {"arguments", ""}}}}})}};
    case chat::Delta::Kind::tool_call_arguments:
      return Json{{"tool_calls", Json::array({Json{{"index", d.index}, {"function", Json{{"arguments", d.text}}}}})}};
    case chat::Delta::Kind::finish: break;
  }
  return Json::object();
}

Json role_delta_json() { return Json{{"role", "assistant"}, {"content", ""}}; }

Json chat_chunk_json(const ResponseHead& h, int index, const Json& delta, const Json& finish_reason,
                     const Json& logprobs) {
  Json c = Json::object();
  c["index"] = index;
  c["delta"] = delta;
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish_reason;
  Json r = Json::object();
  r["id"] = h.id;
  r["object"] = "chat.completion.chunk";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = nullptr;
  r["choices"] = Json::array({c});
  r["usage"] = nullptr;
  return r;
}

Json chat_usage_chunk_json(const ResponseHead& h, const Json& usage) {
  Json r = Json::object();
  r["id"] = h.id;
  r["object"] = "chat.completion.chunk";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = nullptr;
  r["choices"] = Json::array();
  r["usage"] = usage;
  return r;
}

std::vector<chat::Delta> merge_deltas(const std::vector<chat::Delta>& ds) {
  std::vector<chat::Delta> out;
  for (const chat::Delta& d : ds) {
    const bool text = d.kind == chat::Delta::Kind::reasoning || d.kind == chat::Delta::Kind::content ||
                      d.kind == chat::Delta::Kind::tool_call_arguments;
    if (text && !out.empty() && out.back().kind == d.kind && out.back().index == d.index) {
      out.back().text += d.text;
      continue;
    }
    out.push_back(d);
  }
  return out;
}

Json completion_choice_json(int index, const std::string& text, const std::string& finish, const Json& logprobs) {
  Json c = Json::object();
  c["index"] = index;
  c["text"] = text;
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish;
  return c;
}

Json completion_json(const ResponseHead& h, const std::vector<Json>& choices, const Json& usage) {
  return response_json("text_completion", h, choices, usage);
}

Json completion_chunk_json(const ResponseHead& h, int index, const std::string& text, const Json& finish_reason,
                           const Json& logprobs) {
  Json r = Json::object();
  r["id"] = h.id;
  r["object"] = "text_completion";
  r["created"] = h.created;
  r["model"] = h.model;
  r["choices"] = Json::array({Json{{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason}}});
  r["usage"] = nullptr;
  return r;
}

Json completion_usage_chunk_json(const ResponseHead& h, const Json& usage) {
  Json r = completion_chunk_json(h, 0, "", nullptr);
  r["choices"] = Json::array();
  r["usage"] = usage;
  return r;
}

Json models_json(const std::string& model, int64_t created, int64_t ctx) {
  Json m = Json::object();
  m["id"] = model;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "k3cpp";
  m["max_model_len"] = ctx;
  return Json{{"object", "list"}, {"data", Json::array({m})}};
}

}  // namespace k3::serve
