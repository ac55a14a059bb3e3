// The streaming output state machine (see chat_parse.h for the rules and their sources).
#include "io/chat_parse.h"

#include <array>
#include <cctype>

#include "core/error.h"
#include "io/chat_pyjson.h"

namespace k3::chat {

namespace {

constexpr std::array<std::pair<std::string_view, Marker>, 4> kMarkers{{
    {"<|open|>", Marker::open},
    {"<|close|>", Marker::close},
    {"<|sep|>", Marker::sep},
    {"<|end_of_msg|>", Marker::end_of_msg},
}};

std::string_view spelling(Marker m) {
  for (const auto& [s, k] : kMarkers)
    if (k == m) return s;
  return "";
}

// A tag's text is never longer than this in well-formed output: past it, the marker was
// not a tag opener and its text goes back to the channel.
constexpr size_t kMaxOpenTag = 4096;
constexpr size_t kMaxCloseTag = 64;

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// key="value" pairs (key a run of [A-Za-z0-9_]), values unescaped &quot; then &amp;.
std::vector<std::pair<std::string, std::string>> parse_attrs(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (i < s.size()) {
    const size_t eq = s.find("=\"", i);
    if (eq == std::string::npos) break;
    size_t k = eq;
    while (k > i && word(s[k - 1])) --k;
    const size_t end = s.find('"', eq + 2);
    if (end == std::string::npos) break;
    if (k < eq) {
      std::string v = s.substr(eq + 2, end - eq - 2);
      std::string a;
      for (size_t j = 0; j < v.size();) {
        if (v.compare(j, 6, "&quot;") == 0) a += '"', j += 6;
        else a += v[j++];
      }
      std::string b;
      for (size_t j = 0; j < a.size();) {
        if (a.compare(j, 5, "&amp;") == 0) b += '&', j += 5;
        else b += a[j++];
      }
      out.push_back({s.substr(k, eq - k), b});
    }
    i = end + 1;
  }
  return out;
}

std::string attr(const std::vector<std::pair<std::string, std::string>>& attrs, const std::string& key,
                 const std::string& dflt) {
  // the last of a repeated attribute wins, as in the reference's dict comprehension
  for (auto it = attrs.rbegin(); it != attrs.rend(); ++it)
    if (it->first == key) return it->second;
  return dflt;
}

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t utf8_complete(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return back < need ? n - back : n;
  }
  return n;
}

}  // namespace

OutputParser::OutputParser(ParserOptions options) : opt_(std::move(options)) {
  if (!opt_.make_call_id) opt_.make_call_id = [](int i) { return "call_" + std::to_string(i); };
  switch (opt_.start) {
    case StartIn::think: state_ = State::think; break;
    case StartIn::response: state_ = State::response; break;
    case StartIn::message: state_ = State::message_start; break;
  }
}

std::vector<Delta> OutputParser::take_batch() {
  std::vector<Delta> b;
  b.swap(batch_);
  return b;
}

// ---- front ends ---------------------------------------------------------------------------

std::vector<Delta> OutputParser::feed_text(std::string_view text) {
  lex_.append(text);
  lex(false);
  return take_batch();
}

std::vector<Delta> OutputParser::feed_literal(std::string_view text) {
  lex(true);
  on_text(text);
  return take_batch();
}

std::vector<Delta> OutputParser::feed_marker(Marker m) {
  lex(true);
  on_marker(m);
  return take_batch();
}

std::vector<Delta> OutputParser::finish() {
  lex(true);
  if (state_ != State::done) {
    abandon_pending();
    end_all(State::done);
    flush_utf8();
    const std::string reason = !out_.tool_calls.empty() ? "tool_calls" : saw_end_ ? "stop" : "length";
    push({Delta::Kind::finish, reason, -1, "", ""});
  }
  return take_batch();
}

// Split lex_ at marker spellings; keep a tail that may still grow into a marker unless final.
void OutputParser::lex(bool final) {
  size_t pos = 0, from = 0;
  while (true) {
    const size_t k = lex_.find("<|", from);
    if (k == std::string::npos) {
      // a lone trailing '<' may start a marker
      size_t keep = (!final && !lex_.empty() && lex_.back() == '<' && lex_.size() - 1 >= pos) ? 1 : 0;
      on_text(std::string_view(lex_).substr(pos, lex_.size() - pos - keep));
      lex_.erase(0, lex_.size() - keep);
      return;
    }
    bool matched = false, partial = false;
    for (const auto& [s, m] : kMarkers) {
      if (lex_.compare(k, s.size(), s) == 0) {
        on_text(std::string_view(lex_).substr(pos, k - pos));
        on_marker(m);
        pos = from = k + s.size();
        matched = true;
        break;
      }
      if (lex_.size() - k < s.size() && s.substr(0, lex_.size() - k) == std::string_view(lex_).substr(k)) partial = true;
    }
    if (matched) continue;
    if (partial && !final) {
      on_text(std::string_view(lex_).substr(pos, k - pos));
      lex_.erase(0, k);
      return;
    }
    from = k + 1;
  }
}

// ---- grammar --------------------------------------------------------------------------------

