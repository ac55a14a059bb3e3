// JSON constrained decoding inside the K3 chat format. After the generation prompt the model
// writes (thinking on)
//   REASONING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>
// or, when the generation prompt already opened response (thinking off), starts at CONTENT.
// ChatJsonConstraint lets REASONING be free text (any id with bytes, plus the close id) for at
// most max_reasoning_tokens tokens, then forces the close; forces the rest of the transition;
// constrains CONTENT by a JsonConstraint whose only terminal is the suffix's first id; then
// forces the rest of the suffix. So with max_tokens >= max_reasoning_tokens + 1 + transition +
// (the JSON) + suffix the message always ends with a parsable answer. It knows ids only, not
// the tokenizer: k3_chat_json_ids gives the K3 ones.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "infer/json_constraint.h"
#include "io/tiktoken.h"

namespace k3 {

class ChatJsonConstraint : public LogitConstraint {
 public:
  // reasoning: start in the free phase, ended by `close_id` (forced after max_reasoning_tokens
  // free tokens) and followed by `transition`. `json`'s terminals must be {suffix.front()}.
  ChatJsonConstraint(bool reasoning, int32_t close_id, std::vector<int32_t> transition,
                     std::shared_ptr<JsonConstraint> json, std::vector<int32_t> suffix,
                     int64_t max_reasoning_tokens);

  // Once the suffix is complete, only its last id stays allowed (the caller stops on it).
  void mask(float* logits, int64_t vocab) override;
  // k3::Error for an id the mask excluded.
  void accept(int32_t id) override;

  enum class Phase { reasoning, transition, content, suffix, done };
  Phase phase() const { return phase_; }
  const JsonConstraint& json() const { return *json_; }

 private:
  void force(float* logits, int64_t vocab, int32_t id);
  void after_forced(const std::vector<int32_t>& seq, Phase next);

  int32_t close_id_;
  std::vector<int32_t> transition_, suffix_;
  std::shared_ptr<JsonConstraint> json_;
  int64_t max_reasoning_;
  Phase phase_;
  int64_t reasoning_tokens_ = 0;
  size_t pos_ = 0;  // next index into the forced sequence of this phase
};

// The K3 chat ids: `<|close|>`, the ids of `think<|sep|><|open|>response<|sep|>` and of
// `<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>` (channel names encoded as
// their own text segments, as the renderer does).
struct K3ChatJsonIds {
  int32_t close = -1;
  std::vector<int32_t> transition, suffix;
};
K3ChatJsonIds k3_chat_json_ids(const Tiktoken& tok);
// Each id's bytes, "" for the special ids: the JsonVocab of a Tiktoken.
std::vector<std::string> token_byte_table(const Tiktoken& tok);

}  // namespace k3
