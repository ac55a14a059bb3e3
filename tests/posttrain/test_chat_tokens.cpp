// SFT sequences from XTML conversations (posttrain/chat_tokens.h): exactly the assistant's
// output is trained; the effort and tool declarations, the user turn, the generation prompt and
// tool results are masked. Vocabulary: tests/data/k3-release-tiny (K3's special layout).
#include <gtest/gtest.h>

#include "common/fixture.h"
#include "common/tiny_vocab.h"
#include "core/error.h"
#include "io/chat_json.h"
#include "io/chat_render.h"
#include "model/checkpoint.h"
#include "posttrain/arith_task.h"
#include "posttrain/chat_tokens.h"

using namespace k3;

namespace {

using k3::test::tiny_vocab;

// Decoded text of the ids whose loss flag equals `flag`, as runs joined by '|'.
std::string runs(const ChatSequence& q, uint8_t flag) {
  std::string out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    if (!out.empty()) out += '|';
    out += tiny_vocab().tok.decode(run);
    run.clear();
  };
  for (size_t i = 0; i < q.ids.size(); ++i) {
    if (q.loss[i] == flag) run.push_back(q.ids[i]);
    else flush();
  }
  flush();
  return out;
}

}  // namespace

TEST(ChatTokens, OnlyTheAssistantOutputIsTrained) {
  const ArithProblem p{47, 85, '+', 2};
  const ChatSequence q = tokenize_conversation(sft_conversation(p, chat::Effort::high, false), tiny_vocab(), "test");
  ASSERT_EQ(q.ids.size(), q.loss.size());
  // One trained run: the reply after the generation prompt, through <|end_of_msg|>.
  EXPECT_EQ(runs(q, 1), worked_trace(p, chat::Effort::high) +
                            "<|close|>think<|sep|><|open|>response<|sep|>132<|close|>response<|sep|>"
                            "<|close|>message<|sep|><|end_of_msg|>");
  // The prompt (effort note, user turn, generation prompt) is masked and ends with the prompt.
  const std::string masked = runs(q, 0);
  EXPECT_NE(masked.find("thinking-effort"), std::string::npos);
  EXPECT_NE(masked.find("What is 47+85?"), std::string::npos);
  const std::string gen_prompt = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
  ASSERT_GE(masked.size(), gen_prompt.size());
  EXPECT_EQ(masked.substr(masked.size() - gen_prompt.size()), gen_prompt);
  // The sequence is the full rendering, token for token.
  chat::Conversation c = sft_conversation(p, chat::Effort::high, false);
  EXPECT_EQ(q.ids, tiny_vocab().encode(chat::render(c)));
}

TEST(ChatTokens, ToolResultsAreMasked) {
  const ArithProblem p{47, 85, '*', 2};
  const ChatSequence q = tokenize_conversation(sft_conversation(p, chat::Effort::low, true), tiny_vocab(), "test");
  const std::string trained = runs(q, 1), masked = runs(q, 0);
  // Two trained runs: the call, then the answer; the tool message between them is masked.
  ASSERT_NE(trained.find('|'), std::string::npos);
  EXPECT_NE(trained.find("<|open|>call tool=\"calculator\""), std::string::npos);
  EXPECT_NE(trained.find("47*85"), std::string::npos);
  EXPECT_NE(trained.find("3995<|close|>response"), std::string::npos);
  EXPECT_NE(masked.find("role=\"tool\" tool=\"calculator\""), std::string::npos);
  EXPECT_NE(masked.find("3995<|close|>message"), std::string::npos);  // the tool's result text
  EXPECT_EQ(trained.find("role=\"tool\""), std::string::npos);
  EXPECT_NE(masked.find("# Tools"), std::string::npos);  // the tool declaration
}

TEST(ChatTokens, RefusesConversationsWithoutAssistant) {
  chat::Conversation c = prompt_conversation(ArithProblem{1, 2, '+', 1}, chat::Effort::low, false);
  EXPECT_THROW(tokenize_conversation(c, tiny_vocab(), "test"), Error);
}

TEST(ChatTokens, RefusesImageParts) {
  // Post-training has no encoder: an image part is refused, naming it, not rendered as a bare pad.
  const chat::Conversation c = chat::parse_request_text(R"({"messages": [
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "q"}]},
      {"role": "assistant", "content": "a"}]})");
  try {
    tokenize_conversation(c, tiny_vocab(), "sft.jsonl:3");
    FAIL() << "an image part was tokenized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sft.jsonl:3: messages[0].content[0].image_url.url: image parts are not supported"),
              std::string::npos)
        << e.what();
  }
}