void OutputParser::on_text(std::string_view s) {
  if (s.empty() || state_ == State::done) return;
  if (pending_.active) {
    pending_.text.append(s);
    if (pending_.text.size() > (pending_.is_open ? kMaxOpenTag : kMaxCloseTag)) abandon_pending();
    return;
  }
  channel_text(std::string(s));
}

void OutputParser::channel_text(const std::string& s) {
  switch (state_) {
    case State::think: emit(Delta::Kind::reasoning, s, -1, true); break;
    case State::response:
    case State::between:
    case State::message_start: emit(Delta::Kind::content, s, -1, true); break;
    case State::argument:
      if (!arg_live_) break;
      if (arg_type_ == "string") emit(Delta::Kind::tool_call_arguments, py_escape(s), live_index(), true);
      else arg_raw_ += s;
      break;
    case State::json_block:
      if (block_live_) emit(Delta::Kind::tool_call_arguments, s, int(out_.tool_calls.size()) - 1, true);
      break;
    default: break;  // between tags of tools/call, after the message: dropped
  }
}

void OutputParser::on_marker(Marker m) {
  if (state_ == State::done) return;
  const bool in_value = state_ == State::argument || state_ == State::json_block;
  if (pending_.active) {
    if (m == Marker::sep) {
      Pending p = std::move(pending_);
      pending_ = {};
      if (in_value) value_close_tag(p.text);
      else apply_tag(p.is_open, p.text);
      return;
    }
    abandon_pending();  // a marker before the tag's <|sep|>: it was no tag
  }
  if (m == Marker::end_of_msg) {
    saw_end_ = true;
    end_all(State::done);
    flush_utf8();
    push({Delta::Kind::finish, out_.tool_calls.empty() ? "stop" : "tool_calls", -1, "", ""});
    return;
  }
  if (in_value) {
    // Only a close can end a value; an open or a sep there is the value's own text.
    if (m == Marker::close) pending_ = {true, false, ""};
    else channel_text(std::string(spelling(m)));
    return;
  }
  if (m == Marker::open || m == Marker::close) pending_ = {true, m == Marker::open, ""};
  // a lone <|sep|> outside a value is dropped
}

void OutputParser::abandon_pending() {
  if (!pending_.active) return;
  Pending p = std::move(pending_);
  pending_ = {};
  const bool in_value = state_ == State::argument || state_ == State::json_block;
  // In a value the marker is value text; in reasoning or content it is dropped, never leaked.
  if (in_value) channel_text(std::string(spelling(p.is_open ? Marker::open : Marker::close)) + p.text);
  else channel_text(p.text);
}

void OutputParser::value_close_tag(const std::string& tag) {
  const std::string name = trim(tag);
  if (state_ == State::argument && name == "argument") {
    close_argument();
    state_ = State::call;
  } else if (state_ == State::json_block && name == "json") {
    block_live_ = false;
    state_ = State::call;
  } else if (name == "call") {
    end_all(State::tools);
  } else if (name == "tools") {
    end_all(State::between);
  } else if (name == "message") {
    end_all(State::after_message);
  } else {
    channel_text(std::string(spelling(Marker::close)) + tag + std::string(spelling(Marker::sep)));
  }
}

void OutputParser::apply_tag(bool is_open, const std::string& tag) {
  const std::string t = trim(tag);
  const size_t ws = t.find_first_of(" \t\n\r");
  const std::string name = t.substr(0, ws);
  const std::string rest = ws == std::string::npos ? "" : t.substr(ws);
  const bool text_channel = state_ == State::think || state_ == State::response || state_ == State::between ||
                            state_ == State::message_start;
  if (is_open) {
    if (text_channel) {
      // Opening response, tools or a call from inside think is the implicit think close.
      if (name == "think" && (state_ == State::between || state_ == State::message_start)) state_ = State::think;
      else if (name == "response" && state_ != State::response) state_ = State::response;
      else if (name == "tools") state_ = State::tools;
      else if (name == "call") {
        state_ = State::tools;
        open_call(rest);
        state_ = State::call;
      }
    } else if (state_ == State::tools && name == "call") {
      open_call(rest);
      state_ = State::call;
    } else if (state_ == State::call && name == "argument") {
      open_argument(rest);
      state_ = State::argument;
    } else if (state_ == State::call && name == "json") {
      block_live_ = call_live_ && call_args_ == 0 && !call_raw_;
      if (block_live_) call_raw_ = true;
      state_ = State::json_block;
    }
    return;  // any other open tag fits nowhere: dropped
  }
  if (name == "message" && state_ != State::after_message) {
    end_all(State::after_message);
  } else if ((state_ == State::think && name == "think") || (state_ == State::response && name == "response") ||
             (state_ == State::tools && name == "tools")) {
    state_ = State::between;
  } else if (state_ == State::call && name == "call") {
    end_all(State::tools);
  } else if (state_ == State::call && name == "tools") {
    end_all(State::between);
  }
}

