// serve/sse.h: OpenAI's SSE framing and the client-side parser the tests read streams with.
//  - sse_event is exactly "data: " + compact JSON + "\n\n"; sse_done "data: [DONE]\n\n";
//  - the parser returns the same events over every chunking (byte by byte included), joins
//    multi-line data with '\n', ignores comments and other fields, takes CRLF and LF;
//  - an event is dispatched only on its blank line (a half-read one stays pending).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/sse.h"

using k3::serve::Json;
using k3::serve::SseParser;

TEST(Sse, FramingIsOpenAIs) {
  EXPECT_EQ(k3::serve::sse_event(Json{{"a", 1}, {"b", "x y"}}), "data: {\"a\":1,\"b\":\"x y\"}\n\n");
  EXPECT_EQ(k3::serve::sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(k3::serve::sse_comment("ping"), ": ping\n\n");
  // invalid UTF-8 never makes the JSON throw: it becomes U+FFFD
  EXPECT_EQ(k3::serve::sse_event(Json{{"t", std::string("a\xff")}}), "data: {\"t\":\"a\xef\xbf\xbd\"}\n\n");
}

TEST(Sse, ParserReadsEveryChunking) {
  const std::string stream = k3::serve::sse_event(Json{{"n", 1}}) + ": keep-alive\n\n" +
                             "event: x\r\ndata: line1\r\ndata:line2\r\n\r\n" + k3::serve::sse_event(Json{{"n", "é"}}) +
                             k3::serve::sse_done();
  const std::vector<std::string> want = {"{\"n\":1}", "line1\nline2", "{\"n\":\"é\"}", "[DONE]"};
  for (size_t step = 1; step <= stream.size(); ++step) {
    SseParser p;
    std::vector<std::string> got;
    for (size_t at = 0; at < stream.size(); at += step)
      for (auto& e : p.feed(std::string_view(stream).substr(at, step))) got.push_back(e);
    EXPECT_EQ(got, want) << "chunk size " << step;
    EXPECT_TRUE(p.idle());
  }
}

TEST(Sse, EventWaitsForItsBlankLine) {
  SseParser p;
  EXPECT_TRUE(p.feed("data: {\"a\":1}\n").empty());
  EXPECT_FALSE(p.idle());
  const auto e = p.feed("\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "{\"a\":1}");
}
