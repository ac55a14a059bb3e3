// Request bodies -> engine requests, validated (see request.h).
#include "serve/request.h"

#include <cctype>
#include <climits>
#include <cmath>
#include <set>

#include "core/error.h"
#include "io/chat_json.h"

namespace k3::serve {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& what, int status = 400,
                      const std::string& code = "") {
  throw ApiError(status, param.empty() ? what : param + ": " + what, param, code);
}

const Json* field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const Json& body, const char* key, bool def) {
  const Json* v = field(body, key);
  if (!v) return def;
  if (!v->is_boolean()) bad(key, std::string("expected true or false, got ") + v->type_name());
  return v->get<bool>();
}

// An integer field; a float with an integral value is accepted (1e3, 5.0).
std::optional<int64_t> get_int(const Json& body, const char* key, int64_t lo, int64_t hi) {
  const Json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, std::string("expected an integer, got ") + v->type_name());
  long double x;
  if (v->is_number_unsigned()) x = static_cast<long double>(v->get<uint64_t>());
  else if (v->is_number_integer()) x = static_cast<long double>(v->get<int64_t>());
  else {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) bad(key, "expected an integer, got " + v->dump());
    x = d;
  }
  if (x < lo || x > hi) bad(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v->dump());
  return static_cast<int64_t>(x);
}

std::optional<double> get_num(const Json& body, const char* key, double lo, double hi, bool lo_open = false) {
  const Json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, std::string("expected a number, got ") + v->type_name());
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d <= lo))
    bad(key, "must be " + std::string(lo_open ? "> " : ">= ") + std::to_string(lo).substr(0, 4) + " and <= " +
                 std::to_string(hi).substr(0, 4) + ", got " + v->dump());
  return d;
}

void parse_common(const Json& body, CommonParams& p, uint64_t default_seed, bool chat) {
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", std::string("expected a string, got ") + m->type_name());
    p.model = m->get<std::string>();
  }
  p.sampling.temperature = get_num(body, "temperature", 0.0, 2.0).value_or(1.0);
  p.sampling.top_p = get_num(body, "top_p", 0.0, 1.0, /*lo_open=*/true).value_or(1.0);
  // top_k: 0 or -1 (vLLM's spelling) is off.
  const int64_t top_k = get_int(body, "top_k", -1, int64_t(1) << 31).value_or(0);
  p.sampling.top_k = top_k < 0 ? 0 : top_k;
  if (const auto s = get_int(body, "seed", INT64_MIN, INT64_MAX)) p.sampling.seed = uint64_t(*s);
  else p.sampling.seed = default_seed;
  // max_completion_tokens (the newer name) wins over max_tokens.
  const auto mt = get_int(body, "max_tokens", 1, int64_t(1) << 40);
  const auto mct = get_int(body, "max_completion_tokens", 1, int64_t(1) << 40);
  p.max_tokens = mct ? mct : mt;
  p.n = int(get_int(body, "n", 1, kMaxChoices).value_or(1));
  if (const Json* s = field(body, "stop")) {
    std::vector<std::string> stops;
    if (s->is_string()) stops.push_back(s->get<std::string>());
    else if (s->is_array()) {
      if (s->size() > size_t(kMaxStopStrings)) bad("stop", "at most " + std::to_string(kMaxStopStrings) + " stop strings");
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string())
          bad("stop[" + std::to_string(i) + "]", std::string("expected a string, got ") + (*s)[i].type_name());
        stops.push_back((*s)[i].get<std::string>());
      }
    } else {
      bad("stop", std::string("expected a string or an array of strings, got ") + s->type_name());
    }
    std::set<std::string> seen;
    for (const std::string& x : stops) {
      if (x.empty()) bad("stop", "stop strings must not be empty");
      if (seen.insert(x).second) p.stop.push_back(x);
    }
  }
  if (chat) {
    // logprobs: bool; top_logprobs: 0..20 alongside it.
    const bool lp = get_bool(body, "logprobs", false);
    const auto tl = get_int(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (tl && !lp) bad("top_logprobs", "needs logprobs: true");
    p.top_logprobs = lp ? int(tl.value_or(0)) : -1;
  } else {
    // completions: logprobs is the number of alternatives (0..5 in OpenAI's API; 20 here).
    if (const Json* v = field(body, "logprobs"); v && v->is_boolean()) {
      p.top_logprobs = v->get<bool>() ? 0 : -1;
    } else if (const auto n = get_int(body, "logprobs", 0, kMaxTopLogprobs)) {
      p.top_logprobs = int(*n);
    }
    if (get_bool(body, "echo", false)) bad("echo", "echo is not supported");
  }
  p.stream = get_bool(body, "stream", false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", std::string("expected an object, got ") + so->type_name());
    if (const Json* iu = field(*so, "include_usage")) {
      if (!iu->is_boolean()) bad("stream_options.include_usage", std::string("expected true or false, got ") + iu->type_name());
      p.include_usage = iu->get<bool>();
    }
    if (!p.stream) bad("stream_options", "only allowed with stream: true");
  }
  for (const char* k : {"frequency_penalty", "presence_penalty"}) get_num(body, k, -2.0, 2.0);
}