void OutputParser::open_call(const std::string& attrs) {
  const auto a = parse_attrs(attrs);
  const std::string name = attr(a, "tool", "");
  call_live_ = !name.empty();  // a call without a tool name is dropped, as in the reference
  call_raw_ = false;
  call_args_ = 0;
  if (!call_live_) return;
  const int index = int(out_.tool_calls.size());
  flush_utf8();
  push({Delta::Kind::tool_call_start, "", index, opt_.make_call_id(index), name});
}

void OutputParser::open_argument(const std::string& attrs) {
  arg_live_ = call_live_ && !call_raw_;
  arg_raw_.clear();
  if (!arg_live_) return;
  const auto a = parse_attrs(attrs);
  arg_type_ = attr(a, "type", "string");
  std::string head = call_args_ == 0 ? "{" : ", ";
  head += py_quote(attr(a, "key", ""));
  head += ": ";
  if (arg_type_ == "string") head += '"';
  ++call_args_;
  emit(Delta::Kind::tool_call_arguments, head, live_index(), false);
}

void OutputParser::close_argument() {
  if (!arg_live_) return;
  arg_live_ = false;
  if (arg_type_ == "string") {
    emit(Delta::Kind::tool_call_arguments, "\"", live_index(), false);
    return;
  }
  // Other types are JSON-decoded; text that is not JSON is kept as a string (_decode_call).
  const Json v = Json::parse(arg_raw_, nullptr, /*allow_exceptions=*/false);
  emit(Delta::Kind::tool_call_arguments, v.is_discarded() ? py_quote(arg_raw_) : py_dumps(v, {}), live_index(), false);
  arg_raw_.clear();
}

void OutputParser::close_call() {
  block_live_ = false;
  if (!call_live_) return;
  call_live_ = false;
  if (call_raw_) emit(Delta::Kind::tool_call_arguments, "", live_index(), false);
  else emit(Delta::Kind::tool_call_arguments, call_args_ == 0 ? "{}" : "}", live_index(), false);
}

void OutputParser::end_all(State next) {
  if (state_ == State::argument) close_argument();
  if (state_ == State::argument || state_ == State::json_block || state_ == State::call) close_call();
  state_ = next;
}

// ---- deltas ---------------------------------------------------------------------------------

void OutputParser::emit(Delta::Kind kind, std::string text, int index, bool hold) {
  if (!utf8_.empty() && (kind != utf8_kind_ || index != utf8_index_)) flush_utf8();
  std::string s = std::move(utf8_);
  utf8_.clear();
  s += text;
  if (hold) {
    const size_t cut = utf8_complete(s);
    utf8_ = s.substr(cut);
    s.resize(cut);
    utf8_kind_ = kind;
    utf8_index_ = index;
  }
  if (!s.empty()) push({kind, std::move(s), index, "", ""});
}

void OutputParser::flush_utf8() {
  if (utf8_.empty()) return;
  std::string s = std::move(utf8_);
  utf8_.clear();
  push({utf8_kind_, std::move(s), utf8_index_, "", ""});
}

void OutputParser::push(Delta d) {
  apply_delta(out_, d);
  const bool textual = d.kind == Delta::Kind::reasoning || d.kind == Delta::Kind::content ||
                       d.kind == Delta::Kind::tool_call_arguments;
  if (textual && !batch_.empty() && batch_.back().kind == d.kind && batch_.back().index == d.index) {
    batch_.back().text += d.text;
    return;
  }
  batch_.push_back(std::move(d));
}

void apply_delta(ParsedOutput& out, const Delta& d) {
  switch (d.kind) {
    case Delta::Kind::reasoning: out.reasoning += d.text; break;
    case Delta::Kind::content: out.content += d.text; break;
    case Delta::Kind::tool_call_start: out.tool_calls.push_back({d.id, d.name, ""}); break;
    case Delta::Kind::tool_call_arguments:
      K3_ASSERT(d.index >= 0 && size_t(d.index) < out.tool_calls.size(), "arguments delta for an unknown call");
      out.tool_calls[size_t(d.index)].arguments += d.text;
      break;
    case Delta::Kind::finish: out.finish_reason = d.text; break;
  }
}

MarkerIds MarkerIds::lookup(const LookupSpecial& lookup_special) {
  auto get = [&](const char* name) {
    const auto id = lookup_special(name);
    if (!id) fail(std::string("tokenizer: special token '") + name + "' is not in the special-token table");
    return *id;
  };
  MarkerIds m;
  m.open = get(kOpen);
  m.close = get(kClose);
  m.sep = get(kSep);
  m.end_of_msg = get(kEndOfMsg);
  return m;
}

std::vector<Delta> feed_token(OutputParser& parser, const MarkerIds& ids, int32_t id,
                              const std::function<std::string(int32_t)>& decode) {
  if (id == ids.open) return parser.feed_marker(Marker::open);
  if (id == ids.close) return parser.feed_marker(Marker::close);
  if (id == ids.sep) return parser.feed_marker(Marker::sep);
  if (id == ids.end_of_msg) return parser.feed_marker(Marker::end_of_msg);
  return parser.feed_literal(decode(id));
}

ParsedOutput parse_output(std::string_view text, ParserOptions options) {
  OutputParser p(std::move(options));
  p.feed_text(text);
  p.finish();
  return p.result();
}

}  // namespace k3::chat
