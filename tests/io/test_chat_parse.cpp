// The streaming output parser: the cases other servers got wrong (a missing think close,
// <|close|>message<|sep|> leaking into content, marker text inside a string argument), tool
// calls with every argument type, and the property that the streamed deltas concatenate to
// the whole-output parse for every chunking (every split for short inputs, every 1-, 2- and
// 3-chunk split for the rest), plus render -> parse round trips over the fixtures.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/fixture.h"
#include "core/error.h"
#include "io/chat_json.h"
#include "io/chat_parse.h"
#include "io/chat_render.h"

using namespace k3;
using namespace k3::chat;
namespace fs = std::filesystem;

namespace {

ParserOptions at(StartIn s) {
  ParserOptions o;
  o.start = s;
  return o;
}

const char* kMarkerSpellings[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Feed `text` cut at `cuts` (sorted offsets); return what a client concatenating the deltas has.
ParsedOutput streamed(const std::string& text, const std::vector<size_t>& cuts, StartIn start, bool check_utf8) {
  OutputParser p(at(start));
  ParsedOutput acc;
  size_t prev = 0;
  auto take = [&](const std::vector<Delta>& ds) {
    for (const auto& d : ds) {
      if (check_utf8) {
        EXPECT_TRUE(valid_utf8(d.text)) << "delta is not UTF-8: '" << d.text << "'";
      }
      apply_delta(acc, d);
    }
  };
  for (size_t c : cuts) {
    take(p.feed_text(std::string_view(text).substr(prev, c - prev)));
    prev = c;
  }
  take(p.feed_text(std::string_view(text).substr(prev)));
  take(p.finish());
  EXPECT_EQ(acc, p.result());
  return acc;
}

void expect_no_marker(const ParsedOutput& o) {
  for (const char* m : kMarkerSpellings) {
    EXPECT_EQ(o.content.find(m), std::string::npos) << "marker in content: " << o.content;
    EXPECT_EQ(o.reasoning.find(m), std::string::npos) << "marker in reasoning: " << o.reasoning;
  }
}

// The chunking property for one input: every chunking for short inputs, else every split
// into one, two and three chunks.
void check_chunkings(const std::string& text, StartIn start = StartIn::think) {
  SCOPED_TRACE(text);
  const ParsedOutput whole = parse_output(text, at(start));
  expect_no_marker(whole);
  const bool utf8 = valid_utf8(text);
  const size_t n = text.size();
  if (n <= 14) {
    for (uint32_t mask = 0; mask < (1u << (n ? n - 1 : 0)); ++mask) {
      std::vector<size_t> cuts;
      for (size_t i = 0; i + 1 < n; ++i)
        if (mask >> i & 1) cuts.push_back(i + 1);
      ASSERT_EQ(streamed(text, cuts, start, utf8), whole) << "mask " << mask;
    }
    return;
  }
  for (size_t a = 1; a < n; ++a) {
    ASSERT_EQ(streamed(text, {a}, start, utf8), whole) << "cut " << a;
    for (size_t b = a + 1; b < n; b += 1 + n / 64) ASSERT_EQ(streamed(text, {a, b}, start, utf8), whole) << a << "," << b;
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < n; ++i) every.push_back(i);
  ASSERT_EQ(streamed(text, every, start, utf8), whole) << "byte by byte";
}

const std::string kEnd = "<|close|>message<|sep|><|end_of_msg|>";

}  // namespace

TEST(ChatParse, ReasoningThenContent) {
  const auto o = parse_output("Let me think.<|close|>think<|sep|><|open|>response<|sep|>Hi there<|close|>response<|sep|>" + kEnd);
  EXPECT_EQ(o.reasoning, "Let me think.");
  EXPECT_EQ(o.content, "Hi there");
  EXPECT_TRUE(o.tool_calls.empty());
  EXPECT_EQ(o.finish_reason, "stop");
}

TEST(ChatParse, MissingThinkCloseIsAnImplicitClose) {
  auto o = parse_output("pondering<|open|>response<|sep|>answer<|close|>response<|sep|>" + kEnd);
  EXPECT_EQ(o.reasoning, "pondering");
  EXPECT_EQ(o.content, "answer");
  o = parse_output("pondering<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" + kEnd);
  EXPECT_EQ(o.reasoning, "pondering");
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].name, "f");
  EXPECT_EQ(o.tool_calls[0].arguments, "{}");
  EXPECT_EQ(o.finish_reason, "tool_calls");
  // even the tools channel itself may be skipped
  o = parse_output("p<|open|>call tool=\"g\" index=\"1\"<|sep|><|close|>call<|sep|>" + kEnd);
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.reasoning, "p");
}

