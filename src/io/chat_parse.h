// Streaming parser of Kimi K3 model output (the assistant turn after the generation prompt):
//   REASONING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
//   [<|open|>tools<|sep|><|open|>call tool="N" index="1"<|sep|>
//     <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>...
//   <|close|>call<|sep|>...<|close|>tools<|sep|>]<|close|>message<|sep|><|end_of_msg|>
// It turns pieces, fed in any chunking, into OpenAI-style deltas: reasoning text, content
// text, tool-call starts and argument text (the arguments JSON string, streamed), and a
// finish reason. The deltas of a stream concatenate to the same result whatever the
// chunking (tested over every split of the test cases).
//
// Rules (vLLM kimi_k3_reasoning_parser.py / kimi_k3_tool_parser.py, vllm-project/vllm,
// vllm/reasoning and vllm/tool_parsers, where they say; the rest is this parser's own):
//  - argument type="string" is raw text; other types are JSON-decoded, falling back to the
//    raw text as a string when it is not JSON (tool parser _decode_call); the arguments
//    string is json.dumps(arguments) with Python's default ", " / ": " separators;
//  - attribute values are unescaped &quot; then &amp; (the reverse of the render);
//  - a call without a tool name is dropped (tool parser); a json type="object" block is the
//    raw arguments text (the render's form for non-JSON arguments; vLLM drops it);
//  - a missing think close is tolerated: opening response or tools (or a call) inside the
//    think channel closes it (vLLM would keep it all as reasoning);
//  - markers never reach reasoning or content: a tag that fits nowhere is dropped, and a
//    marker whose tag is not finished by <|sep|> loses the marker (its text stays);
//  - inside an argument value the value runs to the first close of argument, call, tools or
//    message (the reference's non-greedy rule); any other marker there is value text;
//  - feed_text() finds markers by their spelling (what a text-only server sees, so a string
//    argument that spells <|close|>argument<|sep|> is cut there, as in the reference);
//    feed_literal()/feed_marker() take the token-level truth: text decoded from ordinary
//    tokens is never a marker, so the same value survives (tested both ways);
//  - text deltas hold back an unfinished UTF-8 sequence until it completes, so every delta
//    is valid UTF-8 when the model's is.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "io/chat_render.h"

namespace k3::chat {

enum class Marker { open, close, sep, end_of_msg };

struct Delta {
  enum class Kind { reasoning, content, tool_call_start, tool_call_arguments, finish };
  Kind kind = Kind::content;
  std::string text;  // reasoning/content/arguments text; finish: the finish reason
  int index = -1;    // tool calls: 0-based call index
  std::string id;    // tool_call_start
  std::string name;  // tool_call_start
  bool operator==(const Delta&) const = default;
};

struct ParsedCall {
  std::string id, name, arguments;  // arguments: a JSON object as text
  bool operator==(const ParsedCall&) const = default;
};

struct ParsedOutput {
  std::string reasoning, content;
  std::vector<ParsedCall> tool_calls;
  std::string finish_reason;  // "stop", "tool_calls" (any call), "length" (no end_of_msg)
  bool operator==(const ParsedOutput&) const = default;
};

// Where the model's output starts: the generation prompt opened think (thinking on) or
// response (thinking off), or only the assistant message.
enum class StartIn { think, response, message };

struct ParserOptions {
  StartIn start = StartIn::think;
  std::function<std::string(int index)> make_call_id;  // default "call_<index>"
};

class OutputParser {
 public:
  explicit OutputParser(ParserOptions options = {});
  std::vector<Delta> feed_text(std::string_view text);     // markers found by spelling
  std::vector<Delta> feed_literal(std::string_view text);  // never a marker
  std::vector<Delta> feed_marker(Marker m);
  std::vector<Delta> finish();  // end of stream: closes what is open; "length" if no end_of_msg
  const ParsedOutput& result() const { return out_; }
  bool done() const { return state_ == State::done; }

 private:
  enum class State { message_start, think, response, between, tools, call, argument, json_block, after_message, done };
  struct Pending {
    bool active = false, is_open = false;
    std::string text;
  };

  void lex(bool final);
  void on_text(std::string_view s);
  void on_marker(Marker m);
  void channel_text(const std::string& s);
  void apply_tag(bool is_open, const std::string& tag);
  void value_close_tag(const std::string& tag);
  void abandon_pending();
  void open_call(const std::string& attrs);
  void open_argument(const std::string& attrs);
  void close_argument();
  void close_call();
  void end_all(State next);
  void emit(Delta::Kind kind, std::string text, int index, bool hold);
  void flush_utf8();
  void push(Delta d);
  std::vector<Delta> take_batch();
  int live_index() const { return int(out_.tool_calls.size()) - 1; }

  ParserOptions opt_;
  State state_;
  Pending pending_;
  std::string lex_;  // feed_text bytes held back: a possible marker prefix
  std::vector<Delta> batch_;
  ParsedOutput out_;
  // UTF-8 holdback of the last text delta
  std::string utf8_;
  Delta::Kind utf8_kind_ = Delta::Kind::content;
  int utf8_index_ = -1;
  // the open call and argument
  bool call_live_ = false, call_raw_ = false, arg_live_ = false, block_live_ = false;
  int call_args_ = 0;
  std::string arg_type_, arg_raw_;
  bool saw_end_ = false;
};

// The four marker token ids, looked up by name in the tokenizer's special-token table.
struct MarkerIds {
  int32_t open = -1, close = -1, sep = -1, end_of_msg = -1;
  static MarkerIds lookup(const LookupSpecial& lookup_special);  // k3::Error if one is absent
};

// Token-level front end: marker ids become markers, every other id is decoded as literal text.
std::vector<Delta> feed_token(OutputParser& parser, const MarkerIds& ids, int32_t id,
                              const std::function<std::string(int32_t)>& decode);

// Whole-output parse (feed_text + finish), the non-streaming path.
ParsedOutput parse_output(std::string_view text, ParserOptions options = {});
// Deltas applied in order: what a client that concatenates the stream ends up with.
void apply_delta(ParsedOutput& out, const Delta& d);

}  // namespace k3::chat
