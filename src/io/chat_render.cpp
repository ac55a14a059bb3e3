// XTML rendering (see chat_render.h). Each helper mirrors one building block of
// encoding_k3.py; the comments name it.
#include "io/chat_render.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "io/chat_pyjson.h"

namespace k3::chat {

namespace {

using Attrs = std::vector<std::pair<std::string, std::string>>;

class Out {
 public:
  // _segment: empty text produces no segment.
  void text(const std::string& s) {
    if (!s.empty()) segs_.push_back({s, false});
  }
  void control(const char* s) { segs_.push_back({s, true}); }

  // _open_tag / _attr: each attribute is four text segments " key", "=\"", value, "\"",
  // the value escaped & -> &amp; then " -> &quot;.
  void open(const std::string& tag, const Attrs& attrs = {}) {
    control(kOpen);
    text(tag);
    for (const auto& [k, v] : attrs) {
      text(" " + k);
      text("=\"");
      text(escape_attr(v));
      text("\"");
    }
    control(kSep);
  }
  void close(const std::string& tag) {
    control(kClose);
    text(tag);
    control(kSep);
  }
  void end_of_msg() { control(kEndOfMsg); }

  std::vector<Segment> take() { return std::move(segs_); }

  static std::string escape_attr(const std::string& v) {
    std::string a;
    for (char c : v) a += c == '&' ? std::string("&amp;") : std::string(1, c);
    std::string b;
    for (char c : a) b += c == '"' ? std::string("&quot;") : std::string(1, c);
    return b;
  }

