// serve/choice.h and serve/response.h on the tiny K3-layout vocabulary
// (tests/data/k3-release-tiny): model output as token ids, fed one id at a time.
//  - reasoning then content: each lands in its own field, no marker spelling in either;
//  - tool calls with typed arguments: the arguments JSON keeps the types;
//  - the missing think close (the model opens response directly) is an implicit close;
//  - a string argument whose *text* spells a closing marker (ordinary ids) stays in the value;
//  - stop strings cut content (not reasoning), across token boundaries, and win over the end;
//  - the deltas a stream sends, applied in order, equal result(), and the chunk JSON of the
//    deltas concatenates to the same message as the non-streamed JSON;
//  - completions text: raw, the ending id not in the text.
#include <gtest/gtest.h>

#include "common/fixture.h"
#include "common/tiny_vocab.h"
#include "serve/xtml_ids.h"
#include "infer/chat_vocab.h"
#include "serve/choice.h"
#include "serve/response.h"

using k3::chat::Segment;
using k3::serve::Json;

namespace {

using k3::test::tiny_vocab;

std::vector<int32_t> ids_of(const std::string& xtml) { return k3::test::xtml_ids(tiny_vocab(), xtml); }

struct ChatRun {
  k3::chat::ParsedOutput result, streamed;
  std::vector<k3::chat::Delta> deltas;
  Json message_from_chunks;
};

ChatRun run_chat(const std::string& xtml, std::vector<std::string> stop = {}, const std::string& engine_finish = "stop",
             k3::chat::StartIn start = k3::chat::StartIn::think) {
  k3::serve::ChatChoice c(tiny_vocab(), start, std::move(stop), "call_t");
  ChatRun r;
  for (int32_t id : ids_of(xtml))
    for (auto& d : c.feed(id)) r.deltas.push_back(d);
  for (auto& d : c.finish(engine_finish)) r.deltas.push_back(d);
  r.result = c.result();
  for (const auto& d : r.deltas) k3::chat::apply_delta(r.streamed, d);
  r.streamed.finish_reason = r.result.finish_reason;
  // What a client builds from the chunk JSON (OpenAI's accumulation rules).
  Json msg = {{"content", ""}, {"reasoning_content", ""}, {"tool_calls", Json::array()}};
  const k3::serve::ResponseHead h{"id", 0, "m"};
  for (const auto& d : k3::serve::merge_deltas(r.deltas)) {
    const Json delta = k3::serve::chat_chunk_json(h, 0, k3::serve::delta_json(d)).at("choices")[0].at("delta");
    if (delta.contains("content")) msg["content"] = msg["content"].get<std::string>() + delta["content"].get<std::string>();
    if (delta.contains("reasoning_content"))
      msg["reasoning_content"] = msg["reasoning_content"].get<std::string>() + delta["reasoning_content"].get<std::string>();
    if (delta.contains("tool_calls"))
      for (const Json& t : delta["tool_calls"]) {
        const size_t i = t["index"].get<size_t>();
        if (i >= msg["tool_calls"].size())
          msg["tool_calls"].push_back({{"id", t["id"]}, {"type", "function"}, {"function", {{"name", t["function"]["name"]}, {"arguments", ""}}}});
        msg["tool_calls"][i]["function"]["arguments"] =
            msg["tool_calls"][i]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
      }
  }
  r.message_from_chunks = msg;
  return r;
}

void expect_no_marker(const std::string& s) {
  for (const char* m : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}) EXPECT_EQ(s.find(m), std::string::npos) << s;
}

void expect_stream_agrees(const ChatRun& r) {
  EXPECT_EQ(r.streamed, r.result);
  const Json m = k3::serve::message_json(r.result);
  EXPECT_EQ(m["content"].is_null() ? std::string() : m["content"].get<std::string>(), r.message_from_chunks["content"]);
  EXPECT_EQ(m["reasoning_content"].is_null() ? std::string() : m["reasoning_content"].get<std::string>(),
            r.message_from_chunks["reasoning_content"]);
  EXPECT_EQ(m.value("tool_calls", Json::array()), r.message_from_chunks["tool_calls"]);
}

const std::string kEnd = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";

}  // namespace

TEST(ServeChoice, ReasoningThenContent) {
  const ChatRun r = run_chat("Let me think.<|close|>think<|sep|><|open|>response<|sep|>The answer is 4." + kEnd);
  EXPECT_EQ(r.result.reasoning, "Let me think.");
  EXPECT_EQ(r.result.content, "The answer is 4.");
  EXPECT_EQ(r.result.finish_reason, "stop");
  expect_no_marker(r.result.content);
  expect_no_marker(r.result.reasoning);
  expect_stream_agrees(r);
}

