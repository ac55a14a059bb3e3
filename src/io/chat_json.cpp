// Parsing and validation of OpenAI-style chat requests (see chat_json.h).
#include "io/chat_json.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace k3::chat {

namespace {

std::string kind(const Json& v) { return v.type_name(); }

bool has(const Json& obj, const char* key) { return obj.is_object() && obj.contains(key); }

// An optional string field: absent or null -> nullopt; anything but a string is an error.
std::optional<std::string> opt_string(const Json& obj, const char* key, const std::string& src,
                                      const std::string& field) {
  if (!has(obj, key) || obj.at(key).is_null()) return std::nullopt;
  const Json& v = obj.at(key);
  if (!v.is_string()) fail_input(src, field, "expected a string, got " + kind(v));
  return v.get<std::string>();
}

std::optional<bool> opt_bool(const Json& obj, const char* key, const std::string& src,
                             const std::string& field) {
  if (!has(obj, key) || obj.at(key).is_null()) return std::nullopt;
  const Json& v = obj.at(key);
  if (!v.is_boolean()) fail_input(src, field, "expected true or false, got " + kind(v));
  return v.get<bool>();
}

// tool_calls[].id and tool_call_id are opaque; the reference compares str(id), so an
// integer id is accepted and spelled in decimal.
std::optional<std::string> opt_id(const Json& obj, const char* key, const std::string& src,
                                  const std::string& field) {
  if (!has(obj, key) || obj.at(key).is_null()) return std::nullopt;
  const Json& v = obj.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return v.dump();
  fail_input(src, field, "expected a string id, got " + kind(v));
}

// Text parts, and image parts (user messages only) in OpenAI's shape: {"type": "image_url",
// "image_url": {"url": "..."}} (or the url as a bare string); the URL is checked by the caller.
std::vector<std::string> parse_content(const Json& msg, const std::string& src, const std::string& at, bool images_ok,
                                       std::vector<ImagePart>* images) {
  std::vector<std::string> parts;
  if (!has(msg, "content") || msg.at("content").is_null()) return parts;
  const Json& c = msg.at("content");
  if (c.is_string()) {
    parts.push_back(c.get<std::string>());
    return parts;
  }
  if (!c.is_array()) fail_input(src, at + ".content", "expected a string, an array of parts or null, got " + kind(c));
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string f = at + ".content[" + std::to_string(i) + "]";
    const Json& p = c[i];
    if (!p.is_object()) fail_input(src, f, "expected a content part object, got " + kind(p));
    const auto type = opt_string(p, "type", src, f + ".type");
    if (!type) fail_input(src, f + ".type", "required field is missing");
    if (*type == "image_url") {
      if (!images_ok) fail_input(src, f + ".type", "image parts are accepted in user messages only");
      if (!has(p, "image_url") || p.at("image_url").is_null())
        fail_input(src, f + ".image_url", "required field is missing");
      const Json& iu = p.at("image_url");
      ImagePart img;
      img.before = parts.size();
      if (iu.is_string()) {
        img.url = iu.get<std::string>();
        img.field = f + ".image_url";
      } else if (iu.is_object()) {
        const auto url = opt_string(iu, "url", src, f + ".image_url.url");
        if (!url) fail_input(src, f + ".image_url.url", "required field is missing");
        if (const auto d = opt_string(iu, "detail", src, f + ".image_url.detail");
            d && *d != "auto" && *d != "low" && *d != "high")
          fail_input(src, f + ".image_url.detail", "expected auto, low or high, got '" + *d + "'");
        img.url = *url;
        img.field = f + ".image_url.url";
      } else {
        fail_input(src, f + ".image_url", "expected an object {\"url\": ...}, got " + kind(iu));
      }
      images->push_back(std::move(img));
      continue;
    }
    if (*type == "image" || *type == "input_image")
      fail_input(src, f + ".type", "unsupported part type '" + *type + "': send images as {\"type\": \"image_url\", "
                                   "\"image_url\": {\"url\": \"data:image/png;base64,...\"}}");
    if (*type != "text")
      fail_input(src, f + ".type", "unknown content part type '" + *type + "' (expected text or image_url)");
    const auto text = opt_string(p, "text", src, f + ".text");
    if (!text) fail_input(src, f + ".text", "required field is missing");
    parts.push_back(*text);
  }
  return parts;
}

