// Image content parts in chat requests (io/chat_json.h, io/chat_render.h): OpenAI's
// {"type":"image_url","image_url":{"url":...}} (or the url as a bare string) parsed with its
// place among the text parts and its field; rendered as one <|media_pad|> control segment in
// place (never text: a user who types "<|media_pad|>" gets text).
#include <gtest/gtest.h>

#include "io/chat_json.h"
#include "io/chat_render.h"

using namespace k3;
using namespace k3::chat;

TEST(ChatImages, PartsKeepTheirPlaceAndRenderAsThePlaceholder) {
  const Conversation c = parse_request_text(R"({"messages": [
      {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": "data:image/png;base64,BBBB"},
        {"type": "text", "text": " and <|media_pad|> this?"}]}]})");
  ASSERT_EQ(c.messages.size(), 1u);
  const Message& m = c.messages[0];
  ASSERT_EQ(m.images.size(), 2u);
  EXPECT_EQ(m.images[0].before, 0u);
  EXPECT_EQ(m.images[0].url, "data:image/png;base64,AAAA");
  EXPECT_EQ(m.images[0].field, "messages[0].content[0].image_url.url");
  EXPECT_EQ(m.images[1].before, 1u);
  EXPECT_EQ(m.images[1].field, "messages[0].content[2].image_url");
  const std::vector<chat::Segment> segs = render(c);
  std::vector<size_t> pads;
  for (size_t i = 0; i < segs.size(); ++i)
    if (segs[i].text == kMediaPad) {
      EXPECT_TRUE(segs[i].is_control) << "segment " << i;
      pads.push_back(i);
    }
  ASSERT_EQ(pads.size(), 2u);  // the typed "<|media_pad|>" is inside a text segment
  EXPECT_EQ(segs[pads[0] + 1].text, "what is this?");
  EXPECT_EQ(segs[pads[1] + 1].text, " and <|media_pad|> this?");
  EXPECT_FALSE(segs[pads[1] + 1].is_control);
  // An image after the last text part renders last.
  const Conversation tail = parse_request_text(R"({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "q"}, {"type": "image_url", "image_url": {"url": "u"}}]}]})");
  const std::vector<chat::Segment> ts = render(tail);
  size_t q = 0;
  while (q < ts.size() && ts[q].text != "q") ++q;
  ASSERT_LT(q + 1, ts.size());
  EXPECT_EQ(ts[q + 1].text, kMediaPad);
  EXPECT_TRUE(ts[q + 1].is_control);
}