TEST(ServeChoice, ToolCallsWithTypedArguments) {
  const ChatRun r = run_chat(
      "need weather<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|open|>argument key=\"metric\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
  ASSERT_EQ(r.result.tool_calls.size(), 1u);
  EXPECT_EQ(r.result.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.result.tool_calls[0].id, "call_t0");
  const Json args = Json::parse(r.result.tool_calls[0].arguments);
  EXPECT_EQ(args, (Json{{"city", "Paris"}, {"days", 3}, {"metric", true}}));
  EXPECT_EQ(r.result.finish_reason, "tool_calls");
  EXPECT_TRUE(k3::serve::message_json(r.result)["content"].is_null());
  expect_stream_agrees(r);
}

TEST(ServeChoice, MissingThinkCloseIsAnImplicitClose) {
  const ChatRun r = run_chat("thinking...<|open|>response<|sep|>Hi!" + kEnd);
  EXPECT_EQ(r.result.reasoning, "thinking...");
  EXPECT_EQ(r.result.content, "Hi!");
  expect_stream_agrees(r);
}

TEST(ServeChoice, MarkerSpellingInAStringArgumentStaysText) {
  const ChatRun r = run_chat(
      "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"echo\" index=\"1\"<|sep|><|open|>argument key=\"text\" type=\"string\"<|sep|>"
      "[[a<|close|>argument<|sep|>b]]<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
      "<|close|>message<|sep|><|end_of_msg|>");
  ASSERT_EQ(r.result.tool_calls.size(), 1u);
  EXPECT_EQ(Json::parse(r.result.tool_calls[0].arguments)["text"], "a<|close|>argument<|sep|>b");
  expect_stream_agrees(r);
}

TEST(ServeChoice, ThinkingOffStartsInResponse) {
  const ChatRun r = run_chat("Plain answer." + kEnd, {}, "stop", k3::chat::StartIn::response);
  EXPECT_EQ(r.result.reasoning, "");
  EXPECT_EQ(r.result.content, "Plain answer.");
  EXPECT_TRUE(k3::serve::message_json(r.result)["reasoning_content"].is_null());
}

TEST(ServeChoice, StopStringsCutContentOnly) {
  // "STOP" in the reasoning does not stop; in the content it does (split across tokens).
  ChatRun r = run_chat("I will say STOP.<|close|>think<|sep|><|open|>response<|sep|>Hello STOP world" + kEnd, {"STOP"});
  EXPECT_EQ(r.result.reasoning, "I will say STOP.");
  EXPECT_EQ(r.result.content, "Hello ");
  EXPECT_EQ(r.result.finish_reason, "stop");
  expect_stream_agrees(r);
  // A held-back partial match is released at the end.
  r = run_chat("<|close|>think<|sep|><|open|>response<|sep|>ends with ST" + kEnd, {"STOP"});
  EXPECT_EQ(r.result.content, "ends with ST");
  expect_stream_agrees(r);
  // A stop string cut by max_tokens: "stop" wins; without a match the engine's "length" stands.
  r = run_chat("<|close|>think<|sep|><|open|>response<|sep|>abc STOP def", {"STOP"}, "length");
  EXPECT_EQ(r.result.finish_reason, "stop");
  r = run_chat("<|close|>think<|sep|><|open|>response<|sep|>abc def", {"STOP"}, "length");
  EXPECT_EQ(r.result.finish_reason, "length");
  EXPECT_EQ(r.result.content, "abc def");
}

TEST(ServeChoice, CompletionTextIsRawWithoutTheEndingId) {
  k3::serve::TextChoice c(tiny_vocab(), {"zz"});
  std::string streamed;
  for (int32_t id : ids_of("Once upon a time<|sep|>x<|end_of_msg|>")) streamed += c.feed(id);
  streamed += c.finish("stop");
  EXPECT_EQ(streamed, "Once upon a time<|sep|>x");
  EXPECT_EQ(c.text(), streamed);
  EXPECT_EQ(c.finish_reason(), "stop");
  k3::serve::TextChoice s(tiny_vocab(), {"upon"});
  for (int32_t id : ids_of("Once upon a time")) s.feed(id);
  s.finish("length");
  EXPECT_EQ(s.text(), "Once ");
  EXPECT_EQ(s.finish_reason(), "stop");
}

TEST(ServeChoice, LogprobEntry) {
  k3::GenerationEvent ev;
  ev.id = ids_of("a")[0];
  ev.logprob = -0.5f;
  ev.top = {{ev.id, -0.5f}, {tiny_vocab().markers.sep, -2.0f}};
  const Json e = k3::serve::chat_logprob_entry(tiny_vocab(), ev);
  EXPECT_EQ(e["token"], "a");
  EXPECT_FLOAT_EQ(e["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(e["bytes"], Json::array({int('a')}));
  ASSERT_EQ(e["top_logprobs"].size(), 2u);
  EXPECT_EQ(e["top_logprobs"][1]["token"], "<|sep|>");
}

TEST(ServeResponse, Shapes) {
  const k3::serve::ResponseHead h{"chatcmpl-1", 123, "tiny"};
  k3::chat::ParsedOutput out;
  out.content = "hi";
  out.reasoning = "r";
  out.finish_reason = "stop";
  const Json c = k3::serve::chat_completion_json(h, {k3::serve::chat_choice_json(0, out, nullptr)},
                                                 k3::serve::usage_json(10, 5, 4));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(c["choices"][0]["message"]["reasoning_content"], "r");
  EXPECT_FALSE(c["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(c["usage"]["total_tokens"], 15);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  const Json u = k3::serve::chat_usage_chunk_json(h, k3::serve::usage_json(1, 2, 0));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["object"], "chat.completion.chunk");
  const Json first = k3::serve::chat_chunk_json(h, 0, k3::serve::role_delta_json());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(k3::serve::models_json("tiny", 1, 4096)["data"][0]["id"], "tiny");
}