void check_tools(const Json& tools, const std::string& src, const std::string& at) {
  if (!tools.is_array()) fail_input(src, at, "expected an array of tool declarations, got " + kind(tools));
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string f = at + "[" + std::to_string(i) + "]";
    const Json& t = tools[i];
    if (!t.is_object()) fail_input(src, f, "expected a tool object, got " + kind(t));
    if (has(t, "function")) {
      const Json& fn = t.at("function");
      if (!fn.is_object()) fail_input(src, f + ".function", "expected an object, got " + kind(fn));
      if (!opt_string(fn, "name", src, f + ".function.name")) fail_input(src, f + ".function.name", "required field is missing");
    }
  }
}

ToolCall parse_tool_call(const Json& tc, const std::string& src, const std::string& at) {
  if (!tc.is_object()) fail_input(src, at, "expected a tool call object, got " + kind(tc));
  ToolCall call;
  call.id = opt_id(tc, "id", src, at + ".id");
  // The reference reads function.name / function.arguments, or the call itself when it
  // has no "function" object (encoding_k3.py: tool_call.get("function", tool_call)).
  const bool nested = has(tc, "function");
  const Json& fn = nested ? tc.at("function") : tc;
  const std::string fat = nested ? at + ".function" : at;
  if (!fn.is_object()) fail_input(src, fat, "expected an object, got " + kind(fn));
  const auto name = opt_string(fn, "name", src, fat + ".name");
  if (!name) fail_input(src, fat + ".name", "required field is missing");
  if (name->empty()) fail_input(src, fat + ".name", "must not be empty");
  call.name = *name;
  parse_arguments(has(fn, "arguments") ? fn.at("arguments") : Json(), call, src, fat + ".arguments");
  return call;
}

Message parse_message(const Json& m, const std::string& src, const std::string& at) {
  if (!m.is_object()) fail_input(src, at, "expected a message object, got " + kind(m));
  const auto role = opt_string(m, "role", src, at + ".role");
  if (!role) fail_input(src, at + ".role", "required field is missing");
  Message msg;
  if (*role == "system") msg.role = Role::system;
  else if (*role == "user") msg.role = Role::user;
  else if (*role == "assistant") msg.role = Role::assistant;
  else if (*role == "tool") msg.role = Role::tool;
  else fail_input(src, at + ".role", "unknown role '" + *role + "' (expected system, user, assistant or tool)");

  msg.content = parse_content(m, src, at, msg.role == Role::user, &msg.images);
  if (msg.role != Role::tool) msg.name = opt_string(m, "name", src, at + ".name").value_or("");

  if (msg.role == Role::system && has(m, "tools") && !m.at("tools").is_null()) {
    check_tools(m.at("tools"), src, at + ".tools");
    if (!m.at("tools").empty()) msg.tools = m.at("tools");
  }
  if (msg.role == Role::assistant) {
    // reasoning_content, or reasoning when that is empty (the reference's `a or b`).
    auto r = opt_string(m, "reasoning_content", src, at + ".reasoning_content");
    if (!r || r->empty()) {
      auto alt = opt_string(m, "reasoning", src, at + ".reasoning");
      if (alt) r = alt;
    }
    msg.reasoning = r;
    if (has(m, "tool_calls") && !m.at("tool_calls").is_null()) {
      const Json& tcs = m.at("tool_calls");
      if (!tcs.is_array()) fail_input(src, at + ".tool_calls", "expected an array, got " + kind(tcs));
      for (size_t i = 0; i < tcs.size(); ++i) {
        msg.tool_calls.push_back(parse_tool_call(tcs[i], src, at + ".tool_calls[" + std::to_string(i) + "]"));
      }
    }
  }
  if (msg.role == Role::tool) {
    msg.tool_call_id = has(m, "tool_call_id") ? opt_id(m, "tool_call_id", src, at + ".tool_call_id")
                                              : opt_id(m, "id", src, at + ".id");
    // `tool` wins over `name` when present, even when null (tool_message.get("tool", name)).
    if (has(m, "tool")) msg.tool_name = opt_string(m, "tool", src, at + ".tool");
    else msg.tool_name = opt_string(m, "name", src, at + ".name");
  }
  return msg;
}