TEST(ChatParse, MessageCloseNeverLeaksIntoContent) {
  // Without the response close, <|close|>message<|sep|> ends the content; streamed in pieces
  // that split every marker it must not appear either.
  const std::string text = "r<|close|>think<|sep|><|open|>response<|sep|>Done." + kEnd;
  const auto o = parse_output(text);
  EXPECT_EQ(o.content, "Done.");
  check_chunkings(text);
  // Stray or unknown tags are dropped, not shown.
  const auto s = parse_output("<|close|>think<|sep|><|open|>response<|sep|>a<|sep|>b<|close|>bogus<|sep|>c<|open|>x y=\"1\"<|sep|>d" + kEnd);
  EXPECT_EQ(s.content, "abcd");
  // A marker whose tag is never finished loses the marker but keeps its text.
  const auto u = parse_output("<|close|>think<|sep|><|open|>response<|sep|>a<|open|> b <|close|>response<|sep|>");
  EXPECT_EQ(u.content, "a b ");
  EXPECT_EQ(u.finish_reason, "length");
}

TEST(ChatParse, ThinkingOffStartsInResponse) {
  const auto o = parse_output("Plain answer<|close|>response<|sep|>" + kEnd, at(StartIn::response));
  EXPECT_EQ(o.reasoning, "");
  EXPECT_EQ(o.content, "Plain answer");
  const auto m = parse_output("<|open|>think<|sep|>t<|close|>think<|sep|><|open|>response<|sep|>c<|close|>response<|sep|>" + kEnd,
                              at(StartIn::message));
  EXPECT_EQ(m.reasoning, "t");
  EXPECT_EQ(m.content, "c");
  // Text after the think close without a response open is content (as vLLM strips it).
  EXPECT_EQ(parse_output("t<|close|>think<|sep|>bare" + kEnd).content, "bare");
}

TEST(ChatParse, ToolCallsWithEveryArgumentType) {
  const std::string text =
      "Need weather.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris \"centre\"\n<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|open|>argument key=\"ratio\" type=\"number\"<|sep|>0.5<|close|>argument<|sep|>"
      "<|open|>argument key=\"metric\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
      "<|open|>argument key=\"hint\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
      "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"z\":1,\"a\":[1,\"two\"]}<|close|>argument<|sep|>"
      "<|open|>argument key=\"tags\" type=\"array\"<|sep|>[\"x\", \"y\"]<|close|>argument<|sep|>"
      "<|open|>argument key=\"bad\" type=\"number\"<|sep|>about 3<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|open|>call tool=\"a&amp;b&quot;c\" index=\"2\"<|sep|>"
      "<|open|>argument key=\"k&quot;\"<|sep|>untyped<|close|>argument<|sep|><|close|>call<|sep|>"
      "<|close|>tools<|sep|>" + kEnd;
  const auto o = parse_output(text);
  EXPECT_EQ(o.reasoning, "Need weather.");
  EXPECT_EQ(o.content, "Checking.");
  ASSERT_EQ(o.tool_calls.size(), 2u);
  EXPECT_EQ(o.tool_calls[0].id, "call_0");
  EXPECT_EQ(o.tool_calls[0].name, "get_weather");
  // json.dumps(arguments) as vLLM returns it: ", " and ": ", keys in order, strings raw,
  // other types decoded, text that is not JSON kept as a string.
  EXPECT_EQ(o.tool_calls[0].arguments,
            R"({"city": "Paris \"centre\"\n", "days": 3, "ratio": 0.5, "metric": true, "hint": null, )"
            R"("opts": {"z": 1, "a": [1, "two"]}, "tags": ["x", "y"], "bad": "about 3"})");
  EXPECT_EQ(o.tool_calls[1].name, "a&b\"c");
  EXPECT_EQ(o.tool_calls[1].arguments, R"({"k\"": "untyped"})");
  EXPECT_EQ(o.finish_reason, "tool_calls");
  const Json args = Json::parse(o.tool_calls[0].arguments);
  EXPECT_EQ(args.at("opts").at("a").at(1), "two");
  check_chunkings(text);
}

TEST(ChatParse, ToolCallsStreamAsStartThenArgumentDeltas) {
  OutputParser p;
  std::vector<Delta> all;
  auto take = [&](std::vector<Delta> ds) { all.insert(all.end(), ds.begin(), ds.end()); };
  take(p.feed_text("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"run\" index=\"1\"<|sep|>"));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, Delta::Kind::tool_call_start);
  EXPECT_EQ(all[0].name, "run");
  EXPECT_EQ(all[0].index, 0);
  take(p.feed_text("<|open|>argument key=\"code\" type=\"string\"<|sep|>print("));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].kind, Delta::Kind::tool_call_arguments);
  EXPECT_EQ(all[1].text, "{\"code\": \"print(");  // string values stream as they come
  take(p.feed_text("1)<|close|>argu"));
  EXPECT_EQ(all.back().text, "1)");
  take(p.feed_text("ment<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"));
  EXPECT_EQ(all.back().kind, Delta::Kind::finish);
  EXPECT_EQ(all.back().text, "tool_calls");
  EXPECT_EQ(p.result().tool_calls.at(0).arguments, "{\"code\": \"print(1)\"}");
  EXPECT_TRUE(p.done());
  EXPECT_TRUE(p.feed_text("after the end").empty());
}