// The error a chat::parse_request k3::Error stands for: "request: FIELD: what" -> param FIELD.
[[noreturn]] void rethrow_parse_error(const k3::Error& e) {
  std::string msg = e.what();
  const std::string pre = "request: ";
  if (msg.rfind(pre, 0) == 0) msg = msg.substr(pre.size());
  std::string param;
  if (const size_t colon = msg.find(": "); colon != std::string::npos) param = msg.substr(0, colon);
  if (param == "(top level)") param.clear();
  throw ApiError(400, msg, param);
}

const std::set<std::string> kSchemaTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

void check_schema(const Json& s, const std::string& at, int depth) {
  if (depth > 64) bad(at, "schema nested too deeply", 422);
  if (s.is_boolean()) return;  // true / false are schemas
  if (!s.is_object()) bad(at, std::string("a JSON schema must be an object, got ") + s.type_name(), 422);
  if (auto t = s.find("type"); t != s.end()) {
    auto check_type = [&](const Json& v) {
      if (!v.is_string() || !kSchemaTypes.count(v.get<std::string>()))
        bad(at + ".type", "not a JSON schema type: " + v.dump(), 422);
    };
    if (t->is_array()) {
      for (const Json& v : *t) check_type(v);
    } else {
      check_type(*t);
    }
  }
  if (auto pr = s.find("properties"); pr != s.end()) {
    if (!pr->is_object()) bad(at + ".properties", std::string("expected an object, got ") + pr->type_name(), 422);
    for (auto it = pr->begin(); it != pr->end(); ++it) check_schema(it.value(), at + ".properties." + it.key(), depth + 1);
  }
  if (auto rq = s.find("required"); rq != s.end()) {
    if (!rq->is_array()) bad(at + ".required", std::string("expected an array of names, got ") + rq->type_name(), 422);
    for (const Json& v : *rq)
      if (!v.is_string()) bad(at + ".required", "expected an array of names, found " + v.dump(), 422);
  }
  if (auto it = s.find("items"); it != s.end()) check_schema(*it, at + ".items", depth + 1);
  if (auto ap = s.find("additionalProperties"); ap != s.end()) check_schema(*ap, at + ".additionalProperties", depth + 1);
  for (const char* k : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_array()) bad(at + "." + k, std::string("expected an array of schemas, got ") + it->type_name(), 422);
      for (size_t i = 0; i < it->size(); ++i) check_schema((*it)[i], at + "." + k + "[" + std::to_string(i) + "]", depth + 1);
    }
  }
  if (auto e = s.find("enum"); e != s.end() && !e->is_array())
    bad(at + ".enum", std::string("expected an array, got ") + e->type_name(), 422);
}

}  // namespace