// One option read from chat_template_kwargs first, then from the request itself.
const Json* option(const Json& req, const char* key, std::string& field) {
  if (has(req, "chat_template_kwargs") && req.at("chat_template_kwargs").is_object() &&
      req.at("chat_template_kwargs").contains(key) && !req.at("chat_template_kwargs").at(key).is_null()) {
    field = std::string("chat_template_kwargs.") + key;
    return &req.at("chat_template_kwargs").at(key);
  }
  if (has(req, key) && !req.at(key).is_null()) {
    field = key;
    return &req.at(key);
  }
  return nullptr;
}

void parse_thinking(const Json& req, Options& o, const std::string& src) {
  if (has(req, "chat_template_kwargs") && !req.at("chat_template_kwargs").is_null() &&
      !req.at("chat_template_kwargs").is_object()) {
    fail_input(src, "chat_template_kwargs", "expected an object, got " + kind(req.at("chat_template_kwargs")));
  }
  std::string f;
  auto get_bool = [&](const char* key) -> std::optional<bool> {
    const Json* v = option(req, key, f);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail_input(src, f, "expected true or false, got " + kind(*v));
    return v->get<bool>();
  };
  auto get_str = [&](const char* key, std::string& where) -> std::optional<std::string> {
    const Json* v = option(req, key, where);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail_input(src, where, "expected a string, got " + kind(*v));
    return v->get<std::string>();
  };
  // encoding_k3.py _normalize_vllm_chat_options: thinking, else enable_thinking, else on;
  // reasoning_effort "none" turns thinking off, any other value is the effort unless
  // thinking_effort is given; the effort defaults to max and must be low, high or max.
  auto thinking = get_bool("thinking");
  if (!thinking) thinking = get_bool("enable_thinking");
  o.thinking = thinking.value_or(true);
  std::string rf, tf;
  const auto reasoning_effort = get_str("reasoning_effort", rf);
  auto thinking_effort = get_str("thinking_effort", tf);
  std::string effort_field = tf;
  if (reasoning_effort && *reasoning_effort == "none") {
    o.thinking = false;
  } else if (!thinking_effort && reasoning_effort) {
    thinking_effort = reasoning_effort;
    effort_field = rf;
  }
  const std::string e = thinking_effort.value_or("max");
  if (e == "low") o.effort = Effort::low;
  else if (e == "high") o.effort = Effort::high;
  else if (e == "max") o.effort = Effort::max;
  else fail_input(src, effort_field, "unsupported effort '" + e + "' (Kimi K3 supports low, high, max; none turns thinking off)");
}

void parse_tool_choice(const Json& req, Options& o, const std::string& src) {
  if (!has(req, "tool_choice") || req.at("tool_choice").is_null()) return;
  const Json& v = req.at("tool_choice");
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "auto") o.tool_choice = ToolChoice::auto_;
    else if (s == "required") o.tool_choice = ToolChoice::required;
    else if (s == "none") o.tool_choice = ToolChoice::none;
    else fail_input(src, "tool_choice", "unknown value '" + s + "' (expected auto, required or none)");
    return;
  }
  if (v.is_object()) {
    // The K3 prompt has no sentence for a named function; vLLM refuses it too without its
    // structural-tag grammar (kimi_k3_tool_parser.py adjust_request).
    fail_input(src, "tool_choice", "a named function is not supported by the Kimi K3 chat format (use auto, required or none)");
  }
  fail_input(src, "tool_choice", "expected a string, got " + kind(v));
}