TEST(ChatParse, MarkerTextInAStringArgument) {
  // Text level (the reference's rule): the value ends at the first close of argument.
  const std::string text =
      "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"echo\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"s\" type=\"string\"<|sep|>a<|open|>b<|sep|>c<|close|>x<|sep|>d<|close|>argument<|sep|>tail"
      "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" + kEnd;
  const auto o = parse_output(text);
  ASSERT_EQ(o.tool_calls.size(), 1u);
  // other markers inside a value are value text, up to the first close of argument
  EXPECT_EQ(o.tool_calls[0].arguments, R"({"s": "a<|open|>b<|sep|>c<|close|>x<|sep|>d"})");
  check_chunkings(text);
  // Token level: text decoded from ordinary tokens is never a marker, so a value that spells
  // the closing marker survives whole.
  OutputParser p;
  p.feed_marker(Marker::close);
  p.feed_literal("think");
  p.feed_marker(Marker::sep);
  for (const char* tag : {"tools", "call tool=\"echo\" index=\"1\"", "argument key=\"s\" type=\"string\""}) {
    p.feed_marker(Marker::open);
    p.feed_literal(tag);
    p.feed_marker(Marker::sep);
  }
  p.feed_literal("x<|close|>argument<|sep|>y");
  for (const char* tag : {"argument", "call", "tools", "message"}) {
    p.feed_marker(Marker::close);
    p.feed_literal(tag);
    p.feed_marker(Marker::sep);
  }
  p.feed_marker(Marker::end_of_msg);
  EXPECT_EQ(p.result().tool_calls.at(0).arguments, R"({"s": "x<|close|>argument<|sep|>y"})");
}

TEST(ChatParse, CallsWithoutANameAreDroppedAndJsonBlocksAreRaw) {
  const auto o = parse_output(
      "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>x"
      "<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"run\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>"
      "print(1) {not json<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" + kEnd);
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].name, "run");
  EXPECT_EQ(o.tool_calls[0].id, "call_0");
  EXPECT_EQ(o.tool_calls[0].arguments, "print(1) {not json");
}

TEST(ChatParse, TruncatedOutputClosesOpenCallsAndSaysLength) {
  const auto o = parse_output("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
                              "<|open|>argument key=\"q\" type=\"string\"<|sep|>half");
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].arguments, R"({"q": "half"})");
  EXPECT_TRUE(Json::accept(o.tool_calls[0].arguments));
  EXPECT_EQ(o.finish_reason, "tool_calls");
  const auto r = parse_output("still thinking <|clo");
  EXPECT_EQ(r.reasoning, "still thinking <|clo");  // an unfinished marker prefix is text at the end
  EXPECT_EQ(r.finish_reason, "length");
}

TEST(ChatParse, Utf8SplitAcrossPiecesIsHeldBack) {
  const std::string text = "é字🎉<|close|>think<|sep|><|open|>response<|sep|>naïve 😀" + kEnd;
  check_chunkings(text);  // also checks that every delta is valid UTF-8
  const std::string s = "\xc3\xa9<|sep|>\xf0\x9f\x98\x80";
  check_chunkings(s, StartIn::response);
}

TEST(ChatParse, EveryChunkingOfShortInputs) {
  for (const char* t : {"a<|sep|>b", "ab<|open|>cd", "<|close|>x", "x<|end_of_msg|>", "<|open|>a<|sep|>", "<|<|sep|>|>",
                        "<|close|>think", "a<|clo|>b", "<|open|>tools"}) {
    check_chunkings(t);
    check_chunkings(t, StartIn::response);
  }
}