 private:
  std::vector<Segment> segs_;
};

// Python str.strip(): ASCII whitespace is all the internal bodies can contain.
std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool is_blank(const std::string& s) { return strip(s).empty(); }

// _internal_system_message: role="system" type="T", the stripped body, close, end.
void internal_system(Out& o, const std::string& type, const std::string& body) {
  o.open("message", {{"role", "system"}, {"type", type}});
  o.text(strip(body));
  o.close("message");
  o.end_of_msg();
}

// _render_tool_declare; tools are key-sorted recursively and dumped compact.
void tool_declare(Out& o, const Json& tools, bool dynamic) {
  const std::string head = dynamic ? "## New Tools Available\n"
                                     "The system dynamically extends the toolset via lazy-loading.\n"
                                     "You have access to all existing and extended tools.\n"
                                     "Here are the specs for the extended tools.\n\n"
                                   : "# Tools\n"
                                     "Here are the available tools, described in JSONSchema.\n\n";
  o.open("message", {{"role", "system"}, {"type", "tool-declare"}});
  o.text(head + "```json\n" + py_dumps(tools, {.compact = true, .sort_keys = true}) + "\n```");
  o.close("message");
  o.end_of_msg();
}

void content(Out& o, const std::vector<std::string>& parts) {
  for (const auto& p : parts) o.text(p);
}

// A user message's parts with its images in place: each image one <|media_pad|> control
// segment (never text, so no user text can spell one). How K3's template wraps an image
// (its vocabulary has <|media_begin|> / <|media_content|> / <|media_end|>) was not verified;
// this is the bare placeholder the training data and `generate --image` use.
void user_content(Out& o, const Message& m) {
  size_t next = 0;
  for (size_t i = 0; i <= m.content.size(); ++i) {
    while (next < m.images.size() && m.images[next].before == i) o.control(kMediaPad), ++next;
    if (i < m.content.size()) o.text(m.content[i]);
  }
  while (next < m.images.size()) o.control(kMediaPad), ++next;
}

// _xtml_type of a JSON value.
const char* xtml_type(const Json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

// _render_assistant_segments.
void assistant_body(Out& o, const Message& m, bool thinking) {
  if (thinking) {
    // The think channel is structural: present even when empty (and reasoning of every
    // earlier turn is kept; the reference drops none).
    o.open("think");
    if (m.reasoning && !is_blank(*m.reasoning)) o.text(*m.reasoning);
    o.close("think");
  }
  o.open("response");
  content(o, m.content);
  o.close("response");
  if (m.tool_calls.empty()) return;
  o.open("tools");
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ToolCall& tc = m.tool_calls[i];
    o.open("call", {{"tool", tc.name}, {"index", std::to_string(i + 1)}});
    if (tc.json_block) {
      o.open("json", {{"type", "object"}});
      o.text(*tc.json_block);
      o.close("json");
    } else {
      for (auto it = tc.arguments.begin(); it != tc.arguments.end(); ++it) {
        const Json& v = it.value();
        o.open("argument", {{"key", it.key()}, {"type", xtml_type(v)}});
        // _xtml_value: strings raw, anything else json.dumps with default separators.
        o.text(v.is_string() ? v.get<std::string>() : py_dumps(v, {.compact = false, .sort_keys = false}));
        o.close("argument");
      }
    }
    o.close("call");
  }
  o.close("tools");
}

void open_message(Out& o, const char* role, const std::string& name) {
  Attrs attrs{{"role", role}};
  if (!name.empty()) attrs.push_back({"name", name});
  o.open("message", attrs);
}

struct Indexed {
  const Message* msg;
  size_t original;  // position in the request, for error messages
  std::optional<std::string> resolved_name;
};

std::vector<Indexed> order(const std::vector<Message>& ms) {
  std::vector<Indexed> out;
  std::map<std::string, std::pair<size_t, std::string>> current;  // id -> (1-based position, name)
  size_t i = 0;
  while (i < ms.size()) {
    const Message& m = ms[i];
    if (m.role == Role::assistant) {
      // _tool_call_id_index: every call advances the position; duplicates keep the first.
      current.clear();
      for (size_t p = 0; p < m.tool_calls.size(); ++p) {
        const auto& id = m.tool_calls[p].id;
        if (id && !current.count(*id)) current[*id] = {p + 1, m.tool_calls[p].name};
      }
    }
    if (m.role != Role::tool) {
      out.push_back({&m, i, std::nullopt});
      ++i;
      continue;
    }
    struct Item {
      size_t position, offset, original;
      std::optional<std::string> name;
    };
    std::vector<Item> run;
    bool unresolved = false;
    for (size_t off = 0; i < ms.size() && ms[i].role == Role::tool; ++i, ++off) {
      const auto& id = ms[i].tool_call_id;
      auto it = id ? current.find(*id) : current.end();
      if (it == current.end()) {
        unresolved = true;
        run.push_back({0, off, i, std::nullopt});
      } else {
        run.push_back({it->second.first, off, i, it->second.second});
      }
    }
    if (!unresolved) {
      std::stable_sort(run.begin(), run.end(), [](const Item& a, const Item& b) {
        return a.position != b.position ? a.position < b.position : a.offset < b.offset;
      });
    }
    for (const Item& it : run) out.push_back({&ms[it.original], it.original, unresolved ? std::nullopt : it.name});
  }
  return out;
}

}  // namespace

std::vector<Message> order_tool_results(const std::vector<Message>& messages) {
  std::vector<Message> out;
  for (const Indexed& x : order(messages)) {
    out.push_back(*x.msg);
    if (x.resolved_name) out.back().tool_name = x.resolved_name;
  }
  return out;
}

std::vector<Segment> render(const Conversation& conv) {
  const Options& opt = conv.options;
  Out o;
  if (!conv.tools.empty()) tool_declare(o, conv.tools, false);
  if (opt.thinking) {
    // The effort note is present whenever thinking is on (the effort defaults to max).
    internal_system(o, "thinking-effort",
                    "`thinking_effort` guides on how much to think in your thinking channel (not including "
                    "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                    "Now the system is invoked with `thinking_effort=" +
                        std::string(effort_name(opt.effort)) + "`.");
  }
  const std::vector<ToolCall>* last_calls = nullptr;
  size_t tool_index = 0;
  for (const Indexed& x : order(conv.messages)) {
    const Message& m = *x.msg;
    switch (m.role) {
      case Role::user:
        open_message(o, "user", m.name);
        user_content(o, m);
        o.close("message");
        o.end_of_msg();
        break;
      case Role::system:
        if (m.tools) {
          tool_declare(o, *m.tools, true);
          break;
        }
        open_message(o, "system", m.name);
        content(o, m.content);
        o.close("message");
        o.end_of_msg();
        break;
      case Role::tool: {
        ++tool_index;
        std::optional<std::string> name = x.resolved_name ? x.resolved_name : m.tool_name;
        // Without a name, the call at the same position of the last assistant turn.
        if (!name && last_calls && tool_index <= last_calls->size()) name = (*last_calls)[tool_index - 1].name;
        if (!name) {
          fail_input("conversation", "messages[" + std::to_string(x.original) + "]",
                     "tool result needs a resolvable tool name: give `tool`/`name`, a tool_call_id "
                     "matching the assistant's call, or match a call by position");
        }
        o.open("message", {{"role", "tool"}, {"tool", *name}, {"index", std::to_string(tool_index)}});
        content(o, m.content);
        o.close("message");
        o.end_of_msg();
        break;
      }
      case Role::assistant:
        last_calls = &m.tool_calls;
        tool_index = 0;
        open_message(o, "assistant", m.name);
        assistant_body(o, m, opt.thinking);
        o.close("message");
        o.end_of_msg();
        break;
    }
  }
  if (opt.tool_choice == ToolChoice::required) {
    internal_system(o, "tool-choice",
                    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  } else if (opt.tool_choice == ToolChoice::none) {
    internal_system(o, "tool-choice",
                    "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
  }
  const std::string raw_json =
      "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
  if (opt.response_format == ResponseFormat::json_object) {
    internal_system(o, "response-format", "The system is invoked with `response_format=json_object`.\n" + raw_json);
  } else if (opt.response_format == ResponseFormat::json_schema) {
    internal_system(o, "response-format",
                    "The system is invoked with `response_format=json_schema`.\n" + raw_json +
                        "\nThe JSON data must match the following schema:\n```json\n" +
                        py_dumps(opt.response_schema, {.compact = true, .sort_keys = true}) + "\n```");
  }
  if (opt.add_generation_prompt) {
    o.open("message", {{"role", "assistant"}});
    o.open(opt.thinking ? "think" : "response");
  }
  return o.take();
}

std::vector<int32_t> segments_to_ids(const std::vector<Segment>& segments, const EncodeText& encode_text,
                                     const LookupSpecial& lookup_special) {
  std::vector<int32_t> ids;
  for (const Segment& s : segments) {
    if (!s.is_control) {
      const auto piece = encode_text(s.text);
      ids.insert(ids.end(), piece.begin(), piece.end());
      continue;
    }
    const auto id = lookup_special(s.text);
    if (!id) fail("tokenizer: special token '" + s.text + "' is not in the special-token table");
    ids.push_back(*id);
  }
  return ids;
}

std::string join_segments(const std::vector<Segment>& segments) {
  std::string s;
  for (const auto& seg : segments) s += seg.text;
  return s;
}

}  // namespace k3::chat
