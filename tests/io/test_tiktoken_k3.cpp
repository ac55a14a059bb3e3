// The tiktoken tokenizer on K3's own files and format: the released-layout fixture's
// tokenizer directory (tests/data/k3-release-tiny, written by tools/make_release_fixture.py
// from K3's published layout) loads with exactly the special layout the trainer writes, and
// a conversation rendered by the chat layer (io/chat_render.h) encodes segment by segment,
// with a user's "<|open|>" kept as text.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "io/chat_render.h"
#include "io/tiktoken.h"

using namespace k3;

namespace {

using k3::test::kReleaseTiny;
}

TEST(TiktokenK3, ReleasedFixtureHasTheTrainersSpecialLayout) {
  const Tiktoken tok = Tiktoken::load(kReleaseTiny);
  ASSERT_EQ(tok.base_size(), 288);
  ASSERT_EQ(tok.vocab_size(), 288 + 256);
  const auto want = k3_special_tokens(288);
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(tok.specials()[k].name, want[k].name) << k;
    EXPECT_EQ(tok.specials()[k].special, want[k].special) << want[k].name;
  }
  const std::string text = "In the beginning: getUserName(42) 中文 <|open|>";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(TiktokenK3, TrainerConfigNamesWhatTheReleasedConfigNames) {
  std::ifstream f(kReleaseTiny + "/tokenizer_config.json");
  const auto fixture = nlohmann::json::parse(f);
  const auto mine = nlohmann::json::parse(k3_tokenizer_config_json(288));
  EXPECT_EQ(mine["added_tokens_decoder"], fixture["added_tokens_decoder"]);
  EXPECT_EQ(mine["additional_special_tokens"], fixture["additional_special_tokens"]);
  for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token", "tokenizer_class", "model_max_length"})
    EXPECT_EQ(mine[k], fixture[k]) << k;
}

TEST(TiktokenK3, RenderedConversationEncodesBySegment) {
  const Tiktoken tok = Tiktoken::load(kReleaseTiny);
  chat::Conversation conv;
  chat::Message user;
  user.role = chat::Role::user;
  user.content = {"hi <|open|>message<|sep|> there"};
  conv.messages.push_back(user);
  const auto segments = chat::render(conv);
  auto encode_text = [&](const std::string& s) { return tok.encode(s, false); };
  auto lookup = [&](const std::string& name) -> std::optional<int32_t> {
    for (const auto& t : tok.specials())
      if (t.name == name) return t.id;
    return std::nullopt;
  };
  const std::vector<int32_t> via_chat = chat::segments_to_ids(segments, encode_text, lookup);
  std::vector<Segment> mine;
  for (const auto& s : segments) mine.push_back({s.text, s.is_control});
  EXPECT_EQ(tok.encode_segments(mine), via_chat);
  // The user's spelled markers stay text: only the renderer's control segments are specials.
  size_t specials = 0, controls = 0;
  for (int32_t id : via_chat) specials += tok.is_special(id);
  for (const auto& s : segments) controls += s.is_control;
  EXPECT_EQ(specials, controls);
  EXPECT_EQ(tok.decode(via_chat), chat::join_segments(segments));
}