TEST(ChatParse, TokenLevelFeedUsesTheSpecialTable) {
  const std::map<std::string, int32_t> table = {
      {"<|end_of_msg|>", 163586}, {"<|open|>", 163587}, {"<|close|>", 163588}, {"<|sep|>", 163589}};
  const auto lookup = [&](const std::string& n) -> std::optional<int32_t> {
    auto it = table.find(n);
    return it == table.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  const MarkerIds ids = MarkerIds::lookup(lookup);
  EXPECT_EQ(ids.open, 163587);
  EXPECT_EQ(ids.end_of_msg, 163586);
  // ids < 256 are bytes here; the user-visible text spells a marker but is ordinary tokens
  const std::string words = "say <|sep|>";
  std::vector<int32_t> seq;
  for (char c : std::string("r")) seq.push_back(uint8_t(c));
  seq.insert(seq.end(), {163588});
  for (char c : std::string("think")) seq.push_back(uint8_t(c));
  seq.push_back(163589);
  for (char c : words) seq.push_back(uint8_t(c));
  seq.insert(seq.end(), {163588});
  for (char c : std::string("message")) seq.push_back(uint8_t(c));
  seq.insert(seq.end(), {163589, 163586});
  OutputParser p;
  for (int32_t id : seq) feed_token(p, ids, id, [](int32_t i) { return std::string(1, char(i)); });
  EXPECT_EQ(p.result().reasoning, "r");
  EXPECT_EQ(p.result().content, words);
  EXPECT_EQ(p.result().finish_reason, "stop");
  EXPECT_THROW(MarkerIds::lookup([](const std::string&) { return std::nullopt; }), Error);
}

// Render every fixture's assistant turns and parse them back: the reasoning, the content and
// every tool call's name and arguments must come back, fed as tokens (control segments as
// markers, text segments as literal text) and, where no value spells a marker, as text.
TEST(ChatParse, RoundTripsEveryRenderedAssistantTurn) {
  size_t turns = 0;
  for (const auto& e : fs::directory_iterator(test::data_path("chat"))) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().filename().string());
    std::ifstream f(e.path());
    const Json fx = Json::parse(f);
    const Conversation conv = parse_request(fx.at("request"));
    const auto ordered = order_tool_results(conv.messages);
    for (const Message& m : ordered) {
      if (m.role != Role::assistant) continue;
      Conversation one;
      one.options = conv.options;
      one.options.add_generation_prompt = false;
      one.options.tool_choice = ToolChoice::auto_;
      one.options.response_format = ResponseFormat::text;
      one.messages = {m};
      auto segs = render(one);
      // drop everything up to and including the generation-prompt prefix of this turn
      size_t start = 0, seen_open = 0;
      for (size_t i = 0; i + 1 < segs.size(); ++i) {
        if (segs[i].is_control && segs[i].text == kOpen && segs[i + 1].text == "message" && i + 3 < segs.size() &&
            segs[i + 4].text == "assistant") {
          // skip <|open|>message role="assistant" [name] <|sep|> <|open|>think|response <|sep|>
          size_t j = i;
          while (!(segs[j].is_control && segs[j].text == kSep)) ++j;
          j += 3;
          start = j + 1;
          ++seen_open;
          break;
        }
      }
      ASSERT_EQ(seen_open, 1u);
      std::vector<chat::Segment> body(segs.begin() + long(start), segs.end());
      const StartIn where = one.options.thinking ? StartIn::think : StartIn::response;
      OutputParser tok(at(where));
      for (const auto& s : body) {
        if (!s.is_control) tok.feed_literal(s.text);
        else if (s.text == kOpen) tok.feed_marker(Marker::open);
        else if (s.text == kClose) tok.feed_marker(Marker::close);
        else if (s.text == kSep) tok.feed_marker(Marker::sep);
        else tok.feed_marker(Marker::end_of_msg);
      }
      const ParsedOutput& o = tok.result();
      std::string content;
      for (const auto& p : m.content) content += p;
      if (one.options.thinking) {
        const bool blank = !m.reasoning || m.reasoning->find_first_not_of(" \t\n") == std::string::npos;
        EXPECT_EQ(o.reasoning, blank ? "" : *m.reasoning);
      }
      EXPECT_EQ(o.content, content);
      ASSERT_EQ(o.tool_calls.size(), m.tool_calls.size());
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        EXPECT_EQ(o.tool_calls[k].name, m.tool_calls[k].name);
        // a json block comes back as its raw text, typed arguments as the same JSON object
        if (m.tool_calls[k].json_block) EXPECT_EQ(o.tool_calls[k].arguments, *m.tool_calls[k].json_block);
        else EXPECT_EQ(Json::parse(o.tool_calls[k].arguments), m.tool_calls[k].arguments) << o.tool_calls[k].arguments;
      }
      EXPECT_EQ(o.finish_reason, m.tool_calls.empty() ? "stop" : "tool_calls");
      // as text: the same, unless a value spells a marker (then the text-level rule cuts it)
      const std::string text = join_segments(body);
      bool spells = false;
      for (const auto& s : body)
        if (!s.is_control && s.text.find("<|") != std::string::npos) spells = true;
      if (!spells) {
        EXPECT_EQ(parse_output(text, at(where)), o);
      }
      check_chunkings(text, where);  // chunking never changes the result, markers spelled or not
      ++turns;
    }
  }
  EXPECT_GE(turns, 20u);
}