Json parse_body(const std::string& body) {
  try {
    Json j = Json::parse(body);
    if (!j.is_object()) throw ApiError(400, std::string("the request body must be a JSON object, got ") + j.type_name());
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

void check_tools_schema(const Json& tools) {
  if (!tools.is_array()) bad("tools", std::string("expected an array of tool declarations, got ") + tools.type_name());
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const Json& t = tools[i];
    if (!t.is_object()) bad(at, std::string("expected a tool object, got ") + t.type_name());
    const Json* type = field(t, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "function")
      bad(at + ".type", "must be \"function\"", 422);
    const Json* fn = field(t, "function");
    if (!fn || !fn->is_object()) bad(at + ".function", "required object is missing", 422);
    const Json* name = field(*fn, "name");
    if (!name || !name->is_string()) bad(at + ".function.name", "required string is missing", 422);
    const std::string n = name->get<std::string>();
    if (n.empty() || n.size() > 64) bad(at + ".function.name", "must be 1 to 64 characters", 422);
    for (char c : n)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
        bad(at + ".function.name", "may hold only letters, digits, _ - and .", 422);
    if (const Json* d = field(*fn, "description"); d && !d->is_string())
      bad(at + ".function.description", std::string("expected a string, got ") + d->type_name());
    if (const Json* ps = field(*fn, "parameters")) {
      if (!ps->is_object()) bad(at + ".function.parameters", std::string("a JSON schema must be an object, got ") + ps->type_name(), 422);
      check_schema(*ps, at + ".function.parameters", 0);
    }
  }
}

ChatPlan parse_chat(const Json& body, uint64_t default_seed) {
  ChatPlan plan;
  parse_common(body, plan.params, default_seed, /*chat=*/true);
  if (!field(body, "messages")) bad("messages", "required field is missing");
  if (const Json* t = field(body, "tools")) check_tools_schema(*t);
  try {
    plan.conv = chat::parse_request(body);
  } catch (const k3::Error& e) {
    rethrow_parse_error(e);
  }
  if (plan.conv.messages.empty()) bad("messages", "must hold at least one message");
  if (plan.conv.options.response_format == chat::ResponseFormat::json_schema &&
      !plan.conv.options.response_schema.is_object() && !plan.conv.options.response_schema.is_boolean())
    bad("response_format.json_schema.schema", "a JSON schema must be an object", 422);
  if (plan.conv.options.response_format == chat::ResponseFormat::json_schema)
    check_schema(plan.conv.options.response_schema, "response_format.json_schema.schema", 0);
  return plan;
}

CompletionPlan parse_completion(const Json& body, uint64_t default_seed) {
  CompletionPlan plan;
  parse_common(body, plan.params, default_seed, /*chat=*/false);
  const Json* pr = field(body, "prompt");
  if (!pr) bad("prompt", "required field is missing");
  if (pr->is_string()) {
    plan.prompt = pr->get<std::string>();
  } else if (pr->is_array() && pr->size() == 1 && (*pr)[0].is_string()) {
    plan.prompt = (*pr)[0].get<std::string>();
  } else if (pr->is_array() && !pr->empty() && (*pr)[0].is_number()) {
    plan.prompt_is_ids = true;
    for (size_t i = 0; i < pr->size(); ++i) {
      const Json& v = (*pr)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        bad("prompt[" + std::to_string(i) + "]", "expected a token id, got " + v.dump());
      plan.prompt_ids.push_back(int32_t(v.get<int64_t>()));
    }
  } else {
    bad("prompt", "expected a string, one string in an array, or an array of token ids");
  }
  if (!plan.prompt_is_ids && plan.prompt.empty()) bad("prompt", "must not be empty");
  return plan;
}

int64_t resolve_max_tokens(const CommonParams& p, int64_t prompt_tokens, int64_t ctx) {
  if (prompt_tokens >= ctx)
    throw ApiError(400,
                   "This model's context is " + std::to_string(ctx) + " tokens; the prompt has " +
                       std::to_string(prompt_tokens) + " tokens, leaving none to generate",
                   "messages", "context_length_exceeded");
  if (!p.max_tokens) return ctx - prompt_tokens;
  if (prompt_tokens + *p.max_tokens > ctx)
    throw ApiError(400,
                   "This model's context is " + std::to_string(ctx) + " tokens; the prompt has " +
                       std::to_string(prompt_tokens) + " tokens and max_tokens asks for " +
                       std::to_string(*p.max_tokens) + " more",
                   "max_tokens", "context_length_exceeded");
  return *p.max_tokens;
}

std::vector<GenerationRequest> make_requests(const CommonParams& p, const std::vector<int32_t>& prompt,
                                             int64_t max_tokens, const std::vector<int32_t>& stop_ids) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < p.n; ++i) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling = p.sampling;
    r.sampling.seed = p.sampling.seed + uint64_t(i);
    r.stop_tokens = stop_ids;
    r.top_logprobs = p.top_logprobs;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace k3::serve