void parse_response_format(const Json& req, Options& o, const std::string& src) {
  if (!has(req, "response_format") || req.at("response_format").is_null()) return;
  const Json& rf = req.at("response_format");
  std::string type;
  if (rf.is_string()) type = rf.get<std::string>();
  else if (rf.is_object()) {
    const auto t = opt_string(rf, "type", src, "response_format.type");
    if (!t) fail_input(src, "response_format.type", "required field is missing");
    type = *t;
  } else {
    fail_input(src, "response_format", "expected an object, got " + kind(rf));
  }
  if (type == "text") o.response_format = ResponseFormat::text;
  else if (type == "json_object") o.response_format = ResponseFormat::json_object;
  else if (type == "json_schema") {
    o.response_format = ResponseFormat::json_schema;
    if (!has(rf, "json_schema") || rf.at("json_schema").is_null()) {
      fail_input(src, "response_format.json_schema", "required field is missing");
    }
    const Json& js = rf.at("json_schema");
    if (!js.is_object()) fail_input(src, "response_format.json_schema", "expected an object, got " + kind(js));
    // extract_response_schema: json_schema.schema, else json_schema.json_schema, else itself.
    if (js.contains("schema")) o.response_schema = js.at("schema");
    else if (js.contains("json_schema")) o.response_schema = js.at("json_schema");
    else o.response_schema = js;
  } else {
    fail_input(src, "response_format.type", "unknown type '" + type + "' (expected text, json_object or json_schema)");
  }
}

}  // namespace

void parse_arguments(const Json& a, ToolCall& call, const std::string& src, const std::string& field) {
  call.arguments = Json::object();
  call.json_block.reset();
  // encoding_k3.py normalize_tool_arguments.
  if (a.is_null()) return;
  if (a.is_object()) {
    call.arguments = a;
    return;
  }
  if (!a.is_string()) fail_input(src, field, "expected a JSON object string or an object, got " + kind(a));
  const std::string& s = a.get_ref<const std::string&>();
  if (s.find_first_not_of(" \t\n\r\f\v") == std::string::npos) return;
  Json parsed = Json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    call.json_block = s;  // not JSON: rendered raw in one json block
    return;
  }
  if (!parsed.is_object()) fail_input(src, field, "must be a JSON object, got " + kind(parsed));
  call.arguments = std::move(parsed);
}

Conversation parse_request(const Json& req, const std::string& src) {
  if (!req.is_object()) fail_input(src, "(top level)", "expected a request object, got " + kind(req));
  if (!has(req, "messages")) fail_input(src, "messages", "required field is missing");
  const Json& ms = req.at("messages");
  if (!ms.is_array()) fail_input(src, "messages", "expected an array, got " + kind(ms));
  Conversation c;
  for (size_t i = 0; i < ms.size(); ++i) c.messages.push_back(parse_message(ms[i], src, "messages[" + std::to_string(i) + "]"));
  if (has(req, "tools") && !req.at("tools").is_null()) {
    check_tools(req.at("tools"), src, "tools");
    c.tools = req.at("tools");
  }
  parse_thinking(req, c.options, src);
  parse_tool_choice(req, c.options, src);
  parse_response_format(req, c.options, src);
  if (auto g = opt_bool(req, "add_generation_prompt", src, "add_generation_prompt")) c.options.add_generation_prompt = *g;
  return c;
}

Conversation parse_request_text(const std::string& text, const std::string& src) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail_input(src, "(top level)", std::string("invalid JSON: ") + e.what());
  }
  return parse_request(j, src);
}

Conversation load_request(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_system("cannot open chat request", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_request_text(ss.str(), path);
}

const char* effort_name(Effort e) {
  switch (e) {
    case Effort::low: return "low";
    case Effort::high: return "high";
    case Effort::max: return "max";
  }
  return "max";
}

const char* role_name(Role r) {
  switch (r) {
    case Role::system: return "system";
    case Role::user: return "user";
    case Role::assistant: return "assistant";
    case Role::tool: return "tool";
  }
  return "user";
}

}  // namespace k3::chat
